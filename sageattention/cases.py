"""One benchmark case (dtype, b, h, n, d, causal): shared by the benchmark, the calibration tables
and the dispatcher without importing the benchmark itself."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    dtype: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for field in ("batch", "heads", "seq_len", "head_dim"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be at least 1, got {getattr(self, field)}")

    @property
    def name(self) -> str:
        kind = "causal" if self.causal else "non-causal"
        return f"{self.dtype} {self.batch}x{self.heads}x{self.seq_len}x{self.head_dim} {kind}"

    @property
    def flops(self) -> float:
        full = 4.0 * self.batch * self.heads * self.seq_len * self.seq_len * self.head_dim
        return full / 2 if self.causal else full
