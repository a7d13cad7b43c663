"""``python -m sageattention``: build info, environment and a verdict.

Exit status 0 when this build can run here (or there is no GPU to check against), 1 when
it cannot (torch/CUDA mismatch, a kernel family of the wheel that does not load, a GPU its
targets cannot serve, a bad SAGEATTENTION_* variable), so scripts can use it as a check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Sequence

from . import build_info, guard


def _environment() -> dict:
    env = {"python": platform.python_version(), "python_tag": guard._python_tag(),
           "platform": platform.platform(), "torch": None, "torch_cuda": None, "gpus": []}
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - ImportError, or an OSError from a CUDA library
        env["torch_error"] = f"{type(exc).__name__}: {exc}"
        return env
    env["torch"], env["torch_cuda"] = str(torch.__version__), torch.version.cuda
    try:
        if torch.version.cuda and torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                major, minor = torch.cuda.get_device_capability(i)
                env["gpus"].append({"index": i, "name": torch.cuda.get_device_name(i),
                                    "capability": f"{major}.{minor}"})
    except Exception as exc:  # noqa: BLE001 - a driver too old for this torch's CUDA, say
        env["gpu_error"] = f"{type(exc).__name__}: {exc}"
    return env


def shadowed_installs() -> list[str]:
    """Installed sageattention distributions whose package is not the one imported: from inside a
    source checkout the checkout's package shadows an installed wheel, which then goes unchecked."""
    import importlib.metadata as metadata

    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    found = []
    for dist in metadata.distributions(name="sageattention"):
        try:
            init = os.path.realpath(str(dist.locate_file("sageattention/__init__.py")))
        except Exception:  # noqa: BLE001 - odd metadata must not break the diagnostics
            continue
        where = os.path.dirname(init)
        text = f"sageattention {dist.version} at {where}"
        if where != here and os.path.isfile(init) and text not in found:
            found.append(text)
    return found


def _native_status(info: dict | None, env: dict) -> dict | None:
    """Each of the wheel's kernel families -> None (its extension loads) or why not; None where
    loading is not tried: a source checkout, no torch, or a torch the build does not match
    (loading a mismatched extension can do worse than raise)."""
    if info is None or env["torch"] is None:
        return None
    if guard.import_problem(info, env["torch"], env["torch_cuda"]) is not None:
        return None
    from . import native

    status = native.available_families()
    return {family: status.get(family, "not a known kernel family")
            for family in info.get("families") or []}


def dispatch_summary(capability: tuple[int, int], gpu_name: str | None = None) -> str:
    """How plain sageattn picks backends on a GPU of this capability and name: the backend
    SAGEATTENTION_BACKEND forces, else calibration table (that GPU model's, else the
    capability's) or order."""
    from . import backends, dispatch
    try:
        forced = dispatch.forced_backend(os.environ)   # given: read without keeping it for traced code
        table = dispatch.calibration_for(capability, gpu_name=gpu_name)
    except ValueError as exc:  # a bad SAGEATTENTION_BACKEND / SAGEATTENTION_CALIBRATION value
        return f"error: {exc}"
    if forced is not None:  # it wins over the table and the order (docs/api.md)
        return (f"{forced!r} for every call, forced by {dispatch.ENV_VAR}: no calibration table, no "
                "fallback (a call it cannot run raises BackendUnavailableError)")
    if table is not None:
        # a table of another GPU model already says so in its label (calibration._seen_on)
        on = "" if table.label.endswith(f"(measured on {table.gpu_name})") else f" measured on {table.gpu_name}"
        return (f"fastest measured backend per shape, SDPA included, from calibration table "
                f"{table.label} ({len(table.entries)} entries{on}, "
                f"{table.date[:10]}); SAGEATTENTION_CALIBRATION=off for the static order")
    order = ", ".join(backends.preference_order(capability))
    return f"first usable in the static order {order} (no calibration table for this GPU)"


def _forced_name() -> str | None:
    """The backend SAGEATTENTION_BACKEND forces, or None (unset, or not a backend name, which
    dispatch.environment_problems reports)."""
    from . import dispatch
    try:
        return dispatch.forced_backend(os.environ)
    except ValueError:
        return None


