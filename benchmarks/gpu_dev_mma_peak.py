"""Peak throughput of the warp-level tensor instructions the native kernels use, on this GPU.

The sm75/sm80/sm89 families are built from `mma.sync` (no `wgmma`), so their speed on a Hopper
GPU is bounded by what `mma.sync` can issue there, whatever the tiling. This measures that bound:
every warp runs 8 independent accumulator chains of one instruction shape in a loop (operands in
registers, no memory traffic), on enough warps to fill every SM, timed with CUDA events.

    python benchmarks/gpu_dev_mma_peak.py [--json FILE]

Prints TOPS (multiply-adds counted as 2 operations) per instruction shape. Needs CuPy (NVRTC).
"""
from __future__ import annotations

import argparse
import json
import sys

# name -> (PTX mma shape/types, A regs, B regs, C/D regs, C/D register type, M*N*K per instruction)
SHAPES = {
    "m16n8k16 f16 -> f32": ("m16n8k16.row.col.f32.f16.f16.f32", 4, 2, 4, "f", 16 * 8 * 16),
    "m16n8k16 f16 -> f16": ("m16n8k16.row.col.f16.f16.f16.f16", 4, 2, 2, "r", 16 * 8 * 16),
    "m16n8k32 s8 -> s32": ("m16n8k32.row.col.s32.s8.s8.s32", 4, 2, 4, "r", 16 * 8 * 32),
    "m16n8k32 e4m3 -> f32": ("m16n8k32.row.col.f32.e4m3.e4m3.f32", 4, 2, 4, "f", 16 * 8 * 32),
}
CHAINS = 8


def _source(ptx: str, na: int, nb: int, nc: int, ctype: str) -> str:
    ctype_c = "float" if ctype == "f" else "unsigned"
    d = ", ".join(f"%{i}" for i in range(nc))
    a = ", ".join(f"%{nc + i}" for i in range(na))
    b = ", ".join(f"%{nc + na + i}" for i in range(nb))
    outs = ", ".join(f'"+{ctype}"(acc[c][{i}])' for i in range(nc))
    ins = ", ".join([f'"r"(a[{i}])' for i in range(na)] + [f'"r"(b[{i}])' for i in range(nb)])
    return f"""
extern "C" __global__ void peak(int iters, {ctype_c}* sink) {{
  unsigned a[{na}], b[{nb}];
  for (int i = 0; i < {na}; ++i) a[i] = 0x3c003c00u ^ (threadIdx.x * 2654435761u + i);
  for (int i = 0; i < {nb}; ++i) b[i] = 0x3c003c00u ^ (threadIdx.x * 40503u + 7 * i);
  {ctype_c} acc[{CHAINS}][{nc}] = {{}};
  for (int it = 0; it < iters; ++it) {{
    #pragma unroll
    for (int c = 0; c < {CHAINS}; ++c)
      asm volatile("mma.sync.aligned.{ptx} {{{d}}}, {{{a}}}, {{{b}}}, {{{d}}};\\n"
                   : {outs} : {ins});
  }}
  {ctype_c} s = 0;
  for (int c = 0; c < {CHAINS}; ++c)
    for (int i = 0; i < {nc}; ++i) s += acc[c][i];
  if (s == ({ctype_c})12345) sink[threadIdx.x] = s;  // keeps the loop alive
}}
"""


def measure(iters: int = 4096, warps_per_block: int = 8, blocks_per_sm: int = 4) -> list[dict]:
    import cupy as cp

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    cap = dev.compute_capability
    rows = []
    for name, (ptx, na, nb, nc, ctype, _) in SHAPES.items():
        if "e4m3" in name and int(cap) < 89:
            continue
        kernel = cp.RawKernel(_source(ptx, na, nb, nc, ctype), "peak",
                              options=(f"--gpu-architecture=sm_{cap}",))
        sink = cp.zeros(1024, dtype=cp.float32)
        grid, block = (sms * blocks_per_sm,), (32 * warps_per_block,)
        kernel(grid, block, (cp.int32(iters), sink))  # compile + warm up
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(7):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            kernel(grid, block, (cp.int32(iters), sink))
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
        sec = sorted(times)[len(times) // 2]
        warps = grid[0] * warps_per_block
        mnk = SHAPES[name][5]
        tops = 2 * mnk * CHAINS * iters * warps / sec / 1e12
        # clocks per instruction per SM sub-partition, at the clock the run saw
        rows.append({"shape": name, "tops": tops, "seconds": sec, "sms": sms,
                     "warps": warps, "iters": iters})
        print(f"{name:24} {tops:8.0f} TOPS  ({sec * 1e3:.2f} ms, {warps} warps on {sms} SMs)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--iters", type=int, default=4096)
    args = parser.parse_args(argv)
    rows = measure(args.iters)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
