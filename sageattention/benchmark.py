"""Benchmark: sageattn and each backend that runs here against SDPA's default backend.

    python -m sageattention.benchmark                      # the 20-case set of design.md
    python -m sageattention.benchmark --seq-len 1024 2048 8192 --head-dim 64 128
    python -m sageattention.benchmark --cases wide --json bench.json
    python -m sageattention.benchmark --also cuda-sm80-fp16 cuda-sm80-fp16@fp16   # a mode too

The headline ``sageattn`` figure is the default dispatch (calibration included: on a GPU with a
calibration table it may be SDPA) and each row records the backend that ran; every backend is also
timed forced. The JSON carries the environment (GPU, capability, torch, Triton, date, and the
command that reruns it: ``<python> -m sageattention.benchmark ARGS``), so
``python -m sageattention.calibrate --from-benchmark`` can build a calibration table from it.

Every timing is end to end (quantization included), on the same inputs, in this one process: the
median of many runs (``triton.testing.do_bench``, or CUDA events when Triton is absent).
TOPS = 4*b*h*n*n*d / time, halved for causal attention. These are attention microbenchmarks,
not end-to-end application speed-ups. The run (and ``--render``'s table) ends with the speed goals
judged from its own figures (``sageattention.speed_goals``: met, not met, or not evaluated where the
run lacks the cases a goal needs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from . import speed_goals
from .cases import DTYPES, Case  # noqa: F401  (DTYPES is re-exported: the benchmark's vocabulary)
# design.md's upstream 1.0.6 Triton column, re-exported for the tables and the tuning scripts
from .speed_goals import UPSTREAM_106_TRITON_TOPS  # noqa: F401

# b x h x n x d of design.md's case set; each in fp16 and bf16, causal and not: 20 cases.
STANDARD_SHAPES = ((4, 32, 4096, 128), (1, 32, 16384, 128), (4, 32, 4096, 64),
                   (1, 32, 16384, 64), (8, 32, 1024, 128))
# A wider sweep: every length at a constant token count per batch (b*n = 32768), 32 heads.
WIDE_SEQ_LENS = (1024, 2048, 4096, 8192, 16384, 32768)
WIDE_TOKENS = 32768


def standard_cases(dtypes=("fp16", "bf16")) -> list[Case]:
    return [Case(dt, b, h, n, d, c) for dt in dtypes for (b, h, n, d) in STANDARD_SHAPES
            for c in (False, True)]


def wide_cases(dtypes=("fp16", "bf16")) -> list[Case]:
    return [Case(dt, max(1, WIDE_TOKENS // n), 32, n, d, c) for dt in dtypes
            for n in WIDE_SEQ_LENS for d in (64, 128) for c in (False, True)]


def grid_cases(*, dtypes, batches, heads, seq_lens, head_dims, causal, kv_lens=(None,)) -> list[Case]:
    """The product of the lists; kv_lens None: keys as many as queries."""
    return [Case(dt, b, h, n, d, c, kv) for dt in dtypes for b in batches for h in heads
            for n in seq_lens for kv in kv_lens for d in head_dims for c in causal]


def tops(case: Case, ms: float) -> float:
    return case.flops / (ms * 1e-3) / 1e12


def geomean(values) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# Each timing's own warm-up (the function timed, run for this long first). With 25 ms, on an H100
# (benchmarks/results/h100-2026-12-06-order-{6f496e1,5c93194}.log, 4x32x4096x128 fp16) whatever was
# timed right after SDPA ran 4-6% slower than the same function timed after anything else, SDPA
# itself included (1.949 against 1.880 ms), and SDPA timed after a quantized kernel ran at 1.905 ms
# against 1.945-1.963 after 100-250 ms of itself: a short warm-up measures part of the previous
# function's clock state. With 100 ms the after-SDPA step was gone (sageattn 1.849 ms right after
# SDPA, 1.864 otherwise; 250 ms: 1.836 / 1.905), so each function is timed in its own steady state.
TIMER_WARMUP_MS = 100.0


def cuda_timer(warmup_ms: float = TIMER_WARMUP_MS, rep_ms: float = 100) -> Callable[[Callable], float]:
    """Median milliseconds of ``fn``: triton.testing.do_bench, else CUDA events. The returned
    timer's ``description`` names its warm-up and repetition times (for reports)."""
    try:
        from triton.testing import do_bench
    except ImportError:
        do_bench = None

    def timer(fn: Callable) -> float:
        if do_bench is not None:
            return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
        return _event_median(fn, warmup_ms, rep_ms)

    timer.warmup_ms, timer.rep_ms = float(warmup_ms), float(rep_ms)
    timer.description = _timer_description(timer.warmup_ms, timer.rep_ms)
    return timer


