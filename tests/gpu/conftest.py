"""Fixtures shared by the GPU test files."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def sm75_ops():
    """torch.ops.sageattention_sm75, or a skip that names why it is not there."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from sageattention.native import sm75
    try:
        sm75.load()
    except ImportError as exc:
        pytest.skip(f"sm75 family not in this installation: {exc}")
    return torch.ops.sageattention_sm75
