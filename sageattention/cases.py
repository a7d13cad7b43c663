"""One benchmark case (dtype, b, h, n, d, causal, and the key length where it differs from n):
shared by the benchmark, the calibration tables and the dispatcher without importing the benchmark
itself."""

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
    # Keys per sequence where they differ from the queries' seq_len (cross-attention, decoding
    # against a cache); None for self-attention. A kv_len equal to seq_len is stored as None, so one
    # shape has one name.
    kv_len: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for field in ("batch", "heads", "seq_len", "head_dim"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be at least 1, got {getattr(self, field)}")
        if self.kv_len is not None and self.kv_len < 1:
            raise ValueError(f"kv_len must be at least 1 (or None: as seq_len), got {self.kv_len}")
        if self.kv_len == self.seq_len:
            object.__setattr__(self, "kv_len", None)

    @property
    def keys(self) -> int:
        """Keys per sequence."""
        return self.seq_len if self.kv_len is None else self.kv_len

    @property
    def name(self) -> str:
        kind = "causal" if self.causal else "non-causal"
        tokens = str(self.seq_len) if self.kv_len is None else f"{self.seq_len}/{self.kv_len}"
        return f"{self.dtype} {self.batch}x{self.heads}x{tokens}x{self.head_dim} {kind}"

    @property
    def flops(self) -> float:
        """4 * b * h * (query, key) pairs computed * d. Causal self-attention counts n*n/2 pairs
        (design.md's TOPS); causal with other key counts, the pairs SDPA's top-left mask keeps."""
        if not self.causal:
            pairs = self.seq_len * self.keys
        elif self.kv_len is None:
            pairs = self.seq_len * self.seq_len / 2
        else:   # query i sees keys 0..i
            n, m = self.seq_len, self.kv_len
            seen = min(n, m)
            pairs = seen * (seen + 1) / 2 + (n - seen) * m
        return 4.0 * self.batch * self.heads * pairs * self.head_dim