def _timer_description(warmup_ms: float, rep_ms: float) -> str:
    return f"{warmup_ms:g} ms of warm-up and {rep_ms:g} ms of repetitions per timing"


def _event_median(fn: Callable, warmup_ms: float, rep_ms: float) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    once = max(start.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / once))):
        fn()
    times = []
    for _ in range(max(5, int(rep_ms / once))):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _inputs(case: Case, device, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn((case.batch, case.heads, n, case.head_dim), generator=gen, device=device,
                             dtype=DTYPES[case.dtype])
                 for n in (case.seq_len, case.keys, case.keys))


def _warm_gpu(case: Case, device, seconds: float = 1.0) -> None:
    """Keeps the GPU busy with SDPA for about ``seconds`` before the first timing, so clock and
    first-use effects stay out of the first case (on the H200, 2026-12-03, the first case was the
    only one where `sageattn` running SDPA itself timed more than 3% off SDPA: 579 against 674
    TOPS); do_bench's own warm-up is per timing and short."""
    import time
    q, k, v = _inputs(case, device)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)
        torch.cuda.synchronize(device)
    del q, k, v


def run(cases: list[Case], *, api, device, timer: Callable[[Callable], float],
        primary: str | None = None, others: list[str] = (), accuracy: bool = True,
        progress: Callable[[str], None] | None = None, rounds: int = 1) -> dict:
    """Time SDPA (default backend), sageattn and each of ``others`` on every case.

    ``primary`` forces the backend of the headline ``sageattn`` figures (None: the default
    dispatch). A backend that raises or falls back to another is recorded with the reason, not
    timed. ``rounds`` > 1 times them all that many times, interleaved (SDPA, sageattn, others,
    SDPA, ...), and keeps each one's median: back-to-back timings of one kernel on the H200 moved
    up to 7%, and the first timing of a shape ran up to 40% slow
    (benchmarks/results/h200-2026-12-03-triton-ab-*.log). Returns the ``performance`` section of
    a validation report.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    rows = []
    if cases and device.type == "cuda":
        _warm_gpu(cases[0], device)
    for case in cases:
        q, k, v = _inputs(case, device)
        shape = {key: value for key, value in asdict(case).items() if key != "kv_len" or value is not None}
        row = {"name": case.name, **shape, "flops": case.flops}

        def sdpa(q=q, k=k, v=v, causal=case.causal):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        ref = None
        if accuracy:
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                 is_causal=case.causal)
        sdpa_runs, head_runs, other_runs = [], [], {name: [] for name in others}
        for r in range(rounds):  # accuracy (and the backend that ran) from the first round
            sdpa_runs.append(timer(sdpa))
            head_runs.append(_time_backend(api, primary, case, q, k, v, timer, ref if r == 0 else None))
            for name in others:
                other_runs[name].append(_time_backend(api, name, case, q, k, v, timer,
                                                      ref if r == 0 else None))
        row["sdpa_ms"] = statistics.median(sdpa_runs)
        row["sdpa_tops"] = tops(case, row["sdpa_ms"])
        if rounds > 1:
            row["sdpa_ms_rounds"] = sdpa_runs
        head = _median_of_rounds(case, head_runs)
        row.update({"backend": head.get("ran"), "sageattn_ms": head.get("ms"),
                    "sageattn_tops": head.get("tops"), "speedup_vs_sdpa": None,
                    "accuracy": head.get("accuracy"), "error": head.get("error")})
        if "ms_rounds" in head:
            row["sageattn_ms_rounds"] = head["ms_rounds"]
        if head.get("ms"):
            row["speedup_vs_sdpa"] = row["sdpa_ms"] / head["ms"]
        row["backends"] = {}
        for name in others:
            res = _median_of_rounds(case, other_runs[name])
            if res.get("ms"):
                res["speedup_vs_sdpa"] = row["sdpa_ms"] / res["ms"]
            row["backends"][name] = res
        del q, k, v, ref
        rows.append(row)
        if progress:
            progress(format_row(row))
    speedups = [r["speedup_vs_sdpa"] for r in rows]
    per_backend = {name: geomean(r["backends"][name].get("speedup_vs_sdpa") for r in rows)
                   for name in others}
    accs = [r["accuracy"] for r in rows if r.get("accuracy")]
    # a NaN or infinite output stores its figures as None (Errors.as_dict): no least cosine or
    # largest error over the run then (min() over None and floats raised TypeError and lost the run)
    finite = all(a.get("finite", True) and None not in (a.get("cosine"), a.get("rel_l1"), a.get("max_abs"))
                 for a in accs)
    # the timer's warm-up and repetitions, where it says (cuda_timer's do)
    timing = ({"warmup_ms": timer.warmup_ms, "rep_ms": timer.rep_ms}
              if hasattr(timer, "warmup_ms") and hasattr(timer, "rep_ms") else None)
    return {
        "method": ("end to end incl. quantization, same inputs, one process; median of "
                   "triton.testing.do_bench (CUDA events without Triton)"
                   + (f", {_timer_description(**timing)}" if timing else "")
                   + (f", median of {rounds} interleaved rounds" if rounds > 1 else "")
                   + "; TOPS = 4*b*h*n*n*d / time, halved for causal"),
        "rounds": rounds,
        **({"timer": timing} if timing else {}),
        "baseline": "torch.nn.functional.scaled_dot_product_attention, default backend",
        "primary_backend": primary or speed_goals.DEFAULT_DISPATCH,
        "cases": rows,
        "geomean_speedup_vs_sdpa": geomean(speedups),
        "complete": all(s is not None for s in speedups),
        "geomean_speedup_vs_sdpa_by_backend": per_backend,
        "accuracy": {
            "min_cosine": min(a["cosine"] for a in accs) if accs and finite else None,
            "max_rel_l1": max(a["rel_l1"] for a in accs) if accs and finite else None,
            "max_abs": max(a["max_abs"] for a in accs) if accs and finite else None,
            "finite": finite if accs else None,
        },
    }


def _median_of_rounds(case: Case, runs: list[dict]) -> dict:
    """The first round's result (backend, accuracy, error) with the median time of the rounds
    that timed; the rounds' times under ``ms_rounds`` when there were several."""
    result = dict(runs[0])
    times = [r["ms"] for r in runs if r.get("ms")]
    if times and result.get("ms"):
        result["ms"] = statistics.median(times)
        result["tops"] = tops(case, result["ms"])
        if len(runs) > 1:
            result["ms_rounds"] = times
    return result


