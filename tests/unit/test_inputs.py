"""Bad input raises ValueError/TypeError naming the problem, before any backend is chosen."""

import fractions

import pytest
import torch

import sageattention as sa
from sageattention import inputs


def qkv(b=1, hq=2, hkv=2, nq=16, nk=16, d=64, dtype=torch.float16):
    return (torch.randn(b, hq, nq, d, dtype=dtype), torch.randn(b, hkv, nk, d, dtype=dtype),
            torch.randn(b, hkv, nk, d, dtype=dtype))


@pytest.fixture(autouse=True)
def no_backend_runs(monkeypatch):
    """Validation must fail before dispatch: any dispatch in these tests is a bug."""
    def boom(*args, **kwargs):
        raise AssertionError("dispatch reached with invalid input")
    monkeypatch.setattr(sa.dispatch, "choose_for_call", boom)


def shapes_case(name):
    q, k, v = qkv()
    if name == "rank":
        return (q[0], k, v), ValueError, "4-D"
    if name == "batch":
        return (q, torch.randn(2, 2, 16, 64, dtype=q.dtype), torch.randn(2, 2, 16, 64, dtype=q.dtype)), \
            ValueError, "batch"
    if name == "head_dim":
        return (q, k[..., :32].contiguous(), v[..., :32].contiguous()), ValueError, "head dims"
    if name == "kv_len":
        return (q, k, v[:, :, :8]), ValueError, "token counts"
    if name == "heads":
        return (torch.randn(1, 3, 16, 64, dtype=q.dtype), k, v), ValueError, "multiple of key/value heads"
    if name == "devices":
        return (q, k.to("meta"), v), ValueError, "one device"
    if name == "dtypes":
        return (q, k.float(), v), TypeError, "one dtype"
    if name == "int":
        return (q.to(torch.int32), k.to(torch.int32), v.to(torch.int32)), TypeError, "floating point"
    if name == "float8":  # a floating dtype SDPA cannot take
        return tuple(t.to(torch.float8_e4m3fn) for t in (q, k, v)), TypeError, "floating point"
    if name == "not_tensor":
        return (q.tolist(), k, v), TypeError, "torch.Tensor"
    if name == "sparse":
        return (q, k.to_sparse(), v), TypeError, r"k must be a dense \(torch.strided\) tensor, got layout torch.sparse_coo"
    if name == "nested":
        nested = torch.nested.nested_tensor(list(q.float().unbind(1)), layout=torch.jagged)
        return (nested, nested, nested), TypeError, "q is a nested tensor.*sageattn_varlen"
    raise KeyError(name)


SHAPE_CASES = ["rank", "batch", "head_dim", "kv_len", "heads", "devices", "dtypes", "int", "float8", "not_tensor",
               "sparse", "nested"]


@pytest.mark.parametrize("case", SHAPE_CASES)
@pytest.mark.parametrize("func", [sa.sageattn, sa.sageattn_qk_int8_pv_fp16_cuda, sa.sageattn_qk_int8_pv_fp8_cuda,
                                  sa.sageattn_qk_int8_pv_fp8_cuda_sm90, sa.sageattn_qk_int8_pv_fp16_triton,
                                  sa.select_backend])
def test_bad_tensors(func, case):
    args, error, match = shapes_case(case)
    with pytest.raises(error, match=match):
        func(*args)


def test_nhd_shapes_are_read_in_nhd():
    q, k, v = (t.transpose(1, 2) for t in qkv(nk=16))
    with pytest.raises(ValueError, match="token counts differ: k 16, v 8"):
        sa.sageattn(q, k, v[:, :8], tensor_layout="NHD")


@pytest.mark.parametrize("kwargs,error,match", [
    ({"tensor_layout": "BHSD"}, ValueError, "'HND', 'NHD'"),
    ({"qk_quant_gran": "per_tile"}, ValueError, "'per_block', 'per_warp', 'per_thread'"),
    ({"pv_accum_dtype": "fp64"}, ValueError, "'fp32', 'fp16\\+fp32'"),
    ({"sm_scale": 0.1, "scale": 0.2}, ValueError, "disagree"),
    ({"sm_scale": "0.1"}, TypeError, "sm_scale must be a real number"),
    ({"scale": float("nan")}, ValueError, "finite"),
    ({"sm_scale": 10 ** 400}, ValueError, "sm_scale must be finite"),   # was math.isfinite's OverflowError
    ({"dropout_p": 1.5}, ValueError, "dropout_p must be in"),
    ({"is_causal": "yes"}, TypeError, "is_causal must be a bool, got str"),
    ({"is_causal": 1.0}, TypeError, "is_causal must be a bool, got float"),
    ({"return_lse": torch.tensor(True)}, TypeError, "return_lse must be a bool, got torch.Tensor"),
    ({"is_causal": fractions.Fraction(1)}, TypeError, "is_causal must be a bool, got fractions.Fraction"),
    ({"enable_gqa": False, "_gqa": True}, ValueError, "enable_gqa=False"),
])
def test_bad_options_for_sageattn(kwargs, error, match):
    q, k, v = qkv(hq=4 if kwargs.pop("_gqa", False) else 2)
    with pytest.raises(error, match=match):
        sa.sageattn(q, k, v, **kwargs)


