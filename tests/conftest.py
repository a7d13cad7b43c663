"""Shared fixtures only."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, so its tolerances hold run after run."""
    torch.manual_seed(0)


@pytest.fixture
def attn_metrics():
    """(cosine similarity, relative L1) of an output against a reference, both in float64."""

    def metrics(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
        o, r = out.double().flatten(), ref.double().flatten()
        cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
        rel_l1 = ((o - r).abs().sum() / r.abs().sum()).item()
        return cos, rel_l1

    return metrics