# A timed name is a backend, or BACKEND@ACCUM: that backend forced with pv_accum_dtype=ACCUM, one
# of its accumulation modes (e.g. cuda-sm80-fp16@fp16), timed as a kernel of its own.
MODE_SEPARATOR = "@"


def split_timed_name(name: str) -> tuple[str, str | None]:
    """'cuda-sm80-fp16@fp16' -> ('cuda-sm80-fp16', 'fp16'); a plain backend -> (name, None)."""
    backend, sep, accum = name.partition(MODE_SEPARATOR)
    return backend, (accum if sep else None)


def timed_name_arg(text: str) -> str:
    """argparse type of --also / --backend: a known backend, or BACKEND@ACCUM with one of its modes."""
    from sageattention.backends import backend as backend_row

    name, accum = split_timed_name(text)
    try:
        row = backend_row(name)  # names every backend when it knows none by this name
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (optionally {MODE_SEPARATOR}<pv_accum_dtype>)") from exc
    if accum is not None:
        modes = row.pv_accum_dtypes
        if accum not in modes:
            raise argparse.ArgumentTypeError(
                f"{name} has no pv_accum_dtype {accum!r}; its modes are: {', '.join(modes) or 'none'}")
    return text


def _time_backend(api, backend, case, q, k, v, timer, ref) -> dict:
    from sageattention.validation.accuracy import errors

    name, accum = split_timed_name(backend) if backend else (None, None)
    force = (lambda: api.force_backend(name)) if name else contextlib.nullcontext
    mode = {"pv_accum_dtype": accum} if accum else {}

    def call():
        with force():
            return api.sageattn(q, k, v, tensor_layout="HND", is_causal=case.causal, **mode)

    try:
        out = call()
        ran = api.last_backend()
        if name is not None and ran != name:
            return {"ran": ran, "error": f"forced {backend} but {ran} ran"}
        result = {"ran": ran}
        if ref is not None:
            result["accuracy"] = errors(out, ref).as_dict()
        del out
        result["ms"] = timer(call)
        result["tops"] = tops(case, result["ms"])
        return result
    except Exception as exc:  # noqa: BLE001 - one backend failing must not end the benchmark
        return {"ran": None, "error": f"{type(exc).__name__}: {exc}"}


