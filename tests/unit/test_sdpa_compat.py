"""The SDPA-compatible function and the patch context manager."""

import inspect

import pytest
import torch
import torch.nn.functional as F

import sageattention as sa
from sageattention import sdpa_compat

TORCH_SDPA = F.scaled_dot_product_attention


def qkv(hq=4, hkv=4, nq=24, nk=40, d=64, dtype=torch.float16):
    return (torch.randn(2, hq, nq, d, dtype=dtype), torch.randn(2, hkv, nk, d, dtype=dtype),
            torch.randn(2, hkv, nk, d, dtype=dtype))


def test_signature_is_sdpas():
    params = inspect.signature(sa.scaled_dot_product_attention).parameters
    expect = [("query", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
              ("key", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
              ("value", "POSITIONAL_OR_KEYWORD", inspect.Parameter.empty),
              ("attn_mask", "POSITIONAL_OR_KEYWORD", None), ("dropout_p", "POSITIONAL_OR_KEYWORD", 0.0),
              ("is_causal", "POSITIONAL_OR_KEYWORD", False),
              # torch: "The optional scale argument can only be specified as a keyword argument."
              ("scale", "KEYWORD_ONLY", None), ("enable_gqa", "KEYWORD_ONLY", False)]
    assert [(p.name, p.kind.name, p.default) for p in params.values()] == expect
    assert "attn_mask=None, dropout_p=0.0" in TORCH_SDPA.__doc__ and "enable_gqa=False" in TORCH_SDPA.__doc__


def test_positional_mask_is_a_mask_not_a_layout():
    q, k, v = qkv()
    mask = torch.rand(24, 40) > 0.5
    mask[:, 0] = True
    out = sa.scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out, TORCH_SDPA(q, k, v, mask))
    assert not torch.equal(out, TORCH_SDPA(q, k, v))
    # Plain assignment of sageattn would have read the mask as tensor_layout:
    with pytest.raises((TypeError, ValueError)):
        sa.sageattn(q, k, v, mask)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float16, torch.float32])
def test_positional_arguments_match_sdpa(mask_dtype):
    q, k, v = qkv()
    mask = (torch.rand(2, 1, 24, 40) > 0.3) if mask_dtype == torch.bool else torch.randn(24, 40).to(mask_dtype)
    if mask_dtype == torch.bool:
        mask[..., 0] = True
    out = sa.scaled_dot_product_attention(q, k, v, mask, 0.0, False, scale=0.2)
    ref = TORCH_SDPA(q.double(), k.double(), v.double(), mask if mask_dtype == torch.bool else mask.double(),
                     0.0, False, scale=0.2)
    assert (out.double() - ref).abs().max() < 2e-3
    causal = sa.scaled_dot_product_attention(q, k, v, None, 0.0, True)
    assert torch.equal(causal, TORCH_SDPA(q, k, v, None, 0.0, True))


def test_gqa_follows_enable_gqa_like_sdpa():
    q, k, v = qkv(hq=4, hkv=2)
    assert torch.equal(sa.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                       TORCH_SDPA(q, k, v, enable_gqa=True))
    with pytest.raises(RuntimeError):  # torch's own error, raised by torch
        sa.scaled_dot_product_attention(q, k, v)


def test_shapes_outside_the_api_go_to_torch_unchanged():
    q3 = torch.randn(3, 10, 16)  # 3-D: SDPA accepts any batch shape
    assert torch.equal(sa.scaled_dot_product_attention(q3, q3, q3), TORCH_SDPA(q3, q3, q3))
    q, k, _ = qkv(dtype=torch.float32)
    v_wide = torch.randn(2, 4, 40, 32)  # value head dim differs from the query's
    assert torch.equal(sa.scaled_dot_product_attention(q, k, v_wide), TORCH_SDPA(q, k, v_wide))
    assert sa.last_backend() == "sdpa"


