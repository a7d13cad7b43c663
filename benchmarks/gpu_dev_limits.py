"""Which backends compute the right answer at the edges of the launch grid and of 32-bit indexing.

Each (backend, case) runs in a child process, so an illegal memory access or a crash cannot end
the survey, and prints one line: OK with the worst cosine against fp32 SDPA on checked slices,
WRONG (same, below the bar), RAISED with the first line of the error, or the child's exit status.
"auto" is `sageattn` with no backend forced (what a user gets), "auto-static" the same without the
calibration table (SAGEATTENTION_CALIBRATION=off: the static order, native kernels first). The FP8
P.V bar is the recipe's measured floor (cosine 0.9992; docs/kernels.md, Known limits). Run on a GPU with the wheel
installed:

    python benchmarks/gpu_dev_limits.py                 # every backend, every case
    python benchmarks/gpu_dev_limits.py --backend cuda-sm90-fp16 --case big_hnd

Cases: batch and heads past CUDA's 65535 limit on grid dims y/z, and q/k/v with more than 2**31
elements (an int32 offset overflows there) in HND and NHD layout.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys

# name: (batch, q heads, kv heads, tokens, head dim, layout, heads or batch rows to check)
CASES = {
    "batch70000": (70000, 1, 1, 8, 64, "HND", "batch"),
    "heads70000": (1, 70000, 70000, 8, 64, "HND", "heads"),
    "mqa_heads70000": (1, 70000, 1, 8, 64, "HND", "heads"),
    "big_hnd": (1, 16448, 16448, 1024, 128, "HND", "heads"),   # 2.16e9 elements per tensor
    "big_nhd": (1, 16448, 16448, 1024, 128, "NHD", "heads"),
    "big_batch": (16448, 1, 1, 1024, 128, "HND", "batch"),
}
BACKENDS = ("auto", "auto-static", "cuda-sm90-fp16", "cuda-sm90-fp8", "cuda-sm89-fp8", "cuda-sm80-fp16",
            "cuda-sm75-fp16", "triton-fp16", "triton-fp8")
CHILD = r"""
import sys, contextlib, torch, torch.nn.functional as F
import sageattention as sa
backend, B, HQ, HKV, N, D, layout, axis = sys.argv[1:]
B, HQ, HKV, N, D = map(int, (B, HQ, HKV, N, D))
g = torch.Generator(device="cuda").manual_seed(0)
shape = lambda h: (B, h, N, D) if layout == "HND" else (B, N, h, D)
q = torch.randn(shape(HQ), device="cuda", dtype=torch.float16, generator=g)
k = torch.randn(shape(HKV), device="cuda", dtype=torch.float16, generator=g)
v = torch.randn(shape(HKV), device="cuda", dtype=torch.float16, generator=g)
ctx = contextlib.nullcontext() if backend.startswith("auto") else sa.force_backend(backend)
try:
    with ctx:
        o = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=False)
    torch.cuda.synchronize()
except Exception as exc:
    print("RAISED", type(exc).__name__, str(exc).splitlines()[0][:200]); sys.exit(0)
ran = sa.last_backend()
hnd = lambda t: t if layout == "HND" else t.transpose(1, 2)
qh, kh, vh, oh = map(hnd, (q, k, v, o))
total = B if axis == "batch" else HQ
worst = 1.0
for lo in (0, total // 2, total - 4):     # first, middle and last rows of the big axis
    sl = slice(lo, lo + 4)
    if axis == "batch":
        qs, ks, vs, os_ = qh[sl], kh[sl], vh[sl], oh[sl]
    else:
        idx = torch.arange(lo, lo + 4, device="cuda") // (HQ // HKV)   # each q head's kv head
        qs, os_ = qh[:, sl], oh[:, sl]
        ks, vs = kh.index_select(1, idx), vh.index_select(1, idx)
    ref = F.scaled_dot_product_attention(qs.float(), ks.float(), vs.float())
    cos = F.cosine_similarity(os_.float().flatten(), ref.flatten(), dim=0).item()
    finite = bool(torch.isfinite(os_).all())
    worst = min(worst, cos if finite else -1.0)
bar = 0.9992 if "fp8" in (ran or "") else 0.9998
print("OK" if worst >= bar else "WRONG", f"ran={ran} worst_cosine={worst:.6f} bar={bar}")
"""


def run_one(backend: str, case: str, timeout: int) -> str:
    args = [str(x) for x in CASES[case]]
    try:
        env = dict(os.environ, SAGEATTENTION_CALIBRATION="off") if backend == "auto-static" else None
        res = subprocess.run([sys.executable, "-c", CHILD, backend, *args], capture_output=True,
                             text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return f"{backend:16} {case:15} TIMEOUT after {timeout} s"
    said = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr.strip()[-300:]
    status = "" if res.returncode == 0 else f"exit {res.returncode}: "
    return f"{backend:16} {case:15} {status}{said}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", action="append", choices=BACKENDS, help="default: all")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    parser.add_argument("--jobs", type=int, default=3, help="children at once (default 3)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per child (default 120)")
    args = parser.parse_args(argv)
    pairs = [(b, c) for c in (args.case or CASES) for b in (args.backend or BACKENDS)]
    bad = 0
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for line in pool.map(lambda bc: run_one(*bc, args.timeout), pairs):
            print(line, flush=True)
            bad += not (" OK " in f" {line} " or " RAISED " in f" {line} ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