def format_row(row: dict) -> str:
    def num(x, fmt):
        return format(x, fmt) if x is not None else "-"

    extra = "".join(f"  {n}={num(r.get('speedup_vs_sdpa'), '.2f')}x"
                    for n, r in row.get("backends", {}).items())
    err = f"  ({row['error']})" if row.get("error") else ""
    return (f"{row['name']:<36} sdpa {num(row['sdpa_tops'], '6.1f')} TOPS  sageattn "
            f"{num(row.get('sageattn_tops'), '6.1f')} TOPS  {num(row.get('speedup_vs_sdpa'), '.2f')}x"
            f"  [{row.get('backend') or '-'}]{extra}{err}")


def known_backends() -> list[str]:
    try:
        from sageattention.backends import BACKEND_NAMES
    except ImportError:
        return []
    return [b for b in BACKEND_NAMES if b != "sdpa"]


def command_line(argv: list[str]) -> str:
    """This command as run with arguments ``argv``, for the JSON's environment.command: capture()
    quotes sys.argv, which holds the module's file under `python -m` (and `python
    .../sageattention/benchmark.py` does not run), or a caller's command line when main() is called."""
    return shlex.join([sys.executable, "-m", "sageattention.benchmark", *argv])


def document(result: dict, device) -> dict:
    """What ``--json`` writes: the results, what they ran on (``environment``, as in a validation
    report: GPU, capability, torch, Triton, date, command) and the calibration the default dispatch
    consulted (``dispatch_calibration``: the table's file, or null)."""
    from sageattention import dispatch
    from sageattention.validation.environment import capture

    env = capture(device)
    table = dispatch.calibration_for(dispatch.device_capability(device), gpu_name=dispatch.device_name(device))
    return {**result, "gpu_name": env["gpu_name"], "torch": env["torch"], "environment": env,
            "dispatch_calibration": table.source if table is not None else None}


def markdown(doc: dict, *, source: str) -> str:
    """A stored result as a markdown table: a benchmark JSON (``--json``) or a validation report
    (its ``performance`` section). TOPS per backend, speed-up vs SDPA, and upstream 1.0.6 Triton's
    TOPS (design.md) where the case has one. Generated, never edited."""
    if not isinstance(doc, dict):
        raise ValueError(f"{source} must hold a JSON object (a benchmark JSON or a validation "
                         "report)")
    perf = doc.get("performance", doc)
    if not isinstance(perf, dict):
        raise ValueError(f"{source} has no performance section (a validation run with "
                         "--no-performance measures none)")
    cases = perf.get("cases") or []
    if not cases:
        raise ValueError(f"{source} holds no benchmark cases")
    bad = next((i for i, c in enumerate(cases) if not isinstance(c, dict) or not c.get("name")), None)
    if bad is not None:
        raise ValueError(f"{source}: cases[{bad}] is not a benchmark case (an object with a name and "
                         "its timings)")
    env = doc.get("environment") or {}
    run = doc.get("run") or {}
    command = env.get("command") or run.get("command") or "unknown"
    names = sorted({n for c in cases for n, r in c.get("backends", {}).items() if r.get("tops")})
    primary = perf.get("primary_backend")
    headline = (f"is forced to `{primary}` in this run (not the default dispatch)"
                if isinstance(primary, str) and primary and primary != speed_goals.DEFAULT_DISPATCH
                else "is the default dispatch")

    def num(x, fmt=".0f"):
        return format(x, fmt) if isinstance(x, (int, float)) else "-"

    lines = [
        f"<!-- generated by `python -m sageattention.benchmark --render {source} --markdown OUT`;"
        " do not edit -->",
        f"# Benchmark: {env.get('gpu_name', doc.get('gpu_name', '?'))}, torch "
        f"{env.get('torch', doc.get('torch', '?'))}, {env.get('date', '?')[:10]}",
        "",
        f"Measured by: `{command}`  ",
        f"Method: {perf.get('method', '?')}. Baseline: {perf.get('baseline', '?')}.",
        f"TOPS per backend (speed-up vs SDPA in brackets); `sageattn` {headline} and "
        "names the backend it ran. Upstream 1.0.6 Triton: design.md's H200 figures, not measured "
        "in this run.",
        "",
        "| case | SDPA | sageattn [ran] | " + " | ".join(names) + " | upstream 1.0.6 Triton |",
        "|---|---|---|" + "---|" * len(names) + "---|",
    ]
    for c in cases:
        upstream = speed_goals.upstream_tops(c)
        cells = [c["name"], num(c.get("sdpa_tops")),
                 f"{num(c.get('sageattn_tops'))} ({num(c.get('speedup_vs_sdpa'), '.2f')}x) "
                 f"[{c.get('backend') or '-'}]"]
        for n in names:
            r = c.get("backends", {}).get(n, {})
            cells.append(f"{num(r.get('tops'))} ({num(r.get('speedup_vs_sdpa'), '.2f')}x)"
                         if r.get("tops") else "-")
        cells.append(num(upstream))
        lines.append("| " + " | ".join(cells) + " |")
    g = perf.get("geomean_speedup_vs_sdpa")
    lines += ["", f"Geometric mean speed-up of `sageattn` vs SDPA: {num(g, '.3f')}x"]
    for n, value in (perf.get("geomean_speedup_vs_sdpa_by_backend") or {}).items():
        lines.append(f"- {n}: {num(value, '.3f')}x")
    lines += [""] + speed_goals.section(perf, env.get("gpu_name", doc.get("gpu_name")))
    return "\n".join(lines) + "\n"


