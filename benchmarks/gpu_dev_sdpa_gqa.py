"""Where PyTorch SDPA with enable_gqa=True gives a wrong answer, per SDPA backend.

Found by benchmarks/gpu_dev_limits.py on the H200 (torch 2.11): sageattn's SDPA fallback with 70000
query heads and one kv head returned an output with cosine 0 against the reference. This compares,
for GQA shapes around CUDA's 65535 grid limit, each SDPA backend with enable_gqa=True against the
same call on K/V expanded to the query heads (and against fp32 math on a few heads). Run on a GPU:

    python benchmarks/gpu_dev_sdpa_gqa.py
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# (batch, q heads, kv heads, tokens, head dim)
SHAPES = [(1, 70000, 1, 8, 64), (1, 70000, 7, 8, 64), (1, 65535, 1, 8, 64), (1, 65536, 1, 8, 64),
          (1, 65536, 2, 8, 64), (1, 32768, 1, 8, 64), (1, 1024, 1, 8, 64), (70000, 2, 1, 8, 64),
          (1, 70000, 70000, 8, 64)]
BACKENDS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def cosine(a, b) -> float:
    return F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    wrong = 0
    for b, hq, hkv, n, d in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, hq, n, d, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(b, hkv, n, d, device="cuda", dtype=torch.float16, generator=g)
        idx = torch.arange(hq, device="cuda") // (hq // hkv)
        last = slice(hq - 4, hq)   # the last heads, past any 16-bit head index
        ref = F.scaled_dot_product_attention(q[:, last].float(), k[:, idx[last]].float(), v[:, idx[last]].float())
        line = [f"{b}x{hq}/{hkv}x{n}x{d}"]
        for name, kind in BACKENDS.items():
            try:
                with (sdpa_kernel([kind]) if kind is not None else torch.no_grad()):
                    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
                torch.cuda.synchronize()
                c = cosine(out[:, last], ref)
                wrong += c < 0.999
                line.append(f"{name}={c:.4f}")
            except Exception as exc:   # a backend that refuses the shape says so
                line.append(f"{name}=refused({type(exc).__name__}: {str(exc).splitlines()[0][:60]})")
        print("  ".join(line), flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