def test_a_0d_tensor_scale_is_its_value():
    # torch's SDPA takes a 0-d tensor as the scale (a model's buffer); it was a TypeError here
    for value in (torch.tensor(0.25), torch.tensor(0.25, dtype=torch.float64), torch.tensor(-2)):
        assert inputs.resolve_sm_scale(value, None, 64) == value.item()
        assert inputs.resolve_sm_scale(None, value, 64) == value.item()
    assert inputs.resolve_sm_scale(torch.tensor(0.5), 0.5, 64) == 0.5


def test_a_0d_tensor_dropout_is_its_value():
    # torch's SDPA takes a 0-d tensor as dropout_p too; it was "dropout_p must be a float"
    assert inputs.check_dropout(torch.tensor(0.25)) == 0.25
    assert inputs.check_dropout(torch.tensor(0)) == 0.0
    with pytest.raises(ValueError, match="dropout_p must be in"):
        inputs.check_dropout(torch.tensor(1.5))
    with pytest.raises(TypeError, match="dropout_p must be a float or a 0-d real tensor without grad, got a "
                                        r"tensor of shape \(2,\)"):
        inputs.check_dropout(torch.zeros(2))


@pytest.mark.parametrize("value,error,match", [
    (torch.tensor([0.25]), TypeError, r"sm_scale must be a real number, None or a 0-d real tensor without "
                                      r"grad, got a tensor of shape \(1,\)"),
    (torch.tensor(0.25, requires_grad=True), TypeError, "requiring grad"),
    (torch.tensor(True), TypeError, "torch.bool"),
    (torch.tensor(float("inf")), ValueError, "sm_scale must be finite, got inf"),
])
def test_bad_tensor_scales(value, error, match):
    with pytest.raises(error, match=match):
        sa.sageattn(*qkv(), sm_scale=value)


@pytest.mark.parametrize("func,kwargs,match", [
    (sa.sageattn_qk_int8_pv_fp16_cuda, {"qk_quant_gran": "per_block"}, "'per_warp', 'per_thread'"),
    (sa.sageattn_qk_int8_pv_fp16_cuda, {"pv_accum_dtype": "fp32+fp32"}, "'fp32', 'fp16\\+fp32', 'fp16'"),
    (sa.sageattn_qk_int8_pv_fp8_cuda, {"pv_accum_dtype": "fp16"}, "'fp32\\+fp16', 'fp32\\+fp32', 'fp32'"),
    (sa.sageattn_qk_int8_pv_fp8_cuda_sm90, {"qk_quant_gran": "thread"}, "per_thread"),
    (sa.sageattn_qk_int8_pv_fp16_triton, {"quantization_backend": "cudnn"}, "'triton', 'cuda'"),
    (sa.sageattn_qk_int8_pv_fp16_triton, {"tensor_layout": "hnd"}, "'HND', 'NHD'"),
])
def test_bad_options_for_kernel_functions(func, kwargs, match):
    with pytest.raises(ValueError, match=match):
        func(*qkv(), **kwargs)


@pytest.mark.parametrize("mask,kwargs,error,match", [
    (torch.ones(16, 15, dtype=torch.bool), {}, ValueError, "does not broadcast"),
    (torch.ones(3, 2, 16, 16, dtype=torch.bool), {}, ValueError, "does not broadcast"),
    (torch.ones(1, 1, 1, 16, 16, dtype=torch.bool), {}, ValueError, "does not broadcast"),
    (torch.ones(16, 16, dtype=torch.bool), {"is_causal": True}, ValueError, "cannot be combined"),
    (torch.ones(16, 16, dtype=torch.int64), {}, TypeError, "torch.bool"),
    (torch.ones(16, 16, dtype=torch.float64), {}, TypeError, "additive"),
    ([[True]], {}, TypeError, "torch.Tensor"),
    (torch.ones(16, 16, dtype=torch.bool).to_sparse(), {}, TypeError, "attn_mask must be a dense"),
    (torch.ones(16, 16, dtype=torch.bool, device="meta"), {}, ValueError, "attn_mask is on meta"),
])
def test_bad_masks(mask, kwargs, error, match):
    with pytest.raises(error, match=match):
        sa.sageattn(*qkv(), attn_mask=mask, **kwargs)
    with pytest.raises(error, match=match):
        sa.sageattn_qk_int8_pv_fp16_triton(*qkv(), attn_mask=mask, **kwargs)