def test_batch_and_kv_head_counts_that_sdpa_broadcasts_go_to_torch():
    # torch's SDPA broadcasts a batch of 1 in k/v and K/V head counts that differ; sageattn's own
    # check refused both ("batch sizes differ", "k and v head counts differ"), so patch_sdpa broke
    # such callers
    q, k, v = qkv(dtype=torch.float32)
    for key, value in ((k[:1], v[:1]), (k, v[:, :1])):
        assert torch.equal(sa.scaled_dot_product_attention(q, key, value), TORCH_SDPA(q, key, value))
        assert sa.last_backend() == "sdpa"


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")   # torch's own, on CPU
def test_nested_and_sparse_tensors_go_to_torch_unchanged():
    # torch's SDPA takes jagged nested tensors ([batch, heads, ragged tokens, head_dim])
    rows = [torch.randn(n, 2, 16) for n in (5, 9)]
    jagged = torch.nested.nested_tensor(rows, layout=torch.jagged).transpose(1, 2)
    out = sa.scaled_dot_product_attention(jagged, jagged, jagged)
    assert out.is_nested and sa.last_backend() == "sdpa"
    for got, want in zip(out.unbind(), TORCH_SDPA(jagged, jagged, jagged).unbind()):
        assert torch.equal(got, want)
    sparse = torch.randn(1, 2, 8, 16).to_sparse()   # fails in torch, so fails the same way here
    with pytest.raises(RuntimeError) as torch_error:
        TORCH_SDPA(sparse, sparse, sparse)
    with pytest.raises(RuntimeError, match=str(torch_error.value).splitlines()[0]):
        sa.scaled_dot_product_attention(sparse, sparse, sparse)


@pytest.mark.parametrize("scale", [0.0, -0.3])
def test_zero_and_negative_scales_give_attention_where_torch_gave_nan(scale):
    q3, k3 = torch.randn(3, 10, 16, dtype=torch.float64), torch.randn(3, 12, 16, dtype=torch.float64)
    # torch 2.14's own SDPA returns NaN/Inf here (is_causal with such a scale, on the CPU)
    out = sa.scaled_dot_product_attention(q3, k3, k3, is_causal=True, scale=scale)
    s = (q3 @ k3.transpose(-1, -2) * scale).masked_fill(torch.ones(10, 12, dtype=torch.bool).triu(1),
                                                        float("-inf"))
    assert torch.allclose(out, s.softmax(-1) @ k3)


@pytest.mark.filterwarnings("error::RuntimeWarning")   # numpy's overflow warning from the scale check
def test_numpy_scales_of_zero_or_below_give_attention_where_torch_gave_nan():
    # torch takes numpy scalars as the scale; a numpy float32 or integer one skipped the check
    # above (Python int/float only), so such a call still returned torch's NaN
    np = pytest.importorskip("numpy")
    q3, k3 = torch.randn(3, 10, 16, dtype=torch.float64), torch.randn(3, 12, 16, dtype=torch.float64)
    for scale in (np.float32(-0.25), np.int64(0)):
        out = sa.scaled_dot_product_attention(q3, k3, k3, is_causal=True, scale=scale)
        s = (q3 @ k3.transpose(-1, -2) * float(scale)).masked_fill(torch.ones(10, 12, dtype=torch.bool).triu(1),
                                                                   float("-inf"))
        assert torch.allclose(out, s.softmax(-1) @ k3)


@pytest.mark.parametrize("shape", [(2, 4, 24, 64), (4, 24, 64)])   # sageattn's path, torch's path
def test_a_0d_tensor_scale_is_taken_as_torch_takes_it(shape):
    # torch's SDPA takes a 0-d tensor (a model's buffer) as the scale; the 4-D path raised TypeError
    q = torch.randn(*shape, dtype=torch.float64)
    for scale in (torch.tensor(0.2), torch.tensor(0.2, dtype=torch.float64), torch.tensor(2)):
        assert torch.equal(sa.scaled_dot_product_attention(q, q, q, scale=scale),
                           TORCH_SDPA(q, q, q, scale=scale.item()))
    # and a 0-d tensor dropout_p (torch takes it as well)
    assert torch.equal(sa.scaled_dot_product_attention(q, q, q, dropout_p=torch.tensor(0.0)), TORCH_SDPA(q, q, q))


