"""Write the calibration table the dispatcher reads, from real measurements.

    python -m sageattention.calibrate --out sageattention/calibration/sm90.json
    python -m sageattention.calibrate --out sageattention/calibration/sm90.json --benchmark-json bench.json
    python -m sageattention.calibrate --from-benchmark bench.json --out sageattention/calibration/sm90.json
    python -m sageattention.calibrate --out sageattention/calibration/sm90-nvidia-h200.json

On a GPU: times SDPA (torch's default backend, and through sageattn forced to "sdpa") and every known
backend forced, with `sageattention.benchmark.run()` over the calibration grid (`calibration_cases`),
with the calibration switched off while measuring, times the close calls (`close_calls`: shapes
where the dispatcher's choice turns on a few percent) for more rounds, then writes `sm<major><minor>.json`,
the table of every GPU of that capability, or `sm<major><minor>-<model>.json`, that GPU model's own
(format and lookup: `sageattention/calibration/__init__.py`). `--from-benchmark` builds the same table without a GPU from
a stored benchmark JSON: what `--benchmark-json` here or `python -m sageattention.benchmark --json`
wrote, or a validation report (its `performance` and `environment` sections).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import sys
from pathlib import Path

import torch

from . import benchmark, calibration
from .backends import BACKEND_NAMES, SDPA
from .benchmark import Case

PROG = "python -m sageattention.calibrate"
# Besides the 20 standard cases: (batch, seq_len) pairs, 32 heads, for fp16 and bf16, head dims 64
# and 128, causal and not; short sequences at large batch, where fixed costs decide.
EXTRA_SHAPES = ((32, 128), (16, 512), (2, 8192))
# And (batch, seq_len, kv_len), keys other than queries, non-causal only: a decoding step against a
# cache, text cross-attention in a diffusion model, one chunk of a long prompt. Without them the
# nearest entry to such a call is a self-attention shape.
EXTRA_KV_SHAPES = ((8, 1, 8192), (4, 4096, 256), (1, 512, 16384))
EXTRA_HEADS = 32
# And (batch, heads, seq_len), causal and not: few heads at moderate lengths, where a kernel's last
# wave of tiles is part-empty. The grid above pairs few tiles per head with many heads and the
# reverse, so the nearest entry to 2x10x4096x64 was 2x32x8192x64 (the sm90 kernel 1.23x there),
# and sageattn ran that kernel at 0.84x SDPA (benchmarks/results/h100-2026-12-07-offgrid-5b510a1.log).
EXTRA_FEW_HEADS_SHAPES = ((1, 16, 2048), (1, 16, 4096), (1, 16, 8192))
EXTRA_HEAD_DIMS = (64, 128)
DTYPES = ("fp16", "bf16")
# Interleaved timing rounds per shape, medians kept: one round let a single slow SDPA timing decide
# a shape (benchmarks/results/README.md, the 2d29468 calibration: 8.93 against 7.38 ms for the same
# SDPA call at fp16 1x32x16384x128).
DEFAULT_ROUNDS = 2
# A shape whose fastest quantized backend measured within this factor of the dispatcher's threshold
# (dispatch.CALIBRATION_MIN_SPEEDUP), either side, is a close call: it and forced SDPA get
# DEFAULT_REFINE_ROUNDS more interleaved rounds, so that a 2-3% timing wobble does not decide it
# (benchmarks/results/h100-2026-12-06-bench-b5ea897.md: forced cuda-sm90-fp16 1.06-1.09x SDPA at
# three 4096-token shapes the two-round table had measured at 1.01-1.047x and given to SDPA).
REFINE_BAND = 1.07
DEFAULT_REFINE_ROUNDS = 4


class BenchmarkFormatError(ValueError):
    """A benchmark JSON that lacks what a calibration table needs; the message names the field."""


def calibration_cases() -> list[Case]:
    """The calibration grid: the benchmark's 20 standard cases plus EXTRA_SHAPES, EXTRA_KV_SHAPES and
    EXTRA_FEW_HEADS_SHAPES."""
    extra = [Case(dt, b, EXTRA_HEADS, n, d, c) for dt in DTYPES for d in EXTRA_HEAD_DIMS
             for b, n in EXTRA_SHAPES for c in (False, True)]
    extra_kv = [Case(dt, b, EXTRA_HEADS, n, d, False, kv) for dt in DTYPES for d in EXTRA_HEAD_DIMS
                for b, n, kv in EXTRA_KV_SHAPES]
    few_heads = [Case(dt, b, h, n, d, c) for dt in DTYPES for d in EXTRA_HEAD_DIMS
                 for b, h, n in EXTRA_FEW_HEADS_SHAPES for c in (False, True)]
    return benchmark.standard_cases(DTYPES) + extra + extra_kv + few_heads


def close_calls(rows: list[dict], *, threshold: float, band: float = REFINE_BAND) -> list[tuple[int, str]]:
    """(row index, fastest quantized backend) for each benchmark row whose fastest quantized backend
    measured between threshold / band and threshold * band times as fast as forced SDPA: the rows
    where the dispatcher's choice turns on a few percent."""
    found = []
    for i, row in enumerate(rows):
        timed = {name: res["ms"] for name, res in (row.get("backends") or {}).items()
                 if res.get("ms") and res.get("ran") == name}
        sdpa_ms = timed.pop(SDPA, None)
        quantized = {name: ms for name, ms in timed.items() if name in BACKEND_NAMES}
        if sdpa_ms is None or not quantized:
            continue
        best = min(quantized, key=quantized.get)
        if threshold / band <= sdpa_ms / quantized[best] <= threshold * band:
            found.append((i, best))
    return found


