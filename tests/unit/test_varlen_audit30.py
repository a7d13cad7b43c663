"""sageattn_varlen audit (Triton varlen kernel, its quantization, the public wrapper's glue to it),
run under Triton's CPU interpreter in a subprocess (interpreter_worker.py); shapes are tiny.

* End to end through ``sageattn_varlen`` with the dispatcher choosing ``triton-fp16`` (as on a GPU):
  GQA, causal with per-sequence q and k lengths differing both ways (top-left, as SDPA's
  ``is_causal``), empty sequences on either side, one-token sequences, lengths on and off the
  64/128 tile edges, padded head dims, fp16 and bf16, int64 / CPU / non-contiguous offsets, an
  upper-bound ``max_seqlen``, ``scale=``/negative ``sm_scale``, ``smooth_k=False``, and inputs that
  are views into NaN-filled buffers (nothing outside the packed rows and head dim is read). Each
  compares with a float64 per-sequence softmax attention.
* ``segment_mean`` (smooth_k's per-sequence K mean) walked each sequence with absolute int32
  token positions, which wrapped past 2**31 - 1 for a sequence ending near the int32 edge
  (negative rows summed in); it now walks positions within the sequence, in int64.
"""

from __future__ import annotations

import json
import sys

import pytest
from interpreter_worker import run_worker
from test_varlen_audit import reference  # the float64 per-sequence attention

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

COS_MIN = 0.9998


# ----------------------------------------------------------------------------------------------
# Worker: runs inside the TRITON_INTERPRET=1 subprocess.
# ----------------------------------------------------------------------------------------------

def _offsets(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _in_nan_buffer(t):
    """t as a view into a larger NaN-filled buffer: rows before and after, and head-dim columns past
    its own, are NaN (a read of any of them would show in the output)."""
    buf = torch.full((t.shape[0] + 4, t.shape[1], t.shape[2] + 24), float("nan"), dtype=t.dtype)
    buf[2:-2, :, :t.shape[2]] = t
    return buf[2:-2, :, :t.shape[2]]


E2E = {
    # name: (lens_q, lens_k, hq, hkv, d, dtype, causal, extra keywords)
    "gqa_causal_q_shorter": ([5, 30], [9, 65], 4, 2, 64, "float16", True, {}),
    "gqa_causal_q_longer": ([20, 70], [3, 10], 6, 3, 64, "float16", True, {}),
    "empty_sequences": ([0, 3, 0, 4, 2], [2, 0, 0, 5, 1], 4, 2, 32, "bfloat16", False, {}),
    "empty_sequences_causal": ([0, 3, 0, 4, 2], [2, 0, 0, 5, 1], 4, 2, 32, "bfloat16", True, {}),
    "one_token_each": ([1, 1, 1], [1, 1, 1], 2, 1, 128, "float16", True, {}),
    "tile_edges_causal": ([128, 129, 64, 65], [129, 128, 65, 64], 2, 1, 64, "float16", True, {}),
    "tile_edges_full": ([128, 129, 64, 65], [129, 128, 65, 64], 2, 2, 128, "bfloat16", False, {}),
    "head_dim_40_scale_kw": ([7, 20], [7, 33], 2, 1, 40, "float16", False, {"scale": 0.3}),
    "head_dim_96_no_smoothing": ([7, 70], [9, 65], 2, 2, 96, "float16", True, {"smooth_k": False}),
    "negative_sm_scale": ([5, 40], [9, 65], 4, 2, 64, "bfloat16", False, {"sm_scale": -0.2}),
    "int64_offsets": ([5, 40], [9, 65], 4, 2, 64, "float16", True, {"offsets": "int64"}),
    "strided_offsets": ([5, 40], [9, 65], 4, 2, 64, "float16", True, {"offsets": "strided"}),
    "max_seqlen_upper_bound": ([5, 40], [9, 65], 2, 1, 64, "float16", True, {"extra_max": 10**9}),
    "nan_buffer_views_d40": ([7, 70], [9, 65], 2, 1, 40, "float16", True, {"nan_buffer": True}),
    "nan_buffer_views_d64": ([7, 70], [9, 65], 2, 1, 64, "bfloat16", False, {"nan_buffer": True}),
}


def _e2e(res: dict) -> None:
    import sageattention as sa
    from sageattention import dispatch
    from sageattention.dispatch import BackendChoice

    dispatch.choose = lambda *a, **kw: BackendChoice("triton-fp16", "test: as on a GPU", False)
    gen = torch.Generator().manual_seed(30)
    for name, (lens_q, lens_k, hq, hkv, d, dtype, causal, extra) in E2E.items():
        extra = dict(extra)
        dtype = getattr(torch, dtype)
        cq, ck = _offsets(lens_q), _offsets(lens_k)
        q = torch.randn(cq[-1], hq, d, generator=gen).to(dtype)
        # a different K offset per sequence: smoothing across sequences would not cancel
        k = torch.cat([torch.randn(n, hkv, d, generator=gen) + 2.0 * i for i, n in enumerate(lens_k)])
        k = k.to(dtype)
        v = torch.randn(ck[-1], hkv, d, generator=gen).to(dtype)
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32) for c in (cq, ck))
        kind = extra.pop("offsets", None)
        if kind == "int64":
            cu_q, cu_k = cu_q.long(), cu_k.long()
        elif kind == "strided":
            cu_q, cu_k = (torch.stack([c * 7, c], 1)[:, 1] for c in (cu_q, cu_k))
        if extra.pop("nan_buffer", False):
            q, k, v = (_in_nan_buffer(t) for t in (q, k, v))
        more = extra.pop("extra_max", 0)
        out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens_q) + more, max(lens_k) + more,
                                 is_causal=causal, **extra)
        scale = extra.get("sm_scale", extra.get("scale", d ** -0.5))
        ref = reference(q, k, v, torch.tensor(cq), torch.tensor(ck), causal, scale)
        got = out.double()
        no_keys = [i for i in range(len(lens_q)) if lens_k[i] == 0 and lens_q[i] > 0]
        res[name] = {
            "backend": sa.last_backend(),
            "shape": list(out.shape), "want_shape": list(q.shape),
            "dtype": str(out.dtype), "want_dtype": str(q.dtype), "contiguous": out.is_contiguous(),
            "finite": bool(torch.isfinite(out).all()),
            "cos": torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item(),
            "max_abs": (got - ref).abs().max().item(),
            "no_key_rows_zero": all(bool((out[cq[i]:cq[i + 1]] == 0).all()) for i in no_keys),
        }