def count_arg(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least {minimum}, got {text!r}")
        return value
    return parse


# argparse type of --rounds (here and in python -m sageattention.calibrate)
rounds_arg = count_arg(1)


def quantized_head_dims(capability: tuple[int, int] | None = None) -> list[int]:
    """The head dims some quantized backend takes (on a GPU of ``capability``; None: on any GPU),
    read from the capability table (sageattention.backends), where each backend's are declared."""
    from sageattention.backends import capability_table

    return sorted({d for b in capability_table() if b.kind != "sdpa" and b.head_dims is not None
                   and (capability is None or b.serves(capability)) for d in b.head_dims})


def spans(values: list[int]) -> str:
    """[1, 2, 3, 64] -> '1..3, 64': a sorted list of whole numbers, runs written as ranges."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def head_dim_arg(text: str) -> int:
    """argparse type of --head-dim: one that some quantized backend takes. Any other was timed as
    SDPA against SDPA (sageattn falls back to it, every forced backend fails) and exited 0."""
    accepted = quantized_head_dims()
    try:
        value = int(text)
    except ValueError:
        value = None
    if value not in accepted:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a head dim the quantized kernels take; they take {spans(accepted)}")
    return value


def milliseconds_arg(text: str) -> float:
    """argparse type of --warmup-ms / --rep-ms (here and in python -m sageattention.calibrate): the
    timer divides them by a kernel's time into a count of runs, which NaN, infinity or a negative
    length cannot give."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds, 0 or more, got {text!r}")
    return value


def output_file_arg(text: str) -> str:
    """argparse type of a file a command writes (here and in python -m sageattention.calibrate):
    a folder, a path under a file, or one under a folder this process cannot write in, is refused
    before a GPU run rather than after it."""
    path = Path(text)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing == path and path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; name the file to write")
    if existing is not None and existing != path and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} lies under the file {existing}; name the "
                                         "file to write")
    folder = path.parent if existing == path else existing
    if folder is not None and folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        # found after the GPU run, it cost the run
        raise argparse.ArgumentTypeError(f"{text!r}: cannot write in {folder} (no permission, or a "
                                         "read-only file system); name a file in a folder you can write")
    return text


def write_output(path: str | Path, text: str) -> None:
    """Write a file that output_file_arg admitted: its folder created if missing, the text put in
    place whole (a temporary beside it, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:  # an error or Ctrl-C half way: no half-written temporary left beside it
        tmp.unlink(missing_ok=True)
        raise


def cuda_device_arg(text: str) -> str:
    """argparse type of --device (here and in python -m sageattention.calibrate): a CUDA device,
    cuda or cuda:N; another kind is refused before anything is measured, not by a traceback."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device ({exc}); give cuda or cuda:N") from None
    if device.type != "cuda":
        raise argparse.ArgumentTypeError(f"{text!r} is a {device.type} device; the timings are of "
                                         "CUDA kernels: give cuda or cuda:N")
    return text


