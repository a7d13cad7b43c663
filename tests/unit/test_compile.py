"""torch.compile(fullgraph=True) around sageattn: the dispatcher is hidden in one custom op.

On the CPU every call runs the SDPA fallback inside the op, which is enough to check the op's
contract (fake shapes, validation while tracing, results equal to eager, last_backend, grad path);
tests/gpu covers the kernels themselves under torch.compile.
"""

from __future__ import annotations

import pytest
import torch
from exception_chain import chain_text

import sageattention as sa
from sageattention import inputs, traced


def qkv(layout="HND", b=1, hq=4, hkv=2, nq=40, nk=56, d=32, requires_grad=False):
    g = torch.Generator().manual_seed(5)
    shape = (lambda h, n: (b, h, n, d)) if layout == "HND" else (lambda h, n: (b, n, h, d))
    return tuple(torch.randn(*shape(h, n), generator=g).requires_grad_(requires_grad)
                 for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_fullgraph_matches_eager(backend, layout):
    q, k, v = qkv(layout)

    def fn(q, k, v):
        out, lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True, return_lse=True,
                               sm_scale=0.2)
        return out * 2, lse

    out, lse = torch.compile(fn, fullgraph=True, backend=backend)(q, k, v)
    ref_out, ref_lse = fn(q, k, v)
    assert out.shape == q.shape and lse.shape == (1, 4, 40)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    assert sa.last_backend() == "sdpa"


@pytest.mark.parametrize("shape", [(1, 4, 40, 32), (4, 40, 32)])   # sageattn's path, torch's path
def test_the_drop_in_traces_a_dynamic_scale_with_fullgraph(shape):
    # with dynamic=True a float argument is symbolic; the scale's check (math.isfinite) was a graph
    # break ("torch.* op returned non-Tensor") on the drop-in's torch path
    def fn(q, k, v, scale):
        return sa.scaled_dot_product_attention(q, k, v, scale=scale)

    q = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="eager")
    for scale in (0.5, 0.25, -0.125):
        torch.testing.assert_close(compiled(q, q, q, scale), fn(q, q, q, scale))


def test_fullgraph_with_a_mask_and_options():
    q, k, v = qkv()
    mask = torch.rand(1, 1, 40, 56, generator=torch.Generator().manual_seed(1)) > 0.3

    def fn(q, k, v, mask):
        return sa.sageattn(q, k, v, attn_mask=mask, smooth_k=False, qk_quant_gran="per_warp")

    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, mask)
    torch.testing.assert_close(out, fn(q, k, v, mask))


def test_bad_input_still_names_the_problem_while_tracing():
    q, k, v = qkv()
    fn = torch.compile(lambda q, k, v: sa.sageattn(q, k[..., :16], v), fullgraph=True,
                       backend="eager")
    with pytest.raises(Exception, match="head dims differ"):
        fn(q, k, v)



@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_grad_inputs_trace_with_fullgraph_and_match_eager_gradients(layout):
    # a training step: the dispatcher's answer for grad is SDPA, traced with its backward
    inputs = qkv(layout, requires_grad=True)
    fn = lambda q, k, v: sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True, return_lse=True)  # noqa: E731
    out, lse = torch.compile(fn, fullgraph=True, backend="aot_eager")(*inputs)
    (out.sum() + lse.sum()).backward()
    grads = [t.grad.clone() for t in inputs]
    eager = [t.detach().clone().requires_grad_(True) for t in inputs]
    out_e, lse_e = fn(*eager)
    (out_e.sum() + lse_e.sum()).backward()
    torch.testing.assert_close(out, out_e)
    torch.testing.assert_close(lse, lse_e)
    for got, want in zip(grads, (t.grad for t in eager)):
        torch.testing.assert_close(got, want)
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_grad_path_traces_where_dynamo_cannot_trace_is_autocast_available(monkeypatch):
    """torch 2.11's dynamo refuses torch.amp.is_autocast_available ("marked as skipped"), which
    failed fullgraph grad calls on the GPU runner; 2.14's traces it. Made untraceable here (as
    2.11 has it), the grad path must still trace: it asks autocast's state only in ways both do."""
    monkeypatch.setattr(torch.amp, "is_autocast_available", torch._dynamo.disable(torch.amp.is_autocast_available))
    inputs = qkv(requires_grad=True)
    fn = lambda q, k, v: sa.sageattn(q, k, v, is_causal=True)  # noqa: E731
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(*inputs)
    torch.testing.assert_close(out, fn(*inputs))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.compile(fn, fullgraph=True, backend="aot_eager")(*inputs)
    assert out.dtype == torch.float32   # the fallback computes in q's dtype, as eagerly


def test_a_mask_that_requires_grad_gets_its_gradient_under_fullgraph():
    q, k, v = qkv()
    bias = torch.zeros(1, 1, q.shape[2], k.shape[2], requires_grad=True)
    out = torch.compile(lambda q, k, v, m: sa.sageattn(q, k, v, attn_mask=m), fullgraph=True,
                        backend="aot_eager")(q, k, v, bias)
    (out * torch.arange(out.numel()).view_as(out)).sum().backward()
    assert bias.grad is not None and bias.grad.abs().sum() > 0