def _segment_mean_int32_edge(res: dict) -> None:
    """quant.segment_mean of one sequence ending at token 2**31 - 1 (the largest total the Triton
    varlen path takes), of a K that is one token expanded (stride 0: no memory), so its mean is that
    token. Positions ``tok + arange(CHUNK)`` are absolute int32: past 2**31 - 1 they wrap negative,
    pass the ``< end`` mask, and are summed too (on a GPU, with a real K, read 2**31 rows before
    it)."""
    from sageattention.triton import quant

    gen = torch.Generator().manual_seed(31)
    n = 2**31 - 1
    token = torch.randn(1, 1, 4, generator=gen)
    x = token.expand(n, 1, 4)
    cu = torch.tensor([n - 41, n], dtype=torch.int32)   # batch 1: the offsets' values are all that count
    mean = quant.segment_mean(x, cu)
    res["segment_mean_int32_edge"] = {"max_abs": (mean[0, 0] - token[0, 0]).abs().max().item(),
                                      "mean": mean[0, 0].tolist(), "want": token[0, 0].tolist()}


def _worker() -> dict:
    res: dict = {}
    _e2e(res)
    _segment_mean_int32_edge(res)
    return res


# ----------------------------------------------------------------------------------------------
# Tests (parent process).
# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def interp():
    return run_worker(__file__, timeout=600)


@pytest.mark.parametrize("name", list(E2E))
def test_varlen_kernel_end_to_end_matches_float64(interp, name):
    r = interp[name]
    assert r["backend"] == "triton-fp16", r
    assert r["shape"] == r["want_shape"] and r["dtype"] == r["want_dtype"] and r["contiguous"], r
    assert r["finite"], r
    assert r["no_key_rows_zero"], r
    assert r["cos"] >= COS_MIN, r
    assert r["max_abs"] <= 0.06, r   # INT8 Q.K and fp16/bf16 P, |v| ~ N(0, 1)


def test_segment_mean_of_a_sequence_ending_at_the_int32_edge(interp):
    r = interp["segment_mean_int32_edge"]
    assert r["max_abs"] <= 1e-5, r


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(_worker()))