def absent_cuda_device(text: str) -> str | None:
    """Why the CUDA device ``text`` (from cuda_device_arg) is not on this machine, or None."""
    index, count = torch.device(text).index, torch.cuda.device_count()
    if (index is None and count > 0) or (index is not None and index < count):
        return None
    if count == 0:
        return f"--device {text}: no CUDA GPU is visible"
    return (f"--device {text}: this machine has {count} visible CUDA GPU"
            f"{'' if count == 1 else 's'} (cuda:0{'' if count == 1 else f' to cuda:{count - 1}'})")


class ListOption(argparse.Action):
    """argparse action of a list option (nargs "+" or "*"): given twice, the second list adds
    to the first (argparse's own store replaced it: `--seq-len 1024 --seq-len 4096` timed 4096
    alone); the first use replaces the default."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest, None)
        before = [] if given is None or given is self.default else list(given)
        setattr(namespace, self.dest, [*before, *values])


def given_options(parser: argparse.ArgumentParser, args, dests) -> list[str]:
    """The options among ``dests`` given a value other than their default, as typed (--rep-ms)."""
    return ["--" + d.replace("_", "-") for d in dests
            if getattr(args, d) != parser.get_default(d)]


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help formatter (here and in python -m sageattention.calibrate), except that the
    description and epilog keep their paragraphs (blank lines between) and print a paragraph with
    indented lines, the examples, as written; argparse ran them all into one paragraph."""

    def _fill_text(self, text, width, indent):
        paragraphs = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line.startswith("  ") for line in lines):  # examples: as written
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(super()._fill_text(para, width, indent))
        return "\n\n".join(paragraphs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sageattention.benchmark", formatter_class=HelpFormatter,
        description="Time sageattn and each backend against SDPA's default backend on the same "
                    "inputs (quantization included) and print TOPS, speed-ups and their "
                    "geometric mean. Attention microbenchmarks, not end-to-end speed-ups.",
        epilog="Examples:\n"
               "  python -m sageattention.benchmark                     # the 20 standard cases\n"
               "  python -m sageattention.benchmark --seq-len 1024 8192 --head-dim 64 128 --causal no\n"
               "  python -m sageattention.benchmark --cases wide --json bench.json\n"
               "  python -m sageattention.benchmark --also cuda-sm80-fp16@fp16 --rounds 1\n"
               "  python -m sageattention.benchmark --render bench.json --markdown bench.md\n\n"
               "The JSON (--json) records the figures, the method (timer, warm-up, repetitions, "
               "rounds, baseline) and the environment (GPU, capability, torch, Triton, date and "
               "the command that made it); it is written whole or not at all, its folder created "
               "if missing.\n\n"
               "Exit status: 0 every case's sageattn figure was timed; 1 some case's sageattn call "
               "failed (the table names the error; the other figures are still printed and "
               "written); 2 bad arguments, no GPU, or a file that cannot be read or rendered.")
    p.add_argument("--cases", choices=("standard", "wide"), default="standard",
                   help="standard: the 20 cases of design.md (default); wide: seq 1024..32768 x d "
                        "64/128 x causal, b*n=32768, 32 heads")
    p.add_argument("--dtype", nargs="+", action=ListOption, choices=sorted(DTYPES), default=["fp16", "bf16"],
                   help="the Q/K/V dtypes of the cases, --cases or the grid (default: fp16 bf16)")
    grid = p.add_argument_group("custom grid (any of these replaces --cases with their product)")
    grid.add_argument("--batch", nargs="+", action=ListOption, type=int, help="batch sizes (default 4)")
    grid.add_argument("--heads", nargs="+", action=ListOption, type=int, help="attention heads (default 32)")
    grid.add_argument("--seq-len", nargs="+", action=ListOption, type=int, help="query tokens per sequence (default 4096)")
    grid.add_argument("--kv-len", nargs="+", action=ListOption, type=int,
                      help="key/value tokens per sequence (default: as --seq-len); e.g. --seq-len "
                           "4096 --kv-len 77 for cross-attention, --seq-len 1 --kv-len 8192 for a "
                           "decoding step")
    grid.add_argument("--head-dim", nargs="+", action=ListOption, type=head_dim_arg,
                      help="head dimensions (default 128); one of those the quantized kernels take: "
                           f"{spans(quantized_head_dims())}")
    p.add_argument("--causal", choices=("both", "yes", "no"), default="both",
                   help="both: every case causal and not (default); yes: causal only; no: "
                        "non-causal only")
    p.add_argument("--backend", default=None, type=timed_name_arg,
                   help="force the headline sageattn figures to this backend (default: the "
                        "dispatcher's choice)")
    p.add_argument("--also", nargs="*", action=ListOption, default=None, metavar="BACKEND", type=timed_name_arg,
                   help="other backends to time, forced (default: every known backend except "
                        "sdpa; those that cannot run here are reported with the reason; --also "
                        "with no name: none); "
                        f"BACKEND{MODE_SEPARATOR}ACCUM times that backend with pv_accum_dtype=ACCUM, "
                        f"e.g. cuda-sm80-fp16{MODE_SEPARATOR}fp16")
    p.add_argument("--warmup-ms", type=milliseconds_arg, default=TIMER_WARMUP_MS,
                   help=f"each timing's own warm-up (default {TIMER_WARMUP_MS:g}: with 25 the function timed "
                        "right after SDPA ran 4-6%% slow on an H100)")
    p.add_argument("--rep-ms", type=milliseconds_arg, default=100.0,
                   help="each timing's measuring time after its warm-up: the function runs "
                        "repeatedly for about this long and the median is kept (default 100)")
    p.add_argument("--rounds", type=rounds_arg, default=3,
                   help="time every kernel this many times per case, interleaved, and keep the "
                        "medians (default 3: one timing of SDPA alone moved 14%% between rounds "
                        "on an H100; 1 for a quick look)")
    p.add_argument("--no-accuracy", action="store_true", help="skip the fp32 SDPA comparison")
    p.add_argument("--device", type=cuda_device_arg, default="cuda:0", help="the GPU to time on (default cuda:0)")
    p.add_argument("--json", metavar="PATH", type=output_file_arg,
                   help="also write the results as JSON")
    p.add_argument("--render", metavar="JSON", help="no GPU: render a stored benchmark JSON or "
                   "validation report as a markdown table (to stdout, or --markdown)")
    p.add_argument("--markdown", metavar="PATH", type=output_file_arg, help="write the markdown table here (with --render, "
                   "or after a run)")
    return p


