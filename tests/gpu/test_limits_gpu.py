"""Calls past the kernels' launch grid (more than 65535 batch entries or query heads): sageattn runs
them on SDPA and gets them right; a forced quantized backend and the raw ops refuse them by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sageattention.backends import BACKEND_NAMES, MAX_GRID_YZ

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHAPES = {"batch": (MAX_GRID_YZ + 1, 1, 1), "heads": (1, MAX_GRID_YZ + 1, MAX_GRID_YZ + 1),
          "mqa_heads": (1, MAX_GRID_YZ + 1, 1)}


def qkv(batch, hq, hkv, n=8, d=64):
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(batch, hq, n, d, device="cuda", generator=g, dtype=torch.float16)
    k = torch.randn(batch, hkv, n, d, device="cuda", generator=g, dtype=torch.float16)
    v = torch.randn(batch, hkv, n, d, device="cuda", generator=g, dtype=torch.float16)
    return q, k, v


def last_rows(q, k, v, out, rows=2):
    """The last `rows` batch entries and query heads of out, and their fp32 SDPA, each query head on
    its kv head."""
    rb, rh = min(rows, q.shape[0]), min(rows, q.shape[1])
    q, k, v, out = q[-rb:], k[-rb:], v[-rb:], out[-rb:, -rh:]
    idx = torch.arange(q.shape[1] - rh, q.shape[1], device="cuda") // (q.shape[1] // k.shape[1])
    ref = F.scaled_dot_product_attention(q[:, -rh:].float(), k.index_select(1, idx).float(),
                                         v.index_select(1, idx).float())
    return out, ref


@pytest.mark.parametrize("calibration", ["on", "off"])
@pytest.mark.parametrize("what", SHAPES)
def test_sageattn_runs_sdpa_past_the_grid_and_is_right(what, calibration, monkeypatch, attn_metrics):
    import sageattention as sa

    monkeypatch.setenv("SAGEATTENTION_CALIBRATION", calibration)
    q, k, v = qkv(*SHAPES[what])
    choice = sa.select_backend(q, k, v)
    assert choice.name == "sdpa" and "exceeds the launch grid limit of 65535" in choice.reason
    out = sa.sageattn(q, k, v)
    assert sa.last_backend() == "sdpa"
    cos, _ = attn_metrics(*last_rows(q, k, v, out))
    assert cos > 0.9999


@pytest.mark.parametrize("name", [n for n in BACKEND_NAMES if n != "sdpa"])
def test_forced_quantized_backend_refuses_past_the_grid(name):
    import sageattention as sa

    q, k, v = qkv(*SHAPES["batch"])
    with sa.force_backend(name), pytest.raises(sa.BackendUnavailableError,
                                               match="batch 65536 exceeds the launch grid limit"):
        sa.sageattn(q, k, v)


@pytest.mark.parametrize("fam", ["sm75", "sm80", "sm90"])
def test_raw_op_refuses_past_the_grid_by_name(fam):
    import sageattention.native as native

    try:
        native.family_module(fam).load()
    except Exception as exc:  # noqa: BLE001 - a family missing from this wheel is not under test here
        pytest.skip(f"family {fam} not loadable here: {exc}")
    if fam == "sm90" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 family runs only on compute capability 9.0")
    q, k, v = qkv(*SHAPES["batch"])
    op = getattr(torch.ops, f"sageattention_{fam}").qk_int8_pv_fp16
    args = ("HND", False, 0.125, "per_warp") + (() if fam == "sm75" else ("fp32",)) + (True, False)
    with pytest.raises(RuntimeError, match="batch 65536 and 1 heads; the kernels take at most 65535"):
        op(q, k, v, *args)


def test_varlen_runs_sdpa_past_the_grid_and_is_right(attn_metrics):
    # Per-sequence SDPA with enable_gqa gave cosine 0 at 65536 query heads on one kv head (cuDNN,
    # benchmarks/results/h200-2026-12-03-sdpa-gqa.txt); past the grid each query head gets its copy.
    import sageattention as sa

    hq = MAX_GRID_YZ + 1
    q, k, v = (t[0].transpose(0, 1) for t in qkv(1, hq, 1))   # [8 tokens, heads, 64], packed
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device="cuda")
    out = sa.sageattn_varlen(q, k, v, cu, cu, 5, 5)
    assert sa.last_backend() == "sdpa"
    for a, b in ((0, 3), (3, 8)):
        qs, ks, vs = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
        got, ref = last_rows(qs, ks, vs, out[a:b].transpose(0, 1)[None])
        cos, _ = attn_metrics(got, ref)
        assert cos > 0.9999
