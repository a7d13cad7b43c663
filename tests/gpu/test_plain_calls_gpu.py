"""Kept call signatures on a GPU (core._plain_calls): repeats of a keyword-free call run on every
backend with that call's own values, and neither the grad mode nor forcing is kept with them.
tests/unit/test_plain_calls.py checks the same rules on the CPU path.

Skipped with a reason where there is no GPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa
from sageattention import backends

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _inputs(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(1, 4, 300, 64, device="cuda", dtype=torch.float16, generator=g) for _ in range(3)]


def _cosine(out, q, k, v) -> float:
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    return F.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0).item()


def _runnable(q, k, v) -> list[str]:
    names = []
    for name in backends.BACKEND_NAMES:
        with sa.force_backend(name):
            try:
                sa.select_backend(q, k, v)
            except sa.BackendUnavailableError:
                continue
        names.append(name)
    return names


def test_a_repeated_signature_runs_each_call_with_its_own_values():
    first, second = _inputs(1), _inputs(2)
    names = _runnable(*first)
    assert "sdpa" in names
    for name in names:
        with sa.force_backend(name):
            for q, k, v in (first, second, first):
                out = sa.sageattn(q, k, v)
                assert sa.last_backend() == name
                # loose enough for the FP8 P.V paths; another call's values would give about 0
                assert _cosine(out, q, k, v) >= 0.999, name


def test_grad_mode_and_forcing_are_decided_per_call():
    q, k, v = _inputs(3)
    native = [name for name in _runnable(q, k, v) if name != "sdpa"]
    if not native:
        pytest.skip("no quantized backend of this build runs on this GPU")
    q_grad = q.clone().requires_grad_()
    with sa.force_backend(native[0]):
        sa.sageattn(q, k, v)
        with pytest.raises(sa.BackendUnavailableError):
            sa.sageattn(q_grad, k, v)  # grad needs SDPA, whatever the kept grad-free signature says
        with torch.no_grad():
            assert not sa.sageattn(q_grad, k, v).requires_grad
            assert sa.last_backend() == native[0]
    out = sa.sageattn(q_grad, k, v)
    assert out.requires_grad and sa.last_backend() == "sdpa"
    assert _cosine(out.detach(), q, k, v) >= 0.99999
