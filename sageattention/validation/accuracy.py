"""Error figures against an fp32 reference, and the accuracy bars they are judged by.

The bars are design.md's ("Accuracy bars"): INT8 QK with FP16 PV must reach cosine >= 0.9998 and
relative L1 <= 0.02; INT8 QK with FP8 PV cosine >= 0.9993 and relative L1 <= 0.04.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Bar:
    """The least cosine similarity and the most relative L1 error a result may have."""

    name: str
    min_cosine: float
    max_rel_l1: float


FP16_PV_BAR = Bar("INT8 QK + FP16 PV", min_cosine=0.9998, max_rel_l1=0.02)
FP8_PV_BAR = Bar("INT8 QK + FP8 PV", min_cosine=0.9993, max_rel_l1=0.04)


def bar_for(backend: str | None) -> Bar:
    """The bar a backend's output is held to; the PV precision is part of the backend's name."""
    if backend is not None and backend.endswith("-fp8"):
        return FP8_PV_BAR
    # FP16 PV kernels, and the SDPA fallback (which is more accurate than any quantized path).
    return FP16_PV_BAR


@dataclass(frozen=True)
class Errors:
    """Error figures of one output against its reference (both compared in fp32)."""

    cosine: float
    rel_l1: float
    max_abs: float
    finite: bool

    def within(self, bar: Bar) -> bool:
        return self.finite and self.cosine >= bar.min_cosine and self.rel_l1 <= bar.max_rel_l1

    def as_dict(self) -> dict:
        """JSON-safe: a figure that is not finite (from a NaN output) becomes None."""
        return {"cosine": _finite_or_none(self.cosine), "rel_l1": _finite_or_none(self.rel_l1),
                "max_abs": _finite_or_none(self.max_abs), "finite": self.finite}

    @classmethod
    def from_dict(cls, stored: dict) -> Errors:
        """as_dict's inverse, for stored results: a missing or None figure reads as NaN (within no
        bar), and a result without the "finite" flag is finite when all three figures are numbers."""
        figures = [stored.get(name) for name in ("cosine", "rel_l1", "max_abs")]
        numbers = [isinstance(x, (int, float)) for x in figures]
        return cls(*(x if ok else float("nan") for x, ok in zip(figures, numbers)),
                   finite=bool(stored.get("finite", all(numbers))))


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def errors(out: torch.Tensor, ref: torch.Tensor) -> Errors:
    """Cosine similarity, relative L1 (sum|o - r| / sum|r|) and max |o - r| over all elements.

    Summed in float64: the bars sit within 1e-4 of 1 and fp32 sums over millions of elements are
    not that exact (on the CPU, torch's fp32 norm of 2M elements was 3e-5 off, which moved an FP8
    cosine by 6e-5).
    """
    if out.shape != ref.shape:
        raise ValueError(f"output shape {tuple(out.shape)} differs from reference shape "
                         f"{tuple(ref.shape)}")
    o = out.detach().to(device=ref.device, dtype=torch.float64).flatten()
    r = ref.detach().to(torch.float64).flatten()
    # finite: the figures are numbers. A NaN or Inf in the reference would make them NaN too
    # (within no bar, but reported as finite and without figures); it counts as not finite.
    finite = bool(torch.isfinite(o).all()) and bool(torch.isfinite(r).all())
    if not finite:
        return Errors(cosine=float("nan"), rel_l1=float("inf"), max_abs=float("inf"), finite=False)
    diff = (o - r).abs()
    denom = r.abs().sum().clamp_min(1e-30)
    norms = (o.norm() * r.norm()).clamp_min(1e-30)
    return Errors(
        cosine=float((o * r).sum() / norms),
        rel_l1=float(diff.sum() / denom),
        max_abs=float(diff.max()) if diff.numel() else 0.0,
        finite=True,
    )


def worst(items: list[Errors]) -> Errors | None:
    """The worst of each figure over several comparisons (None when there were none)."""
    if not items:
        return None
    return Errors(
        cosine=min(e.cosine for e in items) if all(e.finite for e in items) else float("nan"),
        rel_l1=max(e.rel_l1 for e in items),
        max_abs=max(e.max_abs for e in items),
        finite=all(e.finite for e in items),
    )
