"""``python -m sageattention.validation``: run the GPU validation suite and write its result."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile


def build_parser() -> argparse.ArgumentParser:
    from ..benchmark import ListOption, output_file_arg
    from .catalog import CHECKS

    ids = "\n".join(f"  {c.slug:<22} {c.name}" for c in CHECKS)
    p = argparse.ArgumentParser(
        prog="python -m sageattention.validation",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the GPU validation suite against the installed sageattention: every\n"
                    "check records pass, fail or skip (with its reason), its error figures against\n"
                    "fp32 SDPA and the backends that actually ran; then the benchmark cases against\n"
                    "SDPA. Checks of native kernels run once per native backend of this build on\n"
                    "this GPU, forced; a call that ends on another backend (the SDPA fallback, a\n"
                    "Triton kernel) fails the check. Bars: INT8 QK + FP16 PV cosine >= 0.9998 and\n"
                    "relative L1 <= 0.02; INT8 QK + FP8 PV cosine >= 0.9993 and relative L1 <= 0.04;\n"
                    "any NaN/Inf output fails, and so does a NaN/Inf fp32 reference.\n\n"
                    "Exit status: 0 no check failed (some may have been skipped: the summary line\n"
                    "counts them), 1 a check failed, 2 refused (no GPU, no kernel for this GPU, build\n"
                    "info whose sm_targets cannot be read, bad arguments, SAGEATTENTION_BACKEND set,\n"
                    "a bad SAGEATTENTION_CALIBRATION).",
        epilog="check ids:\n" + ids)
    p.add_argument("--json", metavar="PATH", type=output_file_arg,
                   help="write the result document here (strict JSON: a NaN/Inf figure is null; "
                        "its accuracy section counts each backend's NaN/Inf outputs as "
                        "non_finite; written whole at the end, also when a check failed)")
    p.add_argument("--quick", action="store_true",
                   help="every check still runs (500 stress calls included), with fewer "
                        "boundary lengths and stream repeats and torch.compile traced with "
                        "aot_eager instead of Inductor; the benchmark times fp16 cases only")
    p.add_argument("--only", nargs="+", action=ListOption, metavar="ID",
                   help="run only these checks (ids below; repeatable)")
    p.add_argument("--skip", nargs="+", action=ListOption, metavar="ID",
                   help="leave these checks out (ids below; repeatable)")
    p.add_argument("--no-performance", action="store_true",
                   help="leave out the benchmark (the report's performance section is null)")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    return p


def _line(rec: dict) -> str:
    err = rec.get("errors") or {}
    figs = (f" cos {err['cosine']:.6f} relL1 {err['rel_l1']:.4f}" if err.get("finite")
            and err.get("cosine") is not None and err.get("rel_l1") is not None else
            " NaN/Inf" if err and not err.get("finite") else "")
    why = f"  -- {rec['reason']}" if rec.get("reason") else ""
    return (f"{rec['status'].upper():<4}  {rec['name']:<46} [{rec.get('backend') or '-'}]"
            f"{figs} ({rec['duration_s']:.1f}s){why}")


def jsonsafe(obj):
    """Strict JSON: NaN and infinities (never valid JSON) become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: jsonsafe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonsafe(v) for v in obj]
    return obj


def write_json(path: str, doc: dict) -> None:
    """Atomic: a reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".suite-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(jsonsafe(doc), fh, indent=2, allow_nan=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def environment_refusal() -> str | None:
    """Why SAGEATTENTION_BACKEND / SAGEATTENTION_CALIBRATION as set make the suite's result
    meaningless, or None. A bad value makes every unforced sageattn call raise. A valid forced
    backend replaces sageattn's own choice in every unforced call: the default-dispatch checks
    would blame the dispatcher for it, the mask checks would fail on a native backend that takes
    no mask, and the performance headline would time it instead of what sageattn picks."""
    from .. import dispatch

    problems = dispatch.environment_problems()
    if problems:
        return "; ".join(problems)
    forced = dispatch.forced_backend(dict(os.environ))
    if forced is not None:
        return (f"{dispatch.ENV_VAR}={forced} forces every sageattn call, but the suite checks "
                f"what sageattn picks unforced (and forces each native backend itself): unset "
                f"{dispatch.ENV_VAR} and run it again")
    return None


def main(argv: list[str] | None = None) -> int:
    from ..benchmark import given_options

    parser = build_parser()
    args = parser.parse_args(argv)
    ignored = given_options(parser, args, [d for d in vars(args) if d != "list"]) if args.list else []
    if ignored:
        parser.error(f"--list only lists the checks; {', '.join(ignored)} would be ignored (drop "
                     "them, or drop --list to run the suite)")
    from .catalog import CHECKS
    from .expectation import NoNativeCode
    from .profile import FULL, QUICK
    from .runner import select
    from .suite import NoGpu, run_suite

    if args.list:
        for c in CHECKS:
            print(f"{c.slug:<22} {c.name}")
        return 0
    try:
        checks = select(CHECKS, args.only, args.skip)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    refusal = environment_refusal()
    if refusal:
        print(f"refused: {refusal}", file=sys.stderr)
        return 2
    try:
        doc = run_suite(profile=QUICK if args.quick else FULL, checks=checks,
                        performance=not args.no_performance,
                        argv=["-m", "sageattention.validation", *(sys.argv[1:] if argv is None
                                                                  else argv)],
                        progress=lambda rec: print(_line(rec), flush=True),
                        announce=lambda text: print(text, flush=True))
    except (NoGpu, NoNativeCode) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    s = doc["summary"]
    perf = doc.get("performance") or {}
    print(f"execution: {doc['execution']}; {s['pass']} passed, {s['fail']} failed, "
          f"{s['skip']} skipped")
    if perf.get("geomean_speedup_vs_sdpa"):
        print(f"geometric mean speed-up vs SDPA: {perf['geomean_speedup_vs_sdpa']:.3f}x over "
              f"{len(perf['cases'])} cases")
    elif perf.get("error"):
        print(f"performance section failed: {perf['error']}")
    if args.json:
        write_json(args.json, doc)
        print(f"wrote {args.json}")
    return 0 if s["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