def merge_rounds(row: dict, extra: dict, best: str) -> None:
    """Fold a refinement run of one shape (``extra``: a benchmark row with the headline forced to
    ``best`` and forced SDPA among its backends) into ``row``: each re-timed figure becomes the
    median of all its rounds, and the row records what was added under "refined"."""
    def rounds(res: dict, key: str) -> list[float]:
        return res.get(f"{key}_rounds") or ([res[key]] if res.get(key) else [])

    def fold(old_rounds: list[float], new_rounds: list[float]) -> tuple[float, list[float]]:
        times = list(old_rounds) + list(new_rounds)
        return statistics.median(times), times

    case = _case_of(row)
    new_sdpa = rounds(extra, "sdpa_ms")
    row["sdpa_ms"], row["sdpa_ms_rounds"] = fold(rounds(row, "sdpa_ms"), new_sdpa)
    row["sdpa_tops"] = benchmark.tops(case, row["sdpa_ms"])
    forced_sdpa = (extra.get("backends") or {}).get(SDPA) or {}
    added = {}
    # the refinement's headline is sageattn forced to best; forced SDPA is among its backends
    for name, ran, new_rounds in ((best, extra.get("backend"), rounds(extra, "sageattn_ms")),
                                  (SDPA, forced_sdpa.get("ran"), rounds(forced_sdpa, "ms"))):
        if ran != name or not new_rounds:
            continue  # it failed or fell back this time: keep what the grid measured
        res = row["backends"][name]
        res["ms"], res["ms_rounds"] = fold(rounds(res, "ms"), new_rounds)
        res["tops"] = benchmark.tops(case, res["ms"])
        added[name] = len(new_rounds)
    for res in row["backends"].values():
        if res.get("ms"):
            res["speedup_vs_sdpa"] = row["sdpa_ms"] / res["ms"]
    if row.get("sageattn_ms"):
        row["speedup_vs_sdpa"] = row["sdpa_ms"] / row["sageattn_ms"]
    row["refined"] = {"rounds_added": added, "sdpa_baseline_rounds_added": len(new_sdpa)}


def _case_of(row: dict) -> Case:
    return Case(row["dtype"], row["batch"], row["heads"], row["seq_len"], row["head_dim"],
                row["causal"], row.get("kv_len"))


def _significant(ms: float) -> float:
    """Four significant digits: more is noise, and fewer changed digits keep regenerated tables diffable.
    What is not a number (or no float: an integer past its range) is kept as it is, for
    calibration.dumps to refuse by name."""
    if not isinstance(ms, (int, float)) or isinstance(ms, bool):
        return ms
    try:
        return float(f"{ms:.4g}")
    except OverflowError:
        return ms


