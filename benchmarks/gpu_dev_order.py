"""Does a timing depend on what was timed just before it? A GPU diagnostic for the benchmark's lanes.

    python benchmarks/gpu_dev_order.py [--case 4x32x4096x64c ...] [--rounds 24] [--warmup-ms 25]

In the validation's performance lane `sageattn` (default dispatch, timed right after SDPA) ran a few
percent behind SDPA itself on shapes where it runs SDPA (benchmarks/results/README.md, rows
cdb67f8 and 54b65ae). For each case this times, in one process with the lane's timer
(`sageattention.benchmark.cuda_timer`), four entries: SDPA called directly, `sageattn` with the
default dispatch, `sageattn` with SDPA forced, and `sageattn` with the first native backend forced.
Each round takes them in another order (all 24 by default), so every entry is timed right after
SDPA in some rounds. It prints each entry's median time right after SDPA and otherwise, and the
CPU time one call takes to enqueue (mean of 200 calls without a synchronization, then one): an
entry whose enqueue time reaches its GPU time is timed with the GPU waiting on Python.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def parse_case(text: str) -> tuple[int, int, int, int, bool]:
    """'4x32x4096x64' or '4x32x4096x64c' (causal) -> (b, h, n, d, causal)."""
    causal = text.endswith("c")
    try:
        b, h, n, d = (int(x) for x in text.rstrip("c").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"case {text!r}: expected BxHxNxD, optionally ending in c") from None
    return b, h, n, d, causal


def enqueue_us(fn, calls: int = 200) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def time_case(sa, timer, native: str | None, case, rounds: int) -> None:
    b, h, n, d, causal = case
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(3))

    def forced(name):
        def call():
            with sa.force_backend(name):
                return sa.sageattn(q, k, v, is_causal=causal)
        return call

    entries = {"sdpa direct": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
               "sageattn default": lambda: sa.sageattn(q, k, v, is_causal=causal),
               "sageattn forced sdpa": forced("sdpa")}
    if native:
        entries[f"sageattn forced {native}"] = forced(native)
    entries["sageattn default"]()
    default_ran = sa.last_backend()
    names = list(entries)
    after_sdpa = {name: [] for name in names}  # timings that came right after SDPA's
    other = {name: [] for name in names}
    prev = None
    for order in itertools.islice(itertools.permutations(names), rounds):
        for name in order:
            (after_sdpa if prev == "sdpa direct" else other)[name].append(timer(entries[name]))
            prev = name
    print(f"\n{b}x{h}x{n}x{d}{' causal' if causal else ''} (default dispatch ran {default_ran}); "
          f"ms: median right after SDPA direct / median otherwise; CPU enqueue per call")

    def med(ts):
        return f"{statistics.median(ts):.3f}" if ts else "  -  "
    for name in names:
        print(f"  {name:34} after sdpa {med(after_sdpa[name])} (n={len(after_sdpa[name])})"
              f"  otherwise {med(other[name])} (n={len(other[name])})"
              f"  | enqueue {enqueue_us(entries[name]):7.1f} us")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", type=parse_case, nargs="+",
                   default=[parse_case(c) for c in ("4x32x4096x64c", "4x32x4096x128", "8x32x1024x128c")])
    from sageattention.benchmark import rounds_arg

    p.add_argument("--rounds", type=rounds_arg, default=24,
                   help="rounds, each in another order of the entries (default 24: all orders of four)")
    p.add_argument("--warmup-ms", type=float, default=25)
    p.add_argument("--rep-ms", type=float, default=40)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2

    import sageattention as sa
    from sageattention import benchmark
    from sageattention.backends import backend
    from sageattention.native import available_families

    timer = benchmark.cuda_timer(args.warmup_ms, args.rep_ms)
    loaded = available_families()  # family -> None when loaded, else why not
    native = next((name for name in ("cuda-sm90-fp16", "cuda-sm80-fp16", "cuda-sm75-fp16")
                   if loaded.get(backend(name).family, "unknown") is None), None)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, sageattention {sa.__version__}; "
          f"timer warm-up {args.warmup_ms} ms, repetitions {args.rep_ms} ms; native entry {native}")
    for case in args.case:
        time_case(sa, timer, native, case, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
