"""The WS kernel's SAGE_WG_LAZY_RESCALE rule, emulated on the CPU: does O / l stay the same?

    PYTHONPATH=. python benchmarks/lazy_rescale_emulation.py [--threshold 8] [--block 128]

A base-2 online softmax over key blocks, in float32 with P rounded to fp16 as the 16-bit P.V
paths do, on a 64 x 4096 score tile whose maximum drifts upwards (the case where the running
maximum moves most), against the exact softmax in float64. Rows: the rule off (the maximum moves
whenever a block passes it), threshold 0 (the same), and the threshold (it moves only when a
block passes it by more than 2^threshold). Printed per row: cosine and largest error against the
exact output, the largest P, and how many blocks rescaled some row of O.
"""

from __future__ import annotations

import argparse
import sys

import torch


def online_softmax(s: torch.Tensor, v: torch.Tensor, threshold: float | None, block: int):
    rows, n = s.shape
    m = torch.full((rows,), -float("inf"))
    row_sum = torch.zeros(rows)
    o = torch.zeros(rows, v.shape[1])
    p_max, rescaled = 0.0, 0
    for j in range(0, n, block):
        sb = s[:, j:j + block]
        mx = sb.amax(-1)
        m_new = torch.maximum(m, mx)
        if threshold is not None:
            m_new = torch.where(mx <= m + threshold, m, m_new)
        m_use = torch.where(m_new == -float("inf"), torch.zeros_like(m_new), m_new)
        alpha = torch.exp2(m - m_use)
        rescaled += int((alpha != 1).any())
        p = torch.exp2(sb - m_use[:, None]).half().float()
        p_max = max(p_max, p.max().item())
        row_sum = row_sum * alpha + p.sum(-1)
        o = o * alpha[:, None] + p @ v[j:j + block]
        m = m_new
    return o / row_sum[:, None], p_max, rescaled


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--threshold", type=float, default=8.0, help="powers of two (default 8)")
    ap.add_argument("--block", type=int, default=128, help="keys per block (default 128)")
    args = ap.parse_args(argv)
    if args.block < 1 or args.threshold < 0:
        ap.error("--block must be at least 1 and --threshold at least 0")
    torch.manual_seed(0)
    s = torch.randn(64, 4096) * 3 + torch.linspace(0, 6, 4096)  # log2 units; the maximum drifts
    v = torch.randn(4096, 128)
    exact = (torch.softmax(s.double() * torch.log(torch.tensor(2.0, dtype=torch.float64)), -1) @ v.double()).float()
    print(f"# {' '.join(['python', *sys.argv])}")
    print(f"# scores 64 x 4096 (N(0, 9) plus a ramp 0..6), V 4096 x 128 N(0, 1), {args.block}-key blocks")
    for name, threshold in (("rule off", None), ("threshold 0", 0.0), (f"threshold {args.threshold:g}", args.threshold)):
        out, p_max, rescaled = online_softmax(s, v, threshold, args.block)
        cos = torch.nn.functional.cosine_similarity(out.flatten().double(), exact.flatten().double(), 0).item()
        print(f"{name:14s} cosine {cos:.8f}  max |error| {(out - exact).abs().max().item():.2e}  "
              f"max P {p_max:7.1f}  blocks that rescaled {rescaled} of {-(-4096 // args.block)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
