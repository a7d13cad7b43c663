"""At what SM clock and power does each backend run? A GPU diagnostic for the kernels' cycle budgets.

    python benchmarks/gpu_dev_clocks.py [--case 1x32x16384x128 ...] [--backend cuda-sm90-fp16 ...]
                                        [--seconds 3] [--interval-ms 20] [--json OUT]

docs/kernels.md turns times into cycles a block at an assumed clock, and every attempt to overlap
the sm90 kernel's softmax with its tensor work (turns, overlap inside a warpgroup) measured level
or slower. One reading that would explain both: the card runs these kernels at a power limit, so
its clock falls as more units are busy. This runs each entry (SDPA's default backend, then each
--backend forced through `sageattn`, NAME@ACCUM for an accumulation mode) back to back for
--seconds after a warm-up of the same length, samples NVML (pynvml) every --interval-ms from a
thread meanwhile, and prints per entry: TOPS over the timed stretch (CUDA events), the median SM
clock and power draw, the share of samples with each clock-event reason NVML reported active
(power cap, thermal, ...), and TOPS per GHz of the median clock. The card's settings are read,
never changed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_dev_order import parse_case  # noqa: E402  (this folder's case syntax, one parser)

REASONS = {  # NVML clocks-event reason bits (nvml.h, nvmlClocksEventReason*)
    0x1: "gpu_idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}


class Sampler(threading.Thread):
    """NVML samples (SM clock MHz, power W, clocks-event reason bits) until stopped."""

    def __init__(self, handle, interval_s: float):
        super().__init__(daemon=True)
        self.handle, self.interval_s = handle, interval_s
        self.samples: list[tuple[int, float, int]] = []
        self.stop_event = threading.Event()

    def run(self):
        import pynvml as nv
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        while not self.stop_event.is_set():
            self.samples.append((nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM),
                                 nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0, reasons(self.handle)))
            time.sleep(self.interval_s)


def run_for(fn, seconds: float) -> tuple[int, float]:
    """Calls fn back to back for about ``seconds``; returns (calls, GPU ms per call by events)."""
    calls = 0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(5):
            fn()
        calls += 5
        torch.cuda.synchronize()
    end.record()
    end.synchronize()
    return calls, start.elapsed_time(end) / calls


def measure(name, fn, flops, handle, seconds, interval_s) -> dict:
    run_for(fn, seconds)  # warm-up at this entry's own load
    sampler = Sampler(handle, interval_s)
    sampler.start()
    calls, ms = run_for(fn, seconds)
    sampler.stop_event.set()
    sampler.join()
    clocks = [s[0] for s in sampler.samples]
    power = [s[1] for s in sampler.samples]
    shares = {label: sum(1 for s in sampler.samples if s[2] & bit) / len(sampler.samples)
              for bit, label in REASONS.items()}
    mhz = statistics.median(clocks)
    tops = flops / (ms * 1e-3) / 1e12
    return {"entry": name, "calls": calls, "ms": ms, "tops": tops, "sm_mhz_median": mhz,
            "sm_mhz_min": min(clocks), "sm_mhz_max": max(clocks), "power_w_median": statistics.median(power),
            "samples": len(clocks), "reasons": {k: round(v, 3) for k, v in shares.items() if v > 0},
            "tops_per_ghz": tops / (mhz / 1000.0)}


def case_entries(sa, case, dtype, backends) -> dict:
    """SDPA's default backend and each forced backend that runs, as calls on one case's inputs."""
    from sageattention.benchmark import split_timed_name

    b, h, n, d, causal = case
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    entries = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
    for text in backends:
        name, accum = split_timed_name(text)
        mode = {"pv_accum_dtype": accum} if accum else {}

        def call(name=name, mode=mode):
            with sa.force_backend(name):
                return sa.sageattn(q, k, v, is_causal=causal, **mode)
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - a backend this wheel lacks must not end the run
            print(f"# {text}: {type(exc).__name__}: {exc}; skipped")
            continue
        if sa.last_backend() != name:
            print(f"# {text}: forced but {sa.last_backend()} ran; skipped")
            continue
        entries[text] = call
    return entries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--case", type=parse_case, action="append",
                        help="BxHxNxD[c] (c: causal); repeatable; default 1x32x16384x128 and 4x32x4096x64")
    parser.add_argument("--backend", action="append", default=None,
                        help="a backend forced through sageattn, NAME or NAME@ACCUM; repeatable "
                             "(default: cuda-sm90-fp16); SDPA's default backend is always timed")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed stretch per entry (and as much warm-up)")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="NVML sampling period")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_dev_clocks: no CUDA device", file=sys.stderr)
        return 2
    try:
        import pynvml as nv
    except ImportError:
        print("gpu_dev_clocks: needs pynvml (nvidia-ml-py)", file=sys.stderr)
        return 2
    import sageattention as sa

    nv.nvmlInit()
    handle = nv.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    limit_w = nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    max_mhz = nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM)
    print(f"# {torch.cuda.get_device_name()}: power limit {limit_w:.0f} W, max SM clock {max_mhz} MHz")
    dtype = getattr(torch, args.dtype)
    rows = []
    for case in args.case or [parse_case("1x32x16384x128"), parse_case("4x32x4096x64")]:
        b, h, n, d, causal = case
        flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
        for entry, fn in case_entries(sa, case, dtype, args.backend or ["cuda-sm90-fp16"]).items():
            row = measure(entry, fn, flops, handle, args.seconds, args.interval_ms / 1000.0)
            row["case"] = f"{b}x{h}x{n}x{d}{'c' if causal else ''}"
            rows.append(row)
            print(f"{row['case']:18s} {entry:26s} {row['tops']:6.0f} TOPS  {row['sm_mhz_median']:5.0f} MHz "
                  f"({row['sm_mhz_min']}-{row['sm_mhz_max']})  {row['power_w_median']:5.0f} W  "
                  f"{row['tops_per_ghz']:6.0f} TOPS/GHz  {row['reasons']}", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "power_limit_w": limit_w,
                       "max_sm_mhz": max_mhz, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