def forced_backend_problems(info: dict | None, env: dict) -> list[str]:
    """Why the backend SAGEATTENTION_BACKEND forces cannot run here: forcing never falls back, so
    each of these makes every sageattn call (on that GPU) raise BackendUnavailableError."""
    from . import backends, dispatch

    forced = _forced_name()
    if forced is None or forced == backends.SDPA:
        return []
    b = backends.backend(forced)
    head = f"{dispatch.ENV_VAR}={forced!r} forces a backend that"
    tail = ("; forcing never falls back, so sageattn raises BackendUnavailableError there (unset "
            f"{dispatch.ENV_VAR}, or set it to a backend that runs here, or to 'sdpa')")
    if env.get("gpu_error") or not env.get("gpus"):
        return [f"{head} needs a CUDA GPU, and none is visible: every sageattn call raises "
                f"BackendUnavailableError (unset {dispatch.ENV_VAR}, or set it to 'sdpa')"]
    problems = []
    if b.kind == "native":
        families = (info or {}).get("families")
        why = (env.get("native") or {}).get(b.family)
        if info is not None and families is not None and b.family not in families:
            problems.append(f"{head} needs the {b.family} kernel family, which this build does not "
                            f"carry (families: {', '.join(families) or 'none'}){tail}")
        elif why is not None:
            problems.append(f"{head} needs the {b.family} kernel family, which does not load "
                            f"({why}){tail}")
    elif b.kind == "triton":
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            problems.append(f"{head} needs Triton, which is not installed{tail}")
    unserved = [gpu for gpu in env["gpus"]
                if not b.serves(tuple(int(x) for x in gpu["capability"].split(".")))]
    if unserved:
        where = ", ".join(f"cuda:{g['index']} {g['name']} (sm{g['capability'].replace('.', '')})"
                          for g in unserved)
        problems.append(f"{head} does not run on {where}{tail}")
    return problems


def verdict(info: dict | None, env: dict) -> tuple[bool, list[str]]:
    """(ok, sentences)."""
    if env["torch"] is None:   # nothing imports without torch, a source checkout included
        return False, [f"torch is not importable: {env.get('torch_error')}"]
    if info is None:
        lines = ["source checkout (no build info): native kernels, if any, were built "
                 "in place; nothing to check"]
        for other in env.get("shadowed") or []:
            lines.append(f"note: this source tree ({env.get('package_path')}) shadows the installed "
                         f"{other}, which was not checked: run python -m sageattention from "
                         "another directory (outside the checkout, without it on PYTHONPATH)")
        return True, lines
    lines, ok = [], True
    problem = guard.import_problem(info, env["torch"], env["torch_cuda"])
    if problem:
        ok = False
        lines.append("MISMATCH: " + problem)
        lines.append("import sageattention raises IncompatibleBuildError here (only this "
                     "command imports past it)")
    else:
        lines.append(f"torch {env['torch']} (CUDA {env['torch_cuda']}) matches this build")
        caveat = guard.import_caveat(info, env["torch"])
        if caveat:
            lines.append("note: " + caveat)
    for family, reason in (env.get("native") or {}).items():
        if reason is None:
            lines.append(f"native family {family}: loads")
        else:  # a family the wheel carries cannot load: its backends fall back
            ok = False
            lines.append(f"BROKEN: native family {family} does not load: {reason}")
    forced = _forced_name()
    cpu = ("sageattn runs PyTorch SDPA on CPU tensors" if forced in (None, "sdpa") else
           f"sageattn raises on CPU tensors ({forced!r} is forced)")
    if env.get("gpu_error"):
        lines.append(f"CUDA GPUs could not be queried ({env['gpu_error']}): GPU check skipped; {cpu}")
    elif not env["gpus"]:
        lines.append(f"no CUDA GPU visible: GPU check skipped; {cpu}")
    for gpu in env["gpus"]:
        cap = tuple(int(x) for x in gpu["capability"].split("."))
        how = guard.served_by(info, cap)
        if how:
            lines.append(f"cuda:{gpu['index']} {gpu['name']} (sm{cap[0]}{cap[1]}): runs "
                         f"this build's {how}")
            lines.append(f"cuda:{gpu['index']} sageattn dispatch: {dispatch_summary(cap, gpu['name'])}")
        else:
            ok = False
            lines.append("MISMATCH: " + guard.device_problem(
                info, cap, f"{gpu['name']} (cuda:{gpu['index']})"))
    return ok, lines


def _shape(text: str) -> tuple[int, int, int, int]:
    """argparse type of --explain: 'BxHxNxD', e.g. 4x32x4096x128."""
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"not a shape: {text!r}; write batch x heads x tokens x head dim, e.g. 4x32x4096x128")
    return tuple(int(p) for p in parts)


