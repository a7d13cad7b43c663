"""A/B of the Triton attention kernel between this checkout and another commit's copy, in one
process on the GPU runner (kernel developers' tool).

    git archive OLD sageattention/triton | tar -x -C DIR   # on the build host
    python benchmarks/gpu_dev_triton_ab.py --other DIR/sageattention/triton --label OLD

Times `run_attention` of both copies on the same inputs, interleaved (A, B, A, B, ...), median of
triton.testing.do_bench per round, and prints TOPS per round and the medians.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load_package(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py",
                                                 submodule_search_locations=[str(path)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)
    return importlib.import_module(f"{name}.attn")


def _call(module, q, k, v, causal):
    return lambda: module.run_attention(q, k, v, is_causal=causal, attn_mask=None,
                                        sm_scale=q.shape[-1] ** -0.5, smooth_k=True, return_lse=False)


def _sdpa(q, k, v, causal):
    import torch

    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", required=True, type=Path, help="another sageattention/triton folder")
    parser.add_argument("--label", default="other")
    parser.add_argument("--case", action="append", metavar="DTYPE:BxHxNxD:causal|full",
                        help="default: fp16 and bf16 8x32x1024x128 causal, fp16 8x32x1024x128 full, "
                             "fp16 4x32x4096x128 causal")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import torch
    from triton.testing import do_bench

    from sageattention.triton import attn as ours
    other = _load_package(args.other.resolve(), "sage_triton_other")
    cases = args.case or ["fp16:8x32x1024x128:causal", "bf16:8x32x1024x128:causal",
                          "fp16:8x32x1024x128:full", "fp16:4x32x4096x128:causal"]
    print(f"A = this checkout, B = {args.label} ({args.other})")
    for spec in cases:
        dt, shape, mode = spec.split(":")
        b, h, n, d = (int(x) for x in shape.split("x"))
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        causal = mode == "causal"
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=g, device="cuda", dtype=dtype) for _ in range(3))
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        fns = {"A": _call(ours, q, k, v, causal), "B": _call(other, q, k, v, causal),
               "sdpa": _sdpa(q, k, v, causal)}
        oa, ob = fns["A"]()[0], fns["B"]()[0]
        same = bool(torch.equal(oa, ob))
        tops: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                tops[name].append(flops / do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e9)
        line = "  ".join(f"{name} {statistics.median(v):6.0f} ({' '.join(f'{x:.0f}' for x in v)})"
                         for name, v in tops.items())
        print(f"{spec:28} outputs equal: {same}  TOPS {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
