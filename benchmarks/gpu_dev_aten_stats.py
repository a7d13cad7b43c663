"""CUDA time of the ATen reductions the native ops used for K's mean and V's FP8 scale before
their own token_stats kernel (kernel developers' tool, the A side of an A/B in one process).

    python benchmarks/gpu_dev_aten_stats.py --case 4x32x4096x128 [--case ...] [--dtype float16]

Per case, on N(0, 1) inputs in HND layout: torch.mean(k, dim=2, dtype=torch.float32) and
torch.aminmax(v, dim=2), each the mean CUDA time per call over 20 calls (torch.profiler), as
`benchmarks/gpu_dev_profile.py breakdown` measures the ops' own kernels.
"""
from __future__ import annotations

import argparse
import sys


def cuda_us_per_call(fn, calls: int = 20) -> float:
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(ev.device_time for ev in prof.events()
               if ev.device_type == torch.autograd.DeviceType.CUDA) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", required=True, metavar="BxHxNxD")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = parser.parse_args(argv)
    import torch

    for case in args.case:
        b, h, n, d = (int(s) for s in case.split("x"))
        x = torch.randn(b, h, n, d, device="cuda", dtype=getattr(torch, args.dtype))
        mean_us = cuda_us_per_call(lambda x=x: torch.mean(x, dim=2, dtype=torch.float32))
        aminmax_us = cuda_us_per_call(lambda x=x: torch.aminmax(x, dim=2))
        gbytes = x.numel() * x.element_size() / 1e9
        print(f"{case} {args.dtype}: ATen mean over tokens {mean_us:.1f} us "
              f"({gbytes / mean_us * 1e3:.2f} TB/s), aminmax {aminmax_us:.1f} us "
              f"({gbytes / aminmax_us * 1e3:.2f} TB/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
