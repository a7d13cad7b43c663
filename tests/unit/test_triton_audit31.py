"""Triton backend audit (2026-12-07, second pass): defects found and fixed.

* An ``attn_mask`` passed as an expanded view (``mask.expand(B, H, Nq, Nk)`` of a ``[Nk]`` padding
  mask or an ``[Nq, Nk]`` bias: zero strides) was handled at its broadcast size on the host: the
  block map padded and reshaped it (a ``B * H * Nq * Nk`` bool copy), a float mask's NaN check and
  ``!= -inf`` made full-size temporaries, and a float64 one was copied to full-size float32, which
  the kernel then read. At 1x32x8192x8192 that is 2 GiB for a bool mask (several for a float one)
  where the same mask passed unexpanded costs 8 KiB. ``prepare_mask`` now narrows every zero-stride
  dim to size 1 first (the same mask under broadcasting).

Host-side checks run in this process (no kernel); the end-to-end equality runs the kernels in a
``TRITON_INTERPRET=1`` subprocess (this file with ``--worker``, see ``interpreter_worker.py``).
"""

from __future__ import annotations

import json
import math
import sys

import pytest
from interpreter_worker import run_worker

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

COS_MIN = 0.9998


def _masks(gen, nq, nk):
    """name -> (mask as given, the same mask at its real size)."""
    pad = torch.rand(nk, generator=gen) > 0.3
    bias = torch.randn(nq, nk, generator=gen)
    bias[torch.rand(nq, nk, generator=gen) > 0.7] = -math.inf
    bias[3] = -math.inf   # a query row with no visible key
    per_batch = torch.rand(2, 1, 1, nk, generator=gen) > 0.4
    return {
        "bool_nk": (pad, pad),
        "float32_nq_nk": (bias, bias),
        "float64_nq_nk": (bias.double(), bias.double()),   # the clamped-copy path
        "bool_b_1_1_nk": (per_batch, per_batch),
        "float16_heads": (bias.half()[None], bias.half()[None]),
    }


# ----------------------------------------------------------------------------------------------
# Worker: runs inside the TRITON_INTERPRET=1 subprocess.
# ----------------------------------------------------------------------------------------------

def _reference(q, k, v, mask, scale):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(torch.isneginf(lse)[..., None], 0.0, torch.softmax(s, dim=-1))
    return p @ v.double(), lse


def _worker() -> dict:
    from sageattention import triton as st

    gen = torch.Generator().manual_seed(31)
    b, h, nq, nk, d = 2, 2, 70, 130, 32
    q = torch.randn(b, h, nq, d, generator=gen).half()
    k = (torch.randn(b, h, nk, d, generator=gen) + 1.0).half()
    v = torch.randn(b, h, nk, d, generator=gen).half()
    res: dict = {}
    for name, (mask, _) in _masks(gen, nq, nk).items():
        full = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(b, h, nq, nk)
        got, got_lse = st.attention(q, k, v, attn_mask=full, return_lse=True)
        want, want_lse = st.attention(q, k, v, attn_mask=mask, return_lse=True)
        ref, ref_lse = _reference(q, k, v, full, d ** -0.5)
        res[name] = {
            "same_as_unexpanded": bool(torch.equal(got, want)) and bool(torch.equal(got_lse, want_lse)),
            "finite": bool(torch.isfinite(got).all()),
            "cos": torch.nn.functional.cosine_similarity(got.double().flatten(), ref.flatten(),
                                                         dim=0).item(),
            "lse_neginf_rows_agree": bool(torch.equal(torch.isneginf(got_lse), torch.isneginf(ref_lse))),
        }
    return res


# ----------------------------------------------------------------------------------------------
# Tests (parent process).
# ----------------------------------------------------------------------------------------------

class _LargestAllocation(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the largest storage (bytes) any op under it returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


TARGET = (2, 8, 300, 1000)   # 4.8 M (query, key) pairs: 4.8 MB as bool


@pytest.mark.parametrize("name", ["bool_nk", "float32_nq_nk", "float64_nq_nk", "bool_b_1_1_nk",
                                  "float16_heads"])
def test_expanded_mask_is_not_materialised_on_the_host(name):
    from sageattention.triton.mask import prepare_mask

    mask, real = _masks(torch.Generator().manual_seed(1), TARGET[2], TARGET[3])[name]
    expanded = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).expand(TARGET)
    with _LargestAllocation() as small:
        kind, view, bmap = prepare_mask(real, *TARGET, 128, 64)
    with _LargestAllocation() as seen:
        kind_e, view_e, bmap_e = prepare_mask(expanded, *TARGET, 128, 64)
    # Before: the block map's pad/reshape (and a float mask's checks) worked on all 4.8 M pairs.
    assert seen.largest <= max(small.largest, 1), (name, seen.largest, small.largest)
    assert kind_e == kind and view_e.dtype == view.dtype
    assert torch.equal(view_e, view) and torch.equal(bmap_e, bmap)


def test_nan_behind_an_expanded_view_is_still_refused():
    from sageattention.triton.mask import prepare_mask

    m = torch.zeros(1, 1000)
    m[0, 7] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        prepare_mask(m.expand(TARGET), *TARGET, 128, 64)


@pytest.fixture(scope="module")
def interp():
    return run_worker(__file__, timeout=600)


@pytest.mark.parametrize("name", ["bool_nk", "float32_nq_nk", "float64_nq_nk", "bool_b_1_1_nk",
                                  "float16_heads"])
def test_expanded_mask_gives_the_unexpanded_result(interp, name):
    r = interp[name]
    assert r["same_as_unexpanded"], r
    assert r["finite"] and r["lse_neginf_rows_agree"], r
    assert r["cos"] >= COS_MIN, r


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(_worker()))