GRID_OPTIONS = ("batch", "heads", "seq_len", "kv_len", "head_dim")


def cases_from_args(args) -> list[Case]:
    causal = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    if any(getattr(args, d) is not None for d in GRID_OPTIONS):
        return grid_cases(dtypes=args.dtype, batches=args.batch or [4], heads=args.heads or [32],
                          seq_lens=args.seq_len or [4096], head_dims=args.head_dim or [128],
                          causal=causal, kv_lens=args.kv_len or [None])
    make = standard_cases if args.cases == "standard" else wide_cases
    return [c for c in make(tuple(args.dtype)) if c.causal in causal]


def same_file(a: str | Path | None, b: str | Path | None) -> bool:
    """Whether two path arguments name one file (after ~, symlinks and relative parts)."""
    if not a or not b:
        return False
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _write_markdown(doc: dict, source: str, path: str | None) -> None:
    text = markdown(doc, source=source)
    if path:
        write_output(path, text)
        print(f"wrote {path}")
    else:
        print(text, end="")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    repeated = sorted({n for i, n in enumerate(args.also or []) if n in args.also[:i]})
    if repeated:
        parser.error(f"--also names {', '.join(repeated)} more than once (each backend is timed "
                     "once per round; name it once)")
    if same_file(args.render, args.markdown):
        parser.error("--markdown names the file --render reads: writing the table would replace the "
                     "stored JSON (name another file)")
    if same_file(args.json, args.markdown):
        parser.error("--json and --markdown name one file: the table would replace the JSON "
                     "(name two files)")
    if args.render:
        ignored = given_options(parser, args, [d for d in vars(args)
                                               if d not in ("render", "markdown")])
        if ignored:
            parser.error(f"--render only renders a stored JSON; {', '.join(ignored)} would be "
                         "ignored (drop them, or drop --render to run the benchmark)")
        try:
            with open(args.render, encoding="utf-8") as fh:
                doc = json.load(fh)
            _write_markdown(doc, args.render, args.markdown)
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
            print(f"error: cannot render {args.render}: {exc}", file=sys.stderr)
            return 2
        except (TypeError, KeyError, AttributeError, IndexError) as exc:
            # a JSON of the right kinds of keys whose values have other types
            print(f"error: cannot render {args.render}: a field has the wrong type or is missing "
                  f"({type(exc).__name__}: {exc}); it is not a benchmark JSON or validation "
                  "report as python -m sageattention.benchmark --json writes them", file=sys.stderr)
            return 2
        return 0
    grid = given_options(parser, args, GRID_OPTIONS)
    if grid and args.cases != parser.get_default("cases"):
        parser.error(f"--cases {args.cases} would be ignored: the custom grid ({', '.join(grid)}) "
                     "replaces it (drop --cases, or the grid options)")
    repeated = {opt: sorted({str(v) for i, v in enumerate(vals) if v in vals[:i]})
                for opt, vals in (("--" + d.replace("_", "-"), getattr(args, d))
                                  for d in ("dtype", *GRID_OPTIONS)) if isinstance(vals, list)}
    repeated = {opt: vals for opt, vals in repeated.items() if vals}
    if repeated:  # each case would be timed twice and count twice in the geometric mean
        parser.error("; ".join(f"{opt} names {', '.join(v)} more than once" for opt, v in
                               repeated.items()) + " (name each value once)")
    try:
        cases = cases_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from . import dispatch

    problems = dispatch.environment_problems()
    if problems:  # every sageattn call would raise; say it before the GPU run, not after it
        print("error: " + "\nerror: ".join(problems), file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: no CUDA GPU is visible (torch.cuda.is_available() is False); the benchmark "
              "times GPU kernels and needs one", file=sys.stderr)
        return 2
    absent = absent_cuda_device(args.device)
    if absent:
        print(f"error: {absent}", file=sys.stderr)
        return 2
    if args.head_dim:
        capability = torch.cuda.get_device_capability(args.device)
        here = quantized_head_dims(capability)
        unserved = [d for d in args.head_dim if d not in here]
        if unserved:  # those cases would time SDPA against itself
            print(f"error: --head-dim {' '.join(map(str, unserved))}: no quantized kernel takes it on "
                  f"this GPU (compute capability {capability[0]}.{capability[1]}); here they take "
                  f"{spans(here) or 'none'}", file=sys.stderr)
            return 2
    from sageattention.validation.api import Api

    api = Api.from_package()
    device = torch.device(args.device)
    others = known_backends() if args.also is None else args.also
    primary = args.backend or dispatch.forced_backend()
    if primary and not args.backend:  # recorded as forced, not as "default dispatch"
        print(f"note: {dispatch.ENV_VAR}={primary} forces the headline figures, as --backend "
              f"{primary} would", flush=True)
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
          f"{len(cases)} cases; also timed: {', '.join(others) or 'none'}", flush=True)
    print(f"{'case':<36} {'SDPA (default)':>19}  {'sageattn':>15}  speed-up  [backend]", flush=True)
    result = run(cases, api=api, device=device, timer=cuda_timer(args.warmup_ms, args.rep_ms),
                 primary=primary, others=others, accuracy=not args.no_accuracy,
                 progress=lambda line: print(line, flush=True), rounds=args.rounds)
    g = result["geomean_speedup_vs_sdpa"]
    print(f"geometric mean speed-up vs SDPA: {g:.3f}x" if g else "geometric mean: n/a")
    for name, value in result["geomean_speedup_vs_sdpa_by_backend"].items():
        print(f"  {name}: {value:.3f}x" if value else f"  {name}: did not run")
    print("\n".join(speed_goals.section(result, torch.cuda.get_device_name(device))))
    doc = document(result, device) if args.json or args.markdown else None
    if doc is not None:
        doc["environment"]["command"] = command_line(argv)
    try:
        if args.json:
            write_output(args.json, json.dumps(doc, indent=2))
            print(f"wrote {args.json}")
        if args.markdown:
            _write_markdown(doc, args.json or "(this run)", args.markdown)
    except OSError as exc:
        print(f"error: cannot write the results: {exc}", file=sys.stderr)
        return 2
    failed = [row["name"] for row in result["cases"] if not row.get("sageattn_ms")]
    if failed:
        print(f"error: sageattn was not timed at {len(failed)} of {len(result['cases'])} cases "
              f"({', '.join(failed[:3])}{', ...' if len(failed) > 3 else ''}): see their rows",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
