"""Tile and TMA choices of the Triton kernels (no kernel runs: pure Python decisions).

The speed behind these defaults was measured on the H200 (benchmarks/results/README.md); what is
checked here is that each call shape gets the kernel variant it is meant to get.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sageattention.triton import attn, attn_fp8  # noqa: E402


@pytest.mark.parametrize("dp", [64, 128])
def test_unmasked_dense_calls_take_tma_tiles_where_tma_exists(dp):
    cfg = attn.pick_config(dp, is_causal=False, has_mask=False, use_tma=True)
    assert cfg == attn.KernelConfig(128, 64, 4, 3, use_tma=True)


@pytest.mark.parametrize("has_mask, varlen, dp", [(True, False, 128), (False, True, 128),
                                                   (True, False, 64), (False, False, 256)])
def test_masks_varlen_and_wide_heads_keep_pointer_loads(has_mask, varlen, dp):
    cfg = attn.pick_config(dp, is_causal=True, has_mask=has_mask, varlen=varlen, use_tma=True)
    assert not cfg.use_tma


def test_without_tma_the_pointer_load_tiles_are_unchanged():
    assert attn.pick_config(128, False, False) == attn.KernelConfig(128, 64, 8, 3)
    assert attn.pick_config(64, False, False) == attn.KernelConfig(128, 64, 4, 3)


def test_fp8_tiles_follow_the_tma_flag_and_stay_two_level():
    for dp in (64, 128):
        with_tma = attn_fp8.pick_config(dp, is_causal=False, use_tma=True)
        assert with_tma.use_tma and with_tma.two_level and with_tma.block_n == 128
        assert not attn_fp8.pick_config(dp, is_causal=False).use_tma


def test_tma_is_never_chosen_off_gpu():
    assert attn.tma_available(torch.device("cpu")) is False


def test_descriptor_alignment_rules():
    v = torch.zeros(2, 4, 100, 64, dtype=torch.float16)
    assert attn._descriptor_ok(v)
    assert attn._descriptor_ok(v.transpose(1, 2).contiguous().transpose(1, 2))  # NHD strides
    assert not attn._descriptor_ok(torch.zeros(2, 4, 100, 36, dtype=torch.float16))  # 72-byte rows
    flat = torch.zeros(1 + 2 * 4 * 100 * 64, dtype=torch.float16)
    assert not attn._descriptor_ok(flat[1:].view(2, 4, 100, 64))  # base not 16-byte aligned
    assert not attn._descriptor_ok(v[..., ::2])  # last stride not 1