def explain_shapes(shapes, *, dtype: str, causal: bool, kv_len: int | None,
                   kv_heads: int | None) -> list[str]:
    """One line per shape: which backend plain sageattn(q, k, v) picks on this machine's first
    GPU (else the CPU) for HND inputs of that shape, and why (sageattention.explain). The inputs
    are allocated, never read."""
    import torch

    from . import explain
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    lines = []
    for b, h, n, d in shapes:
        hk, nk = kv_heads or h, kv_len if kv_len is not None else n
        head = (f"{b}x{h}x{n}x{d}" + (f" (keys {b}x{hk}x{nk}x{d})" if (hk, nk) != (h, n) else "")
                + f" {dtype}{' causal' if causal else ''} on {device}")
        try:
            q = torch.empty((b, h, n, d), dtype=torch_dtype, device=device)
            k, v = (torch.empty((b, hk, nk, d), dtype=torch_dtype, device=device) for _ in range(2))
        except (RuntimeError, OverflowError, TypeError) as exc:   # out of memory, a size past int64
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            lines.append(f"{head}: not asked: its inputs cannot be allocated on {device} "
                         f"({type(exc).__name__}: {first})")
            continue
        try:
            said = explain(q, k, v, tensor_layout="HND", is_causal=causal)
        except (ValueError, TypeError) as exc:   # e.g. query heads not a multiple of key heads
            said = f"refused: {exc}"
        lines.append(f"{head}: {said}")
        del q, k, v
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sageattention",
        description="Print this sageattention build's info, the environment, and whether "
                    "the build can run here (exit 1 if not). With --explain, say instead which "
                    "backend sageattn would run for each shape on this machine, and why.",
        epilog="example: python -m sageattention --explain 1x32x16384x128 --explain 8x32x1024x64 "
               "--dtype bf16 --causal")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--explain", metavar="BxHxNxD", type=_shape, action="append",
                        help="a q shape (HND: batch x heads x tokens x head dim); repeatable")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16",
                        help="with --explain: the inputs' dtype (default fp16)")
    parser.add_argument("--causal", action="store_true", help="with --explain: is_causal=True")
    parser.add_argument("--kv-len", type=int, metavar="N",
                        help="with --explain: keys per sequence (default: the query's tokens)")
    parser.add_argument("--kv-heads", type=int, metavar="H",
                        help="with --explain: key/value heads, for GQA/MQA (default: the query's)")
    args = parser.parse_args(argv)
    if not args.explain:
        unused = [flag for flag, given in (("--dtype", args.dtype != "fp16"), ("--causal", args.causal),
                                           ("--kv-len", args.kv_len is not None),
                                           ("--kv-heads", args.kv_heads is not None)) if given]
        if unused:
            parser.error(f"{', '.join(unused)}: these options describe --explain's inputs; give "
                         "--explain BxHxNxD with them")
    else:
        if args.json:
            parser.error("--explain prints sentences; it takes no --json")
        if args.kv_len is not None and args.kv_len < 0:
            parser.error(f"--kv-len must be >= 0, got {args.kv_len}")
        if args.kv_heads is not None and args.kv_heads < 1:
            parser.error(f"--kv-heads must be >= 1, got {args.kv_heads}")
        try:
            import sageattention  # noqa: F401  (IncompatibleBuildError where the build does not fit)
        except Exception as exc:  # noqa: BLE001 - the plain command names the mismatch
            print(f"error: sageattention does not import here ({type(exc).__name__}: {exc}); run "
                  "python -m sageattention for the build's verdict", file=sys.stderr)
            return 1
        print("\n".join(explain_shapes(args.explain, dtype=args.dtype, causal=args.causal,
                                       kv_len=args.kv_len, kv_heads=args.kv_heads)))
        return 0
    info = build_info.load()
    env = _environment()
    env["native"] = _native_status(info, env)
    env["package_path"] = os.path.dirname(os.path.abspath(__file__))
    env["shadowed"] = shadowed_installs() if info is None else []
    ok, lines = verdict(info, env)
    if env["torch"] is not None:
        from . import dispatch

        # a bad SAGEATTENTION_BACKEND / SAGEATTENTION_CALIBRATION makes every sageattn call raise
        for problem in dispatch.environment_problems() + forced_backend_problems(info, env):
            ok = False
            lines.append("MISCONFIGURED: " + problem)
    if args.json:
        print(json.dumps({"build_info": info, "environment": env, "ok": ok,
                          "verdict": lines}, indent=2))
        return 0 if ok else 1
    print(f"sageattention {build_info.package_version()}")
    print("build info:" if info else "build info: none (source checkout)")
    for key in ("local_label", "sm_targets", "families", "ptx", "torch", "cuda", "python_tag",
                "platform", "compilers", "git_commit", "build_date", "cell_id"):
        if info and key in info:
            print(f"  {key:12s} {info[key]}")
    print("environment:")
    for key in ("python", "platform", "torch", "torch_cuda"):
        print(f"  {key:12s} {env.get(key)}")
    for gpu in env["gpus"]:
        print(f"  gpu          cuda:{gpu['index']} {gpu['name']} (compute {gpu['capability']})")
    if not env["gpus"]:
        print("  gpu          none visible to torch")
    print("verdict: " + ("OK" if ok else "NOT USABLE HERE"))
    for line in lines:
        print(f"  {line}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
