"""Where the time of one native attention call goes, on the GPU runner (kernel developers' tool).

    python benchmarks/gpu_dev_profile.py breakdown --case 4x32x4096x128 --label sm80-fp32
        CUDA time per kernel of one call (torch.profiler over repeated calls): the attention
        kernel against the quantization and K-mean kernels around it.
    ncu --clock-control none -k regex:attn_kernel -c 1 --section WarpStateStats ... \\
        python benchmarks/gpu_dev_profile.py drive --case 4x32x4096x128 --label sm80-fp32
        runs the call a few times, for a profiler attached from outside.
    python benchmarks/gpu_dev_profile.py aten-stats --case 4x32x4096x128
        CUDA time of ATen's mean and aminmax over the tokens of a tensor of that shape.
    python benchmarks/gpu_dev_profile.py trace --case 4x32x4096x128 --label sm90_fp8-fp32+fp32
        with a build of the warp-specialized wgmma kernel made with -DSAGE_WG_TRACE=<CTA>: one
        call in a child process, whose CTA prints the SM clock at each phase of its K blocks for
        each consumer warpgroup; shown as cycles per phase, and the warpgroups' offset.

Labels and the build come from benchmarks/gpu_dev_native.py (build there first).
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_dev_native as dev  # noqa: E402  (puts the package root on sys.path)


def _call(case: str, label: str, causal: bool, dtype: str):
    import torch

    b, h, n, d = (int(x) for x in case.split("x"))
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g, device="cuda", dtype=getattr(torch, dtype))
               for _ in range(3))
    return dev._kernel_fn(label, q, k, v, causal)


def cuda_us_per_kernel(fn, calls: int = 20) -> dict[str, float]:
    """Mean CUDA time per call of each kernel fn launches (torch.profiler, after 5 warm-up calls)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = collections.defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[ev.name[:90]] += ev.device_time / calls
    return per_kernel


def breakdown(case: str, label: str, causal: bool, dtype: str, calls: int = 20) -> None:
    per_kernel = cuda_us_per_kernel(_call(case, label, causal, dtype), calls)
    total = sum(per_kernel.values())
    print(f"{case} {label} causal={causal} {dtype}: {total:.1f} us of GPU time per call")
    for name, us in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
        print(f"  {us:9.1f} us  {100 * us / total:5.1f}%  {name}")


def aten_stats(case: str, dtype: str) -> None:
    """ATen's mean and aminmax over the token dim (what K's mean and, before v_scale_kernel, V's
    FP8 scale used) on N(0, 1) input of this shape, HND: the A side of an A/B in one process."""
    import torch

    b, h, n, d = (int(s) for s in case.split("x"))
    x = torch.randn(b, h, n, d, device="cuda", dtype=getattr(torch, dtype))
    mean_us = sum(cuda_us_per_kernel(lambda: torch.mean(x, dim=2, dtype=torch.float32)).values())
    aminmax_us = sum(cuda_us_per_kernel(lambda: torch.aminmax(x, dim=2)).values())
    gbytes = x.numel() * x.element_size() / 1e9
    print(f"{case} {dtype}: ATen mean over tokens {mean_us:.1f} us ({gbytes / mean_us * 1e3:.2f} TB/s), "
          f"aminmax {aminmax_us:.1f} us ({gbytes / aminmax_us * 1e3:.2f} TB/s)")


def _clock_dt(a: int, b: int) -> int:  # 32-bit SM clock differences
    return (b - a) % (1 << 32)


