"""Python cost of one sageattention call against torch's SDPA, on the CPU (no GPU needed).

    PYTHONPATH=. python benchmarks/cpu_call_overhead.py [--calls 20000] [--rounds 5]

Times, in one process and on the same small CPU tensors (one decoding step: a 1x8x1x64 query
against 16 keys, where the attention itself is a few microseconds), torch's SDPA, `sageattn`
without and with an extra keyword (both kept per signature since 1924e49; before it, a keyword
meant every check on every call) and `sageattention.scaled_dot_product_attention`. Each figure is the median over rounds of
the mean per call over `--calls` calls. On the CPU every call runs SDPA, so what exceeds torch's
figure is sageattention's own Python: validation, dispatch and the fallback's bookkeeping.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def per_call_us(fn, calls: int, rounds: int) -> float:
    for _ in range(min(calls, 500)):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--calls", type=int, default=20000, help="calls per round (default 20000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default 5)")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        ap.error("--calls and --rounds must be at least 1")
    logging.getLogger("sageattention").setLevel(logging.ERROR)  # the CPU fallback's one-time warning
    import sageattention as sa

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 8, 1, 64), torch.randn(1, 8, 16, 64), torch.randn(1, 8, 16, 64)
    rows = [
        ("torch SDPA", lambda: F.scaled_dot_product_attention(q, k, v)),
        ("sageattn(q, k, v)", lambda: sa.sageattn(q, k, v)),
        ("sageattn(q, k, v, dropout_p=0.0)", lambda: sa.sageattn(q, k, v, dropout_p=0.0)),
        ("sageattention.scaled_dot_product_attention", lambda: sa.scaled_dot_product_attention(q, k, v)),
    ]
    print(f"# {' '.join([sys.executable.rsplit('/', 1)[-1], *sys.argv])}")
    print(f"# torch {torch.__version__}, sageattention {sa.__version__}, {torch.get_num_threads()} CPU threads; "
          f"q 1x8x1x64, k/v 1x8x16x64 float32; median of {args.rounds} rounds of {args.calls} calls")
    base = None
    for name, fn in rows:
        us = per_call_us(fn, args.calls, args.rounds)
        base = us if base is None else base
        extra = "" if us is base else f"   +{us - base:5.1f} us over torch SDPA"
        print(f"{name:46s} {us:6.1f} us{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
