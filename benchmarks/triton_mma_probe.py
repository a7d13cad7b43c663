"""Which tensor-core instructions Triton emits for an INT8-QK / FP16-PV attention loop, per GPU target.

design.md's "upstream 1.0.6 Triton" column (issue #4's bar for the sm80 family) was measured on an
H200. This compiles a loop of that shape (INT8 Q.K^T, exp2, P.V in fp16 with each 64-key block
accumulated in fp16 and added into fp32; 128 query rows; 4 warps at d=64, 8 at d=128) with the
installed Triton for each target and prints the distinct MMA instructions in its PTX: `wgmma` is
Hopper's warpgroup MMA, `mma.sync` the Ampere-era warp MMA that the sm80 family is written with,
`tcgen05.mma` Blackwell's.
No GPU is needed: Triton compiles for a named target.

`--no-wgmma` compiles with Triton's `DISABLE_MMA_V3=1`, which makes it emit `mma.sync` for sm_90
too (the variable is part of Triton's cache key, so cached kernels do not mix). A GPU process run
with it times a Triton kernel on the warp MMA that the sm80 family uses, on the same card: the
like-for-like bar that #4's column is not on an H200.

    python benchmarks/triton_mma_probe.py [--arch 90 80 86 89] [--head-dim 64 128] [--no-wgmma]
"""
from __future__ import annotations

import argparse
import os
import sys
from unittest import mock

# PTX opcodes of the tensor-core MMA families (a predicate such as "@%p9" may come first)
MMA_OPCODES = ("mma.sync", "wgmma.mma_async", "tcgen05.mma")


def build_loop():
    import triton
    import triton.language as tl

    @triton.jit
    def attention_loop(Q, K, V, Out, n_keys, D: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
        rows = tl.arange(0, BLOCK_M)
        keys = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, D)
        q = tl.load(Q + rows[:, None] * D + dims[None, :])
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        row_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
        for start in range(0, n_keys, BLOCK_N):
            k = tl.load(K + (start + keys)[None, :] * D + dims[:, None])
            scores = tl.dot(q, k).to(tl.float32)
            new_max = tl.maximum(row_max, tl.max(scores, 1))
            p = tl.math.exp2(scores - new_max[:, None])
            acc = acc * tl.math.exp2(row_max - new_max)[:, None]
            v = tl.load(V + (start + keys)[:, None] * D + dims[None, :])
            acc += tl.dot(p.to(tl.float16), v, out_dtype=tl.float16)
            row_max = new_max
        tl.store(Out + rows[:, None] * D + dims[None, :], acc.to(tl.float16))

    return attention_loop


def mma_instructions(arch: int, head_dim: int, wgmma: bool = True) -> tuple[list[str], int]:
    """The distinct MMA opcodes in the loop's PTX for sm_<arch>, and the warps it was built with;
    wgmma=False compiles with DISABLE_MMA_V3=1 (Triton without its Hopper MMA lowering)."""
    if not wgmma:
        with mock.patch.dict(os.environ, {"DISABLE_MMA_V3": "1"}):
            return mma_instructions(arch, head_dim)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    warps = 4 if head_dim == 64 else 8
    source = ASTSource(
        fn=build_loop(),
        signature={"Q": "*i8", "K": "*i8", "V": "*fp16", "Out": "*fp16", "n_keys": "i32",
                   "D": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"},
        constexprs={"D": head_dim, "BLOCK_M": 128, "BLOCK_N": 64})
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": warps, "num_stages": 3})
    return sorted(mma_opcodes(compiled.asm["ptx"])), warps


def mma_opcodes(ptx: str) -> set[str]:
    """The distinct MMA opcodes in PTX text, predicated instructions included."""
    opcodes = set()
    for line in ptx.splitlines():
        words = line.split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words and words[0].startswith(MMA_OPCODES):
            opcodes.add(words[0])
    return opcodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Prints one line per target and head dim. Exit status: "
                                     "0 every target compiled; 2 Triton missing, bad arguments, or "
                                     "a target Triton cannot compile the loop for.")
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80, 86, 89],
                        help="compute capabilities as integers, e.g. 90 for sm_90 (default: 90 80 86 89)")
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128], choices=[64, 128])
    parser.add_argument("--no-wgmma", action="store_true",
                        help="compile with DISABLE_MMA_V3=1 (warp MMA only)")
    args = parser.parse_args(argv)
    if min(args.arch) < 80:  # Triton's MLIR passes would fail, after pages of IR on stderr
        parser.error(f"--arch {min(args.arch)}: the loop's int8 tl.dot needs sm_80 or newer "
                     "(give 80, 86, 89, 90, 100, ...)")
    try:
        import triton
    except ImportError:
        print("error: Triton is not installed (pip install triton, or a torch that brings it)",
              file=sys.stderr)
        return 2
    print(f"Triton {triton.__version__}" + (", DISABLE_MMA_V3=1" if args.no_wgmma else ""))
    for arch in args.arch:
        for head_dim in args.head_dim:
            try:
                opcodes, warps = mma_instructions(arch, head_dim, wgmma=not args.no_wgmma)
            except Exception as error:  # Triton's refusals are RuntimeErrors and others
                reason = (str(error).strip().splitlines() or [type(error).__name__])[-1]
                print(f"error: Triton {triton.__version__} cannot compile the loop for sm_{arch} "
                      f"d={head_dim}: {reason}", file=sys.stderr)
                return 2
            print(f"sm_{arch} d={head_dim} ({warps} warps): {', '.join(opcodes) or 'no MMA'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