@pytest.mark.parametrize("name,kwargs", [
    ("sageattn_qk_int8_pv_fp16_triton", dict(is_causal=True)),
    ("sageattn_qk_int8_pv_fp16_cuda", dict(pv_accum_dtype="fp16+fp32")),
    ("sageattn_qk_int8_pv_fp8_cuda", dict(smooth_v=True)),
])
def test_kernel_specific_functions_with_grad_trace_with_fullgraph(name, kwargs):
    inputs = qkv(requires_grad=True)
    fn = getattr(sa, name)
    out = torch.compile(lambda q, k, v: fn(q, k, v, **kwargs), fullgraph=True, backend="aot_eager")(*inputs)
    out.sum().backward()
    eager = [t.detach().clone().requires_grad_(True) for t in inputs]
    fn(*eager, **kwargs).sum().backward()
    for got, want in zip(inputs, eager):
        torch.testing.assert_close(got.grad, want.grad)


def test_grad_inputs_under_no_grad_take_the_op():
    q, k, v = qkv(requires_grad=True)
    fn = torch.compile(lambda q, k, v: sa.sageattn(q, k, v), fullgraph=True, backend="eager")
    with torch.no_grad():
        out = fn(q, k, v)
    assert not out.requires_grad
    torch.testing.assert_close(out, sa.sageattn(q.detach(), k.detach(), v.detach()))


def test_grad_inputs_with_a_forced_quantized_backend_still_refuse_under_fullgraph():
    q, k, v = qkv(requires_grad=True)
    fn = torch.compile(lambda q, k, v: sa.sageattn(q, k, v), fullgraph=True, backend="eager")
    with sa.force_backend("triton-fp16"), pytest.raises(Exception) as info:
        fn(q, k, v)
    assert "forced" in chain_text(info.value) and "require grad" in chain_text(info.value)
    with sa.force_backend("sdpa"):
        torch.testing.assert_close(fn(q, k, v), sa.sageattn(q, k, v))


def test_bad_grad_input_still_names_the_problem_under_fullgraph():
    q, k, v = qkv(requires_grad=True)
    fn = torch.compile(lambda q, k, v: sa.sageattn(q, k[..., :16], v), fullgraph=True, backend="eager")
    with pytest.raises(Exception) as info:
        fn(q, k, v)
    assert "head dims differ" in chain_text(info.value)


def test_the_op_passes_opcheck():
    q, k, v = qkv()
    args = (q, k, v, None, "HND", False, None, True, 0.0, None, None, None, True, False, None)
    torch.library.opcheck(traced.sageattn_op, args)
    # a scale that is data (a 0-d tensor or a numpy float) rides in the tensor slot
    args = (q, k, v, None, "HND", False, None, True, 0.0, None, None, None, True, False, torch.tensor(0.2))
    torch.library.opcheck(traced.sageattn_op, args)


def test_arguments_the_schema_cannot_carry_take_the_eager_path():
    q, k, v = qkv()
    # smooth_k must be a bool: the eager path raises sageattn's own TypeError while tracing
    fn = torch.compile(lambda q, k, v: sa.sageattn(q, k, v, smooth_k="yes"), backend="eager")
    with pytest.raises(Exception, match="smooth_k"):
        fn(q, k, v)


def test_sm_scale_and_the_same_scale_trace_with_fullgraph():
    # both aliases given and equal is a valid call (eager takes it); it took the eager path, which
    # is a graph break, so fullgraph=True failed ("Attempted to call function marked as skipped")
    q, k, v = qkv()
    fn = torch.compile(lambda q, k, v: sa.sageattn(q, k, v, sm_scale=0.25, scale=0.25), fullgraph=True,
                       backend="eager")
    torch.testing.assert_close(fn(q, k, v), sa.sageattn(q, k, v, sm_scale=0.25))
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: sa.sageattn(q, k, v, sm_scale=0.25, scale=0.5), fullgraph=True,
                       backend="eager")
    with pytest.raises(Exception) as info:
        fn(q, k, v)
    assert "sm_scale=0.25 and scale=0.5 disagree" in chain_text(info.value)


# --- the other five functions: one generic op --------------------------------------------------

SPECIFIC = [
    ("sageattn_qk_int8_pv_fp16_triton", dict(is_causal=True, return_lse=True)),
    ("sageattn_qk_int8_pv_fp16_cuda", dict(pv_accum_dtype="fp16+fp32", qk_quant_gran="per_warp")),
    ("sageattn_qk_int8_pv_fp8_cuda", dict(is_causal=True, return_lse=True, smooth_v=True)),
    ("sageattn_qk_int8_pv_fp8_cuda_sm90", dict(tensor_layout="NHD")),
]


@pytest.mark.parametrize("name,kwargs", SPECIFIC, ids=[s[0] for s in SPECIFIC])
def test_kernel_specific_functions_trace_with_fullgraph(name, kwargs):
    fn = getattr(sa, name)
    q, k, v = qkv(kwargs.get("tensor_layout", "HND"))
    compiled = torch.compile(lambda q, k, v: fn(q, k, v, **kwargs), fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v), fn(q, k, v, **kwargs)
    if kwargs.get("return_lse"):
        torch.testing.assert_close(got[1], want[1])
        got, want = got[0], want[0]
    torch.testing.assert_close(got, want)
    assert sa.last_backend() == "sdpa"  # CPU tensors: the input itself needs SDPA