def _capability(text, where: str) -> list[int]:
    if isinstance(text, (list, tuple)) and len(text) == 2:
        text = ".".join(map(str, text))
    match = re.fullmatch(r"(\d+)\.(\d+)", str(text))
    if not match:
        raise BenchmarkFormatError(f"{where}: compute_capability must look like '9.0', got {text!r}")
    return [int(match[1]), int(match[2])]


def table_from_benchmark(doc: dict, *, argv: list[str], source: str = "benchmark JSON",
                         per_model: bool = False) -> dict:
    """The calibration table (a dict for `calibration.dumps`) from a benchmark document.

    Per case: "sdpa" is sageattn forced to SDPA when it was timed (same call overhead as the other
    backends), else torch's SDPA; each other backend is its forced timing, or the headline figure
    when the run forced the headline to it. A backend that failed or fell back has no time there;
    a case without an SDPA time is refused (BenchmarkFormatError); a time of 0 is kept, for
    calibration.dumps to refuse by name.
    argv: the calibrate command's arguments, quoted in the `_generated` line; per_model: the table is
    the measured GPU model's own (its `_generated` line names that file)."""
    if not isinstance(doc, dict):
        raise BenchmarkFormatError(f"{source}: must be a JSON object")
    perf = doc["performance"] if isinstance(doc.get("performance"), dict) else doc
    env = doc.get("environment")
    if not isinstance(env, dict):
        raise BenchmarkFormatError(
            f"{source}: no 'environment' (GPU, capability, torch, Triton, date, command); write the "
            f"benchmark with this version: `python -m sageattention.benchmark --json FILE` or `{PROG} "
            "--benchmark-json FILE`")
    for key in ("compute_capability", "gpu_name", "torch", "date", "command"):
        if not env.get(key):
            raise BenchmarkFormatError(f"{source}: environment.{key} is missing or empty")
    for key in ("gpu_name", "torch", "date", "command"):
        if not isinstance(env[key], str) or not env[key].strip():
            raise BenchmarkFormatError(f"{source}: environment.{key} must be a non-empty string, "
                                       f"got {env[key]!r:.60}")
    if per_model:
        try:
            calibration.model_slug(env["gpu_name"])
        except ValueError as exc:
            raise BenchmarkFormatError(f"{source}: environment.gpu_name: {exc}; write the "
                                       "capability's table (sm<major><minor>.json) instead") from exc
    rows = perf.get("cases")
    if not isinstance(rows, list) or not rows:
        raise BenchmarkFormatError(f"{source}: no benchmark 'cases'")
    if not perf.get("method"):
        raise BenchmarkFormatError(f"{source}: 'method' (how the timings were taken) is missing")
    headline = perf.get("primary_backend")
    entries = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BenchmarkFormatError(f"{source}: cases[{i}] must be an object, got {row!r:.60}")
        try:
            shape = {k: row[k] for k in calibration.ENTRY_SHAPE_KEYS}
        except (KeyError, TypeError) as exc:
            raise BenchmarkFormatError(f"{source}: cases[{i}] lacks {exc}") from exc
        if row.get("kv_len") is not None:   # calibration.dumps writes it only where it differs
            shape["kv_len"] = row["kv_len"]
        timed = row.get("backends") or {}
        if not isinstance(timed, dict) or not all(isinstance(r, dict) for r in timed.values()):
            raise BenchmarkFormatError(f"{source}: cases[{i}].backends must map backend names to "
                                       f"objects such as {{\"ran\": \"sdpa\", \"ms\": 1.0}}")
        # a time that is there is kept, 0 included, for calibration.dumps to refuse by name: read as
        # "not measured", a 0 dropped SDPA from the entry and sent the shape to a quantized backend
        ms = {name: res["ms"] for name, res in timed.items()
              if name in BACKEND_NAMES and res.get("ms") is not None and res.get("ran") == name}
        if SDPA not in ms and row.get("sdpa_ms") is not None:
            ms[SDPA] = row["sdpa_ms"]
        if headline in BACKEND_NAMES and headline not in ms and row.get("backend") == headline \
                and row.get("sageattn_ms") is not None:
            ms[headline] = row["sageattn_ms"]
        if SDPA not in ms:   # the benchmark times SDPA at every case; without it nothing is compared
            raise BenchmarkFormatError(f"{source}: cases[{i}] ({row.get('name') or 'unnamed'}) has no "
                                       "SDPA time (sdpa_ms, or backends.sdpa with \"ran\": \"sdpa\"); "
                                       "without it the table would send the shape to a quantized "
                                       "backend unmeasured against SDPA")
        entries.append({**shape, "ms": {name: _significant(t) for name, t in ms.items()}})
    if not any(set(e["ms"]) - {SDPA} for e in entries):
        # such a table sends every call to SDPA as "faster", though nothing else was measured
        raise BenchmarkFormatError(f"{source}: no case timed a quantized backend (only SDPA), so "
                                   "the table could not choose between backends; measure with "
                                   "every backend (python -m sageattention.benchmark without "
                                   "--also, or calibrate on the GPU)")
    capability = _capability(env["compute_capability"], f"{source}: environment")
    model = env["gpu_name"] if per_model else None
    return {"_generated": generated_line(argv, capability, model), "schema_version": calibration.SCHEMA_VERSION,
            "capability": capability,
            "gpu_name": env["gpu_name"], "torch": env["torch"], "triton": env.get("triton"),
            "date": env["date"], "command": env["command"], "method": perf["method"], "entries": entries}