def trace_table(text: str) -> str:
    """The TRACE lines of a -DSAGE_WG_TRACE build as cycles per phase and K block for each
    consumer warpgroup, with the warpgroups' offset (start of warpgroup 1 minus start of 0). A line
    holds the SM clock at stamps 0-4 (csrc/common/attn_wgmma.cuh): in the plain loop softmax
    start, softmax done, products issued, products done, K/V landed (between done and issued);
    shown as softmax (0->1), K/V wait (1->4), issue (4->2), products (2->3) and period (0->next 0).
    The overlapped loop's stamps mean other things (see the kernel). Then the TRACE_TILE lines:
    per tile (the traced CTA's first SAGE_WG_TRACE_TILES) the cycles from kernel entry to the tile's
    start, since the warpgroup stored its previous tile, waiting for its Q and first K, its first
    QK, the K loop (and per block), storing the output. Only the last call's lines count (each
    call prints them)."""
    stamps: dict[tuple[int, int], tuple[int, ...]] = {}
    tiles: dict[tuple[int, int], tuple[int, ...]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 12 and parts[0] == "TRACE":  # TRACE sm S wg W kb K t0 t1 t2 t3 t4
            stamps[(int(parts[4]), int(parts[6]))] = tuple(int(x) for x in parts[7:12])
        elif len(parts) == 16 and parts[0] == "TRACE_TILE":  # ... wg W it I nkb N entry E t0 .. t4
            tiles[(int(parts[6]), int(parts[4]))] = tuple(int(x) for x in [parts[8]] + parts[10:16])
    if not stamps and not tiles:
        return "no TRACE lines (build with -DSAGE_WG_TRACE=<CTA index>)\n"
    rows = _block_rows(stamps) if stamps else [
        "no TRACE lines for K blocks (fewer K blocks than SAGE_WG_TRACE_FIRST, default 8?)"]
    if tiles:
        rows.append("tile wg  blocks   from_entry  after_prev  q_k_wait  first_qk      loop  per_block     store"
                    "     total")
        for (it, wg), (nkb, entry, t0, t1, t2, t3, t4) in sorted(tiles.items()):
            loop = _clock_dt(t2, t3)
            prev = tiles.get((it - 1, wg))  # the gap since this warpgroup stored its previous tile
            after_prev = f"{_clock_dt(prev[-1], t0):>11d}" if prev else f"{'-':>11}"
            rows.append(f"{it:<4d} {wg:<3d} {nkb:>6d} {_clock_dt(entry, t0):>12d} {after_prev} "
                        f"{_clock_dt(t0, t1):>9d} {_clock_dt(t1, t2):>9d} {loop:>9d} {loop // max(nkb, 1):>10d} "
                        f"{_clock_dt(t3, t4):>9d} {_clock_dt(t0, t4):>9d}")
    return "\n".join(rows) + "\n"


def _block_rows(stamps: dict[tuple[int, int], tuple[int, ...]]) -> list[str]:
    kbs = sorted({kb for _, kb in stamps})
    wgs = sorted({wg for wg, _ in stamps})
    names = ("softmax", "kv_wait", "issue", "products", "period")
    dt = _clock_dt
    rows = ["kb  " + "  ".join(" ".join(f"wg{w}:{n:>8}" for n in names) for w in wgs) + "   offset"]
    cols: dict[str, list[int]] = collections.defaultdict(list)
    for kb in kbs:
        cells = []
        for w in wgs:
            t, nxt = stamps.get((w, kb)), stamps.get((w, kb + 1))
            if t is None:
                cells.append(" ".join(" " * 12 for _ in names))
                continue
            vals = (dt(t[0], t[1]), dt(t[1], t[4]), dt(t[4], t[2]), dt(t[2], t[3]), dt(t[0], nxt[0]) if nxt else None)
            for name, v in zip(names, vals):
                if v is not None:
                    cols[f"wg{w} {name}"].append(v)
            cells.append(" ".join(f"{v if v is not None else '-':>12}" for v in vals))
        off = ""
        if (0, kb) in stamps and (1, kb) in stamps:
            o = (stamps[(1, kb)][0] - stamps[(0, kb)][0] + (1 << 31)) % (1 << 32) - (1 << 31)
            cols["offset"].append(o)
            off = f"{o:9d}"
        rows.append(f"{kb:<3d} " + "  ".join(cells) + off)
    rows.append("median: " + ", ".join(f"{k} {sorted(v)[len(v) // 2]}" for k, v in cols.items()))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["breakdown", "drive", "aten-stats", "trace"])
    parser.add_argument("--case", action="append", required=True, metavar="BxHxNxD")
    parser.add_argument("--label", default="sm80-fp32", choices=sorted(dev.KERNELS))
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--calls", type=int, default=3, help="drive: calls per case")
    parser.add_argument("--timeout", type=float, default=120, metavar="SECONDS",
                        help="trace: the traced calls' child process is killed after this long (default 120)")
    args = parser.parse_args(argv)
    for case in args.case:
        if args.mode == "breakdown":
            breakdown(case, args.label, args.causal, args.dtype)
        elif args.mode == "aten-stats":
            aten_stats(case, args.dtype)
        elif args.mode == "trace":  # device printf reaches the C stdout: read it from a child
            cmd = [sys.executable, __file__, "drive", "--case", case, "--label", args.label, "--dtype",
                   args.dtype, "--calls", "2"] + (["--causal"] if args.causal else [])
            rc, stdout, stderr = dev.run_child(cmd, dict(os.environ), args.timeout)  # a hang is killed
            print(f"{case} {args.label} causal={args.causal} {args.dtype}: trace (rc {rc})")
            print(trace_table(stdout), end="")
            if rc:
                print(stderr[-2000:])
        else:
            import torch

            fn = _call(case, args.label, args.causal, args.dtype)
            for _ in range(args.calls):
                fn()
            torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