def test_triton_function_takes_its_mask_under_fullgraph():
    q, k, v = qkv()
    mask = torch.zeros(40, 56)
    mask[:, 30:] = float("-inf")
    fn = torch.compile(lambda q, k, v, m: sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, attn_mask=m),
                       fullgraph=True, backend="eager")
    torch.testing.assert_close(fn(q, k, v, mask), sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, attn_mask=mask))


def test_varlen_traces_with_fullgraph():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(100, 4, 32, generator=g) for _ in range(3))
    cu = torch.tensor([0, 17, 60, 100], dtype=torch.int32)

    def fn(q, k, v, cu):
        return sa.sageattn_varlen(q, k, v, cu, cu, 43, 43, is_causal=True)

    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, cu)
    torch.testing.assert_close(out, fn(q, k, v, cu))


def test_bad_options_of_a_specific_function_still_name_the_problem():
    q, k, v = qkv()
    fn = torch.compile(lambda q, k, v: sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, pv_accum_dtype="fp64"),
                       fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="pv_accum_dtype='fp64' is not accepted"):
        fn(q, k, v)
    # a choice only the function itself rejects (fp8 accumulators on the fp16 function): when the
    # graph runs, as the same ValueError eager code raises
    fn = torch.compile(
        lambda q, k, v: sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, pv_accum_dtype="fp32+fp32"),
        fullgraph=True, backend="eager")
    with pytest.raises(ValueError, match="pv_accum_dtype"):
        fn(q, k, v)


@pytest.mark.parametrize("name,kwargs", [
    ("sageattn_qk_int8_pv_fp16_triton", dict(pv_accum_dtype="fp64", qk_quant_gran="per_tensor")),
    ("sageattn_qk_int8_pv_fp8_cuda_sm90", dict(smooth_v=None)),
])
def test_a_keyword_the_function_ignores_is_not_checked_while_tracing(name, kwargs, monkeypatch):
    # eager code ignores (with a warning) a keyword the function does not take; the fake
    # validated it as sageattn's own and failed the trace ("pv_accum_dtype='fp64' is not accepted")
    monkeypatch.setattr(inputs, "_warned_kwargs", set())   # each warns once per process
    fn = getattr(sa, name)
    q, k, v = qkv()
    with pytest.warns(UserWarning, match="ignores the unknown keyword"):
        want = fn(q, k, v, **kwargs)
    compiled = torch.compile(lambda q, k, v: fn(q, k, v, **kwargs), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, k, v), want)


def test_the_generic_op_passes_opcheck():
    q, k, v = qkv()
    names = "tensor_layout,is_causal,qk_quant_gran,sm_scale,pv_accum_dtype,smooth_k,smooth_v,return_lse"
    slots = ["HND", None, True, "per_thread", None, "fp32", True, False, True, None, None, None,
             None, None]
    torch.library.opcheck(traced.call_op, ("sageattn_qk_int8_pv_fp16_cuda", q, k, v, None, None, None,
                                           names, *slots, None))
    slots[4] = None   # sm_scale as data: "@sm_scale" takes the tensor slot
    torch.library.opcheck(traced.call_op, ("sageattn_qk_int8_pv_fp16_cuda", q, k, v, None, None, None,
                                           names.replace("sm_scale", "@sm_scale"), *slots, torch.tensor(0.2)))


@pytest.mark.parametrize("name", ["sageattn", "drop-in", "sageattn_qk_int8_pv_fp16_triton",
                                  "sageattn_qk_int8_pv_fp16_cuda", "sageattn_varlen"])
def test_fake_cuda_tensors_get_their_shapes_without_a_gpu(name):
    # FakeTensorMode (shape propagation, export tooling): torch's SDPA gives fake CUDA tensors
    # their shapes on a machine without a GPU; sageattn asked the driver for the device's compute
    # capability ("Found no NVIDIA driver"), and varlen read the fake offsets' values
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, 40, 64, dtype=torch.float16, device="cuda")
        k = v = torch.empty(2, 2, 56, 64, dtype=torch.float16, device="cuda")
        if name == "sageattn":
            out, lse = sa.sageattn(q, k, v, is_causal=True, return_lse=True)
            assert lse.shape == (2, 4, 40) and lse.dtype == torch.float32
        elif name == "drop-in":
            out = sa.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        elif name == "sageattn_varlen":
            cu = torch.tensor([0, 40, 80], dtype=torch.int32, device="cuda")
            packed = q.reshape(80, 4, 64)
            out = sa.sageattn_varlen(packed, packed, packed, cu, cu, 40, 40)
            assert out.shape == packed.shape
            out = out.reshape(q.shape)
        else:
            out = getattr(sa, name)(q, k, v)
        assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "cuda"
        with pytest.raises(ValueError, match="head dims differ"):
            sa.sageattn(q, k[..., :32], v)