def generated_line(argv: list[str], capability: list[int], gpu_name: str | None = None) -> str:
    target = f"sageattention/calibration/{calibration.file_name(capability, gpu_name)}"
    gpu = f"that GPU model ({gpu_name})" if gpu_name else f"a GPU of compute capability {capability[0]}.{capability[1]}"
    return (f"Generated by `{PROG} {shlex.join(argv)}` from the measurements that `command` took "
            f"(method: see `method`); do not edit. To measure again on {gpu}: `{PROG} --out {target}`; to rebuild from a stored "
            f"benchmark JSON without a GPU: `{PROG} --from-benchmark BENCH.json --out {target}`.")


def out_mismatch(out: Path, capability, gpu_name: str) -> str | None:
    """Why an output named as a packaged table (sm90.json, sm90-nvidia-h200.json) cannot hold the
    table of this GPU, or None (it can, or the name is of neither form: any file may hold a table)."""
    named = calibration.parse_file_name(out.name)
    if named is None:
        return None
    (cap, slug), here = named, tuple(capability)
    if cap != here or (slug is not None and slug != calibration.model_slug(gpu_name)):
        return (f"--out {out.name} names another GPU than the one measured, {gpu_name} "
                f"(sm{here[0]}{here[1]}); use {calibration.file_name(here)} (every GPU of that "
                f"capability) or {calibration.file_name(here, gpu_name)} (that model alone)")
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, formatter_class=benchmark.HelpFormatter,
        description="Measure SDPA and every sageattention backend on the calibration grid and write "
                    "the calibration table that sageattn's dispatcher reads to pick the fastest "
                    "backend per shape (SDPA included), or build that table from a stored benchmark "
                    "JSON without a GPU.",
        epilog=f"Examples:\n"
               f"  {PROG} --out sageattention/calibration/sm90.json --benchmark-json bench.json\n"
               f"  {PROG} --out sageattention/calibration/sm90-nvidia-h200.json   # that model alone\n"
               f"  {PROG} --from-benchmark bench.json --out sageattention/calibration/sm90.json   # no GPU\n\n"
               f"Grid: the 20 standard benchmark cases plus, for {' and '.join(DTYPES)}, head dims "
               f"{' and '.join(map(str, EXTRA_HEAD_DIMS))}, causal and not, (batch, seq_len) in "
               f"{', '.join(f'({b}, {n})' for b, n in EXTRA_SHAPES)} with {EXTRA_HEADS} heads, and "
               f"non-causal (batch, seq_len, kv_len) in "
               f"{', '.join(f'({b}, {n}, {kv})' for b, n, kv in EXTRA_KV_SHAPES)}, and causal and "
               f"not (batch, heads, seq_len) in "
               f"{', '.join(f'({b}, {h}, {n})' for b, h, n in EXTRA_FEW_HEADS_SHAPES)}. "
               "Timings are end to end (quantization included), median of triton.testing.do_bench. "
               "The dispatcher reads sageattention/calibration/sm<major><minor>-<model>.json for the "
               "GPU model it names (e.g. sm90-nvidia-h200.json for an NVIDIA H200), else "
               "sm<major><minor>.json for a GPU of exactly that capability; "
               "SAGEATTENTION_CALIBRATION=off disables it. Exit status: 0 "
               "written, 2 bad arguments or input, or no GPU to measure on.")
    p.add_argument("--out", required=True, metavar="PATH", type=benchmark.output_file_arg,
                   help="the table to write, e.g. sageattention/calibration/sm90.json (every GPU of "
                        "the measured one's capability) or sm90-nvidia-h200.json (that GPU model "
                        "alone); a name of either form must match the measured GPU")
    p.add_argument("--from-benchmark", metavar="BENCH.json",
                   help="build the table from this stored benchmark JSON instead of measuring (no GPU "
                        "needed): the output of --benchmark-json, of `python -m sageattention.benchmark "
                        "--json`, or a validation report")
    p.add_argument("--benchmark-json", metavar="PATH", type=benchmark.output_file_arg,
                   help="when measuring, also write the raw benchmark JSON here (commit it to let "
                        "anyone rebuild the table with --from-benchmark)")
    p.add_argument("--device", type=benchmark.cuda_device_arg, default="cuda:0",
                   help="the GPU to measure on (default cuda:0)")
    p.add_argument("--warmup-ms", type=benchmark.milliseconds_arg, default=benchmark.TIMER_WARMUP_MS,
                   help=f"do_bench warm-up per timing (default {benchmark.TIMER_WARMUP_MS:g}, "
                        "python -m sageattention.benchmark's)")
    p.add_argument("--rep-ms", type=benchmark.milliseconds_arg, default=100.0,
                   help="do_bench repetition time per timing (default 100)")
    p.add_argument("--rounds", type=benchmark.rounds_arg, default=DEFAULT_ROUNDS,
                   help="time every backend this many times per shape, interleaved, and keep the "
                        f"medians (python -m sageattention.benchmark --rounds; default {DEFAULT_ROUNDS}: "
                        "with one, forced SDPA and the same shape's baseline SDPA differed by up to "
                        "21%% on an H100; 1 halves the time)")
    p.add_argument("--refine-rounds", type=benchmark.count_arg(0), default=DEFAULT_REFINE_ROUNDS,
                   help="more interleaved rounds for the close calls: shapes whose fastest quantized "
                        f"backend measured within {REFINE_BAND:g}x of the dispatcher's threshold, either "
                        f"side; those two backends only (default {DEFAULT_REFINE_ROUNDS}; 0: none)")
    p.add_argument("--no-accuracy", action="store_true",
                   help="skip the fp32 SDPA comparison recorded in the benchmark JSON")
    return p