@pytest.mark.parametrize("scale", [0.1, 1])
def test_triton_function_names_a_scale_passed_by_upstreams_position(scale):
    # Upstream's sageattn_qk_int8_pv_fp16_triton has sm_scale 7th; ours has attn_mask there. The
    # error said only "attn_mask must be a torch.Tensor, got float" for a call that passed a scale.
    with pytest.raises(TypeError, match=rf"upstream SageAttention's 7th is sm_scale.*sm_scale={scale}"):
        sa.sageattn_qk_int8_pv_fp16_triton(*qkv(), "HND", "triton", False, scale)


def test_masks_that_broadcast_are_accepted():
    problem = inputs.check_qkv(*qkv(b=2), "HND")
    target = (problem.batch, problem.q_heads, problem.q_len, problem.kv_len)
    g = torch.Generator().manual_seed(0)
    for shape in [(16,), (16, 16), (1, 16, 16), (2, 1, 1, 16), (2, 2, 16, 16)]:
        mask = torch.rand(shape, generator=g) > 0.5
        out = inputs.check_mask(mask, problem, False)
        # the same mask, at least 2-D (torch's SDPA indexes dim -2), broadcasting to the same values
        assert out.dtype == torch.bool and out.dim() == max(2, mask.dim())
        assert torch.equal(out.expand(target), mask.expand(target))
    additive = torch.randn(16, 16, dtype=torch.float32, generator=g)
    assert inputs.check_mask(additive, problem, False) is additive  # nothing to reshape: as given
    assert inputs.check_mask(None, problem, False) is None


def varlen_inputs(lens_q=(5, 7), lens_k=(6, 9), hq=2, hkv=1, d=64):
    q = torch.randn(sum(lens_q), hq, d, dtype=torch.float16)
    k = torch.randn(sum(lens_k), hkv, d, dtype=torch.float16)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, k.clone(), cu_q, cu_k, max(lens_q), max(lens_k)


@pytest.mark.parametrize("edit,error,match", [
    (lambda a: a.__setitem__(3, torch.tensor([1, 5, 12], dtype=torch.int32)), ValueError, "start at 0"),
    (lambda a: a.__setitem__(3, torch.tensor([0, 7, 5, 12], dtype=torch.int32)), ValueError, "non-decreasing"),
    (lambda a: a.__setitem__(3, torch.tensor([0, 5, 11], dtype=torch.int32)), ValueError, "end at the total"),
    (lambda a: a.__setitem__(3, torch.tensor([0, 5, 12], dtype=torch.float32)), TypeError, "int32"),
    (lambda a: a.__setitem__(3, torch.tensor([[0, 5, 12]], dtype=torch.int32)), ValueError, "1-D"),
    (lambda a: a.__setitem__(4, torch.tensor([0, 15], dtype=torch.int32)), ValueError, "different batch"),
    (lambda a: a.__setitem__(5, 6), ValueError, "max_seqlen_q=6 is smaller"),
    (lambda a: a.__setitem__(6, 8.0), TypeError, "max_seqlen_k must be an int"),
    (lambda a: a.__setitem__(0, a[0][None]), ValueError, "3-D"),
    (lambda a: (a.__setitem__(1, a[1][..., :32]), a.__setitem__(2, a[2][..., :32])), ValueError, "head dims"),
    (lambda a: a.__setitem__(2, a[2][..., :32]), ValueError, "k and v shapes differ"),
    (lambda a: (a.__setitem__(0, torch.randn(12, 3, 64, dtype=torch.float16)),
                a.__setitem__(1, torch.randn(15, 2, 64, dtype=torch.float16)),
                a.__setitem__(2, torch.randn(15, 2, 64, dtype=torch.float16))), ValueError, "multiple"),
    (lambda a: a.__setitem__(2, a[2].float()), TypeError, "one dtype"),
])
def test_bad_varlen_inputs(edit, error, match):
    args = list(varlen_inputs())
    edit(args)
    with pytest.raises(error, match=match):
        sa.sageattn_varlen(*args)


def test_unknown_keyword_warns_once_per_function_and_name(monkeypatch):
    monkeypatch.setattr(inputs, "_warned_kwargs", set())
    with pytest.warns(UserWarning, match="'softcap'"):
        inputs.split_kwargs("sageattn", {"softcap": 1.0}, inputs.SAGEATTN_KEYWORDS)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inputs.split_kwargs("sageattn", {"softcap": 2.0}, inputs.SAGEATTN_KEYWORDS)  # no second warning
    with pytest.warns(UserWarning, match="'window'"):
        inputs.split_kwargs("sageattn", {"window": 1}, inputs.SAGEATTN_KEYWORDS)
    # another function warns for itself: its accepted keywords are another list
    with pytest.warns(UserWarning, match=r"sageattn_varlen\(\) ignores .*'softcap'"):
        inputs.split_kwargs("sageattn_varlen", {"softcap": 1.0}, {"scale": None})
