"""sageattn_varlen: the SDPA path's autograd cost and values, the Triton path's 32-bit index limits
(SDPA past them), the varlen and quantization kernels' scale indices for sequence * heads past 2**31 (run for real
in Triton's CPU interpreter, in a subprocess as in test_triton_offsets.py), and the messages of
malformed offsets."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest
from interpreter_worker import run_worker

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import sageattention as sa  # noqa: E402

CASE_ENV = "SAGE_TEST_VARLEN_AUDIT_CASE"


def packed(lens_q, lens_k, hq=4, hkv=2, d=16, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, generator=g, dtype=dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=dtype)
    v = torch.randn(sum(lens_k), hkv, d, generator=g, dtype=dtype)
    cu = [torch.tensor([0, *torch.tensor(lens, dtype=torch.long).cumsum(0).tolist()], dtype=torch.int32)
          for lens in (lens_q, lens_k)]
    return q, k, v, cu[0], cu[1]


def reference(q, k, v, cu_q, cu_k, causal, scale):
    """Softmax attention per sequence written out (float64): GQA by repeating K/V, causal top-left
    (query i sees keys j <= i, as SDPA's is_causal), zeros for queries without keys."""
    group = q.shape[1] // k.shape[1]
    pieces = []
    for a, b, c, d in zip(cu_q.tolist(), cu_q.tolist()[1:], cu_k.tolist(), cu_k.tolist()[1:]):
        if d == c:
            pieces.append(torch.zeros(b - a, *q.shape[1:], dtype=torch.float64))
            continue
        qs = q[a:b].double().transpose(0, 1)
        ks, vs = (t[c:d].double().transpose(0, 1).repeat_interleave(group, 0) for t in (k, v))
        s = qs @ ks.transpose(-1, -2) * scale
        if causal:
            s = s.masked_fill(~torch.ones(b - a, d - c, dtype=torch.bool).tril(), -math.inf)
        pieces.append((s.softmax(-1) @ vs).transpose(0, 1))
    return torch.cat(pieces)


# --- the SDPA path under autograd ------------------------------------------------------------------

class _Elements(TorchDispatchMode):
    """Counts the elements of every tensor the ops produce while active (backward included)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.count += t.numel()
        return out


def test_varlen_backward_work_is_linear_in_the_sequence_count():
    # A slice of q, k, v and a write of the output per sequence made backward build a gradient of
    # the whole tensors once per sequence: 539x the inputs' elements for 200 sequences (CPU, 2000
    # sequences of 8 tokens: backward 47 s against a forward of 0.4 s). Training always runs this
    # path (the kernel is forward only).
    n, batch = 4, 200
    q, k, v = (torch.randn(batch * n, 2, 8, requires_grad=True) for _ in range(3))
    cu = torch.arange(0, batch * n + 1, n, dtype=torch.int32)
    out = sa.sageattn_varlen(q, k, v, cu, cu, n, n, is_causal=True)
    with _Elements() as made:
        out.sum().backward()
    inputs = q.numel() + k.numel() + v.numel()
    assert made.count < 20 * inputs, f"backward made {made.count / inputs:.0f}x the inputs' elements"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, 0.3, -0.7, 0.0, 5e3])
def test_varlen_grad_path_matches_the_written_out_attention(causal, scale):
    # ragged, empty sequences on either side, more queries than keys and the reverse, GQA 2:1
    lens_q, lens_k = (5, 0, 9, 3, 2), (4, 6, 2, 0, 7)
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k)
    for t in (q, k, v):
        t.requires_grad_()
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, is_causal=causal, sm_scale=scale)
    want = reference(q, k, v, cu_q, cu_k, causal, 16 ** -0.5 if scale is None else scale)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-9)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    ref = torch.autograd.grad(want, (q, k, v), g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    assert not got[0][14:17].any()   # the queries of sequence 4 (no keys) get zeros, and no gradient
    with torch.no_grad():   # the buffer path gives the same values
        assert torch.equal(sa.sageattn_varlen(q, k, v, cu_q, cu_k, 9, 7, is_causal=causal,
                                                sm_scale=scale), out.detach())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_varlen_grad_path_keeps_q_dtype_and_reaches_only_what_requires_grad(dtype):
    q, k, v, cu_q, cu_k = packed((3, 6), (0, 5), dtype=dtype)
    q.requires_grad_()
    out = sa.sageattn_varlen(q, k, v, cu_q, cu_k, 6, 5, is_causal=True)
    assert out.dtype == dtype and out.requires_grad and out.is_contiguous() and not out[:3].any()
    out.float().sum().backward()
    assert q.grad.dtype == dtype and k.grad is None and v.grad is None
    assert not q.grad[:3].any() and q.grad[3:].any()


# --- the Triton path's 32-bit limits ----------------------------------------------------------------

@pytest.fixture
def kernel_chosen(monkeypatch):
    """The dispatcher picks the Triton varlen kernel (as on a GPU); reaching it fails the test, and
    the SDPA fallback is replaced by a stub (the inputs are expanded views of 2**31 elements)."""
    from sageattention import core, dispatch
    from sageattention import triton as st
    from sageattention.dispatch import BackendChoice

    monkeypatch.setattr(dispatch, "choose", lambda *a, **kw: BackendChoice("triton-fp16", "test", False))
    monkeypatch.setattr(st, "varlen_attention", lambda *a, **kw: pytest.fail("the Triton kernel was reached"))
    ran = []
    monkeypatch.setattr(core, "_varlen_sdpa", lambda q, *a, **kw: ran.append(q.shape) or q.new_zeros(0))
    return ran


def test_varlen_past_2_31_packed_tokens_runs_sdpa(kernel_chosen):
    # int64 cu_seqlens past 2**31 - 1 were converted to int32 for the kernel: wrapped, they failed
    # its checks as "cu_seqlens_q[-1] = -2147483648 must equal the number of packed tokens", values
    # the caller never passed.
    n = 2**31
    q = torch.zeros(1, 1, 8, dtype=torch.float16).expand(n, 1, 8)
    k = torch.zeros(5, 1, 8, dtype=torch.float16)
    cu_q = torch.tensor([0, n - 3, n], dtype=torch.int64)
    cu_k = torch.tensor([0, 2, 5], dtype=torch.int64)
    sa.sageattn_varlen(q, k, k, cu_q, cu_k, n - 3, 3)
    assert kernel_chosen == [q.shape] and sa.last_backend() == "sdpa"


def test_varlen_sequence_head_pairs_past_2_31_keep_the_kernel():
    # Both varlen kernels index scales by sequence * heads in int64 (the two interpreter cases
    # below), so 32770 sequences at 65535 heads are no reason to leave the kernel.
    from sageattention import core

    heads = 65535
    q = torch.zeros(1, 1, 8, dtype=torch.float16).expand(32770, heads, 8)
    assert 32769 * heads > 2**31
    assert core._past_varlen_kernel_index(q, q) is None


def test_varlen_forced_kernel_past_its_limits_names_why(kernel_chosen, monkeypatch):
    from sageattention import dispatch

    monkeypatch.setattr(dispatch, "forced_backend", lambda: "triton-fp16")
    n = 2**31 + 7
    q = torch.zeros(1, 2, 8, dtype=torch.float16).expand(n, 2, 8)
    cu = torch.tensor([0, n], dtype=torch.int64)
    with pytest.raises(sa.BackendUnavailableError,
                       match=r"'triton-fp16' is forced but cannot run this call: 2147483655 packed tokens "
                             r"exceed the 2147483647"):
        sa.sageattn_varlen(q, q, q, cu, cu, n, n)
    assert kernel_chosen == []


# --- the varlen kernel's scale indices (Triton's interpreter) ---------------------------------------

def case_scale_index_past_2_31() -> dict:
    """_varlen_fwd_kernel with n_heads = 2**30 + 1 (an argument; the grid has one head) and three
    sequences, the last one holding every token: its Q scale lies at (2 * n_heads) * n_q_scales,
    past 2**31 (int32 wrapped it to a negative index: a read before the buffer). The scale buffer
    is a lazily committed torch.empty. Exact equality with the same launch at n_heads = 1."""
    import triton

    from sageattention.triton import attn, quant, varlen

    gen = torch.Generator().manual_seed(5)
    n, d = 40, 32
    q = torch.randn(n, 1, d, generator=gen).half()
    k = (torch.randn(n, 1, d, generator=gen) + 0.3).half()
    v = torch.randn(n, 1, d, generator=gen).half()
    cu = torch.tensor([0, 0, 0, n], dtype=torch.int32)
    cfg = attn.pick_config(quant.padded_head_dim(d), True, False, varlen=True)
    k8, k_scale = quant.quantize_varlen(k, cu, n, block=quant.BLKK, pad_to=max(quant.BLKK, cfg.block_n),
                                        mean=quant.segment_mean(k, cu))
    q8, q_scale = quant.quantize_varlen(q, cu, n, block=quant.BLKQ, pad_to=quant.BLKQ,
                                        scale_mult=d ** -0.5 * attn.LOG2E)
    n_q_scales = q_scale.shape[2]

    def launch(scales, n_heads):
        out = torch.full((n, 1, d), float("nan"), dtype=torch.float16)
        # group = n_heads: every head reads kv head 0, whose K scales stay at b * 1
        varlen._varlen_fwd_kernel[(triton.cdiv(n, cfg.block_m), 1, 3)](
            q8, k8, v, scales, k_scale, out, cu, cu,
            q8.stride(0), q8.stride(1), k8.stride(0), k8.stride(1), v.stride(0), v.stride(1),
            out.stride(0), out.stride(1), n_heads, n_heads, n_q_scales, k_scale.shape[2],
            HEAD_DIM=d, D=quant.padded_head_dim(d), QBLK=quant.BLKQ, KBLK=quant.BLKK,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, IS_CAUSAL=True)
        return out

    want = launch(q_scale, 1)
    heads = 2**30 + 1
    try:
        wide = torch.empty(2 * heads * n_q_scales + n_q_scales, dtype=torch.float32)
    except RuntimeError as exc:   # no 8 GiB of address space to reserve
        return {"skipped": str(exc)[:200]}
    wide[2 * heads * n_q_scales:] = q_scale[2, 0]
    got = launch(wide, heads)
    return {"equal": bool(torch.equal(got, want)), "finite": bool(torch.isfinite(got).all())}


def case_quant_scale_index_past_2_31() -> dict:
    """_quant_block_kernel (varlen) with heads = 2**30 + 1 (an argument; the grid has one head) and
    three sequences, the last holding every token: its scale lies at (2 * heads) * n_blocks, past
    2**31 (int32 wrapped it to a negative index: a write before the buffer, SIGSEGV in the
    interpreter). Exact equality of the int8 values and the scale with the same launch at heads = 1."""
    from sageattention.triton import quant

    gen = torch.Generator().manual_seed(6)
    n, d = 40, 32
    x = torch.randn(n, 1, d, generator=gen).half()
    cu = torch.tensor([0, 0, 0, n], dtype=torch.int32)
    dp, block = quant.padded_head_dim(d), quant.BLKQ
    n_blocks = -(-n // block)

    def launch(heads):
        out = torch.zeros((n, 1, dp), dtype=torch.int8)
        try:
            scale = torch.empty(2 * heads * n_blocks + n_blocks, dtype=torch.float32)
        except RuntimeError as exc:   # no 8 GiB of address space to reserve
            return None, str(exc)[:200]
        quant._quant_block_kernel[(n_blocks, 1, 3)](
            x, cu, scale, out, scale, scale, scale,
            0, x.stride(1), x.stride(0), 0, out.stride(1), out.stride(0),
            heads, 0, 0, n_blocks, 1.0, 0.0, 1,
            HEAD_DIM=d, D=dp, BLK=block, VARLEN=True, HAS_MEAN=False, HAS_CORR=False)
        return (out, scale[2 * heads * n_blocks:].clone()), None

    want, _ = launch(1)
    got, skipped = launch(2**30 + 1)
    if got is None:
        return {"skipped": skipped}
    return {"equal": bool(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])),
            "nonzero": bool(want[0].abs().sum() > 0)}


CASES = {name[len("case_"):]: fn for name, fn in globals().items() if name.startswith("case_")}


@pytest.mark.parametrize("case, second", [("scale_index_past_2_31", "finite"),
                                          ("quant_scale_index_past_2_31", "nonzero")])
def test_kernel_scale_index_past_2_31(monkeypatch, case, second):
    pytest.importorskip("triton")
    monkeypatch.setenv(CASE_ENV, case)
    res = run_worker(__file__, timeout=300)   # the unfixed kernels crashed the worker (SIGSEGV)
    if "skipped" in res:
        pytest.skip(res["skipped"])
    assert res["equal"] and res[second], res


# --- messages of malformed offsets -------------------------------------------------------------------

def test_unordered_offsets_name_the_first_bad_pair_not_the_whole_batch():
    # the message held every offset: 1.5 MB of text for a batch of 200000 sequences
    n = 200_000
    q = torch.zeros(n, 1, 8)
    cu = torch.arange(n + 1, dtype=torch.int64)
    bad = cu.clone()
    bad[7] = 3
    with pytest.raises(ValueError) as info:
        sa.sageattn_varlen(q, q, q, bad, cu, 1, 1)
    text = str(info.value)
    assert len(text) < 300 and "cu_seqlens_q[7] = 3 < cu_seqlens_q[6] = 6" in text, text


def test_offset_messages_say_what_is_accepted():
    q, k, v, cu_q, cu_k = packed((5, 7), (6, 9))
    with pytest.raises(ValueError, match=r"cu_seqlens_k must end at the total token count 15 \(k\.shape\[0\]\), "
                                         r"got 14"):
        sa.sageattn_varlen(q, k, v, cu_q, torch.tensor([0, 6, 14], dtype=torch.int32), 7, 9)
    with pytest.raises(ValueError, match=r"max_seqlen_k=8 is smaller than the longest sequence \(9\); "
                                         r"pass at least 9"):
        sa.sageattn_varlen(q, k, v, cu_q, cu_k, 7, 8)
    with pytest.raises(ValueError, match=r"cu_seqlens_q is on meta but q is on cpu; put it on q's device or "
                                         r"the CPU"):
        sa.sageattn_varlen(q, k, v, cu_q.to("meta"), cu_k, 7, 9)
    # an upper bound larger than the longest sequence is accepted and changes nothing
    assert torch.equal(sa.sageattn_varlen(q, k, v, cu_q, cu_k, 10**6, 10**6),
                       sa.sageattn_varlen(q, k, v, cu_q, cu_k, 7, 9))


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(CASES[os.environ[CASE_ENV]]()))