def _measure(args, argv: list[str]) -> dict:
    """Run the grid on the GPU; the benchmark document (as `python -m sageattention.benchmark --json`)."""
    from sageattention import dispatch
    from sageattention.validation.api import Api

    device = torch.device(args.device)
    cases = calibration_cases()
    others = benchmark.known_backends() + [SDPA]
    major, minor = torch.cuda.get_device_capability(device)
    print(f"{torch.cuda.get_device_name(device)} (sm{major}{minor}), torch {torch.__version__}: "
          f"{len(cases)} cases; timing torch SDPA and, forced, {', '.join(others)}; writing {args.out}",
          flush=True)
    # Off while measuring: the headline figure is then the static order, and nothing measured
    # depends on the table being replaced.
    api = Api.from_package()
    timer = benchmark.cuda_timer(args.warmup_ms, args.rep_ms)
    with dispatch.use_calibration(False):
        result = benchmark.run(cases, api=api, device=device, timer=timer, primary=None,
                               others=others, accuracy=not args.no_accuracy,
                               progress=lambda line: print(line, flush=True), rounds=args.rounds)
        if args.refine_rounds:
            _refine(result, cases, args.refine_rounds, api=api, device=device, timer=timer,
                    threshold=dispatch.CALIBRATION_MIN_SPEEDUP)
        doc = benchmark.document(result, device)
    doc["environment"]["command"] = f"{PROG} {shlex.join(argv)}"
    return doc