@pytest.mark.parametrize("shape", [(2, 4, 24, 64), (4, 24, 64)])
@pytest.mark.parametrize("scale,error,match", [
    (float("nan"), ValueError, "scale must be finite, got nan"),   # torch's path returned NaN
    (float("-inf"), ValueError, "scale must be finite, got -inf"),
    pytest.param(10 ** 400, ValueError, "scale must be finite", id="int-past-float"),   # torch's OverflowError
    (torch.tensor([0.2]), TypeError, "scale must be a real number, None or a 0-d real tensor without grad"),
    (torch.tensor(0.2, requires_grad=True), TypeError, "requiring grad"),
])
def test_bad_scales_are_refused_whichever_path_runs(shape, scale, error, match):
    q = torch.randn(*shape)
    with pytest.raises(error, match=match):
        sa.scaled_dot_product_attention(q, q, q, scale=scale)


def test_patch_sdpa_patches_and_restores():
    q, k, v = qkv()
    mask = torch.ones(24, 40, dtype=torch.bool).tril()
    with sa.patch_sdpa() as patched:
        assert F.scaled_dot_product_attention is patched is sdpa_compat.scaled_dot_product_attention
        out = F.scaled_dot_product_attention(q, k, v, mask)  # a caller passing the mask positionally
    assert F.scaled_dot_product_attention is TORCH_SDPA
    assert torch.equal(out, TORCH_SDPA(q, k, v, mask))


def test_patch_sdpa_restores_after_an_error_and_nests():
    with pytest.raises(KeyError):
        with sa.patch_sdpa():
            raise KeyError("boom")
    assert F.scaled_dot_product_attention is TORCH_SDPA
    with sa.patch_sdpa():
        with sa.patch_sdpa():
            pass
        assert F.scaled_dot_product_attention is sdpa_compat.scaled_dot_product_attention
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_patched_fallback_does_not_recurse():
    q, k, v = qkv(dtype=torch.float32)  # fp32: sageattn falls back to SDPA while SDPA is patched
    with sa.patch_sdpa():
        out = F.scaled_dot_product_attention(q, k, v, None, 0.0, True)
    assert torch.equal(out, TORCH_SDPA(q, k, v, None, 0.0, True))


@pytest.mark.parametrize("case,words", [
    ("3-D", "inputs that are not 4-D strided tensors"),
    ("value head dim", "a value head dim unlike the query's"),
    ("gqa", "without enable_gqa=True"),
])
def test_a_forced_quantized_backend_is_not_bypassed_by_the_torch_path(case, words, monkeypatch):
    # force_backend's promise holds for the drop-in too: it raises where the call would go to torch
    q, k, v = qkv(hq=4, hkv=2 if case == "gqa" else 4)
    if case == "3-D":
        q, k, v = q[0], k[0], v[0]
    if case == "value head dim":
        v = torch.randn(2, 4, 40, 32, dtype=v.dtype)
    with sa.force_backend("triton-fp16"):
        with pytest.raises(sa.BackendUnavailableError, match="'triton-fp16' is forced") as err:
            sa.scaled_dot_product_attention(q, k, v)
    assert words in str(err.value) and "force 'sdpa'" in str(err.value)
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "cuda-sm80-fp16")
    with pytest.raises(sa.BackendUnavailableError, match="'cuda-sm80-fp16' is forced"):
        sa.scaled_dot_product_attention(q, k, v)
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "sdpa")  # forcing torch's SDPA: torch's answer
    if case == "gqa":  # torch refuses GQA without enable_gqa, and so does the drop-in
        with pytest.raises(RuntimeError, match="must match"):
            sa.scaled_dot_product_attention(q, k, v)
    else:
        assert torch.equal(sa.scaled_dot_product_attention(q, k, v), TORCH_SDPA(q, k, v))


@pytest.mark.parametrize("in_dtype,amp_dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                                (torch.float16, torch.bfloat16)])
@pytest.mark.parametrize("masked", [False, True])
def test_under_autocast_the_drop_in_runs_and_returns_the_autocast_dtype_as_sdpa(in_dtype, amp_dtype, masked):
    # torch's SDPA is on autocast's lower-precision list: its inputs are cast to the autocast dtype,
    # and so is its output; the drop-in returned the input dtype (fp32 where torch gave bf16)
    q, k, v = qkv(dtype=in_dtype)
    mask = torch.randn(24, 40) if masked else None
    with torch.autocast("cpu", dtype=amp_dtype):
        want = TORCH_SDPA(q, k, v, attn_mask=mask)
        got = sa.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert want.dtype == amp_dtype and got.dtype == want.dtype
    assert (got.float() - want.float()).abs().max() < 2e-2