def _refine(result: dict, cases: list[Case], extra_rounds: int, *, api, device, timer,
            threshold: float) -> None:
    """Time the grid's close calls (`close_calls`) extra_rounds more rounds and fold them in."""
    close = close_calls(result["cases"], threshold=threshold)
    if not close:
        print("refine: no close calls", flush=True)
        return
    print(f"refine: {len(close)} shape(s) within {REFINE_BAND:g}x of the {threshold:g}x threshold, "
          f"{extra_rounds} more rounds of forced SDPA and their fastest quantized backend", flush=True)
    for n, (i, best) in enumerate(close, 1):
        row = result["cases"][i]
        extra = benchmark.run([cases[i]], api=api, device=device, timer=timer, primary=best,
                              others=[SDPA], accuracy=False, rounds=extra_rounds)["cases"][0]
        before = row["backends"][SDPA]["ms"] / row["backends"][best]["ms"]
        merge_rounds(row, extra, best)
        after = row["backends"][SDPA]["ms"] / row["backends"][best]["ms"]
        print(f"  [{n}/{len(close)}] {row['name']}: {best} {before:.3f}x -> {after:.3f}x forced SDPA",
              flush=True)
    result["method"] += (f"; shapes whose fastest quantized backend measured within {REFINE_BAND:g}x of "
                         f"the dispatcher's {threshold:g}x threshold: {extra_rounds} more rounds "
                         "of it and of forced SDPA")
    result["refine"] = {"band": REFINE_BAND, "threshold": threshold, "rounds": extra_rounds,
                        "cases": [result["cases"][i]["name"] for i, _ in close]}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if benchmark.same_file(args.out, args.from_benchmark):
        parser.error("--out names the file --from-benchmark reads: the table would replace the "
                     "measurements it is built from (name another file)")
    if benchmark.same_file(args.out, args.benchmark_json):
        parser.error("--out and --benchmark-json name one file: the table would replace the raw "
                     "measurements (name two files)")
    if args.from_benchmark and args.benchmark_json:
        parser.error("--benchmark-json writes the measurements of a GPU run; it does not go with "
                     "--from-benchmark")
    ignored = benchmark.given_options(parser, args, ("device", "warmup_ms", "rep_ms", "rounds",
                                           "refine_rounds", "no_accuracy")) if args.from_benchmark else []
    if ignored:
        parser.error(f"{', '.join(ignored)} set how a GPU run measures; --from-benchmark measures "
                     "nothing, so they would be ignored (drop them)")
    out = Path(args.out)
    if args.from_benchmark:
        source = args.from_benchmark
        try:
            doc = json.loads(Path(source).read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            print(f"error: cannot read the benchmark JSON {source}: {exc}", file=sys.stderr)
            return 2
    else:
        from . import dispatch

        problems = dispatch.environment_problems()
        if problems:  # every call of the grid would raise, and the run would be lost at its end
            print("error: " + "\nerror: ".join(problems), file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("error: no CUDA GPU is visible (torch.cuda.is_available() is False); measuring needs "
                  f"the GPU the table is for. Without a GPU: {PROG} --from-benchmark BENCH.json --out "
                  f"{args.out}", file=sys.stderr)
            return 2
        absent = benchmark.absent_cuda_device(args.device)
        if absent:
            print(f"error: {absent}", file=sys.stderr)
            return 2
        device = torch.device(args.device)
        problem = out_mismatch(out, torch.cuda.get_device_capability(device), torch.cuda.get_device_name(device))
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        source = args.benchmark_json or "measurements"
        doc = _measure(args, argv)
        if args.benchmark_json:
            try:
                benchmark.write_output(args.benchmark_json, json.dumps(doc, indent=2) + "\n")
            except OSError as exc:
                print(f"error: cannot write --benchmark-json {args.benchmark_json}: {exc}",
                      file=sys.stderr)
                return 2
            print(f"wrote {args.benchmark_json}")
    try:
        named = calibration.parse_file_name(out.name)
        table = table_from_benchmark(doc, argv=argv, source=source,
                                     per_model=named is not None and named[1] is not None)
        # entries[i] of the table is cases[i] of the benchmark
        text = calibration.dumps(table, source=f"built from the cases of {source}")
    except (BenchmarkFormatError, calibration.CalibrationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = out_mismatch(out, table["capability"], table["gpu_name"])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        benchmark.write_output(out, text)
    except OSError as exc:
        print(f"error: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {len(table['entries'])} entries from {table['gpu_name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
