"""torch.compile(fullgraph=True) around sageattn on a GPU, for every backend this build can run.

The dispatcher is one opaque custom op under tracing (sageattention/traced.py); the backend is
chosen when the compiled graph runs, so forcing one around the compiled call must take effect.
"""

from __future__ import annotations

import pytest
import torch

from sageattention.backends import BACKEND_NAMES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("name", BACKEND_NAMES)
@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
def test_fullgraph_compiled_sageattn_runs_the_forced_backend(name, compile_backend):
    import sageattention as sa

    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(2, 8, 300, 128, device="cuda", generator=g, dtype=torch.float16)
               for _ in range(3))
    with sa.force_backend(name):
        try:
            expected = sa.sageattn(q, k, v, is_causal=True)
        except sa.BackendUnavailableError as exc:
            pytest.skip(f"{name} cannot run here: {exc}")

    def fn(q, k, v):
        return sa.sageattn(q, k, v, is_causal=True) * 2

    compiled = torch.compile(fn, fullgraph=True, backend=compile_backend)
    with sa.force_backend(name):
        out = compiled(q, k, v)
    assert sa.last_backend() == name
    torch.testing.assert_close(out, expected * 2, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp8_cuda",
                                  "sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattn_qk_int8_pv_fp16_triton"])
def test_fullgraph_kernel_specific_functions(name):
    import sageattention as sa

    torch._dynamo.reset()
    fn = getattr(sa, name)
    g = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(1, 4, 257, 64, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    try:
        expected = fn(q, k, v, is_causal=True)
    except sa.BackendUnavailableError as exc:
        pytest.skip(f"{name} cannot run here: {exc}")
    ran = sa.last_backend()
    out = torch.compile(lambda q, k, v: fn(q, k, v, is_causal=True), fullgraph=True)(q, k, v)
    assert sa.last_backend() == ran
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_fullgraph_varlen():
    import sageattention as sa

    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (torch.randn(3000, 8, 128, device="cuda", generator=g, dtype=torch.float16)
               for _ in range(3))
    cu = torch.tensor([0, 1, 1000, 3000], dtype=torch.int32, device="cuda")
    expected = sa.sageattn_varlen(q, k, v, cu, cu, 2000, 2000, is_causal=True)
    out = torch.compile(lambda q, k, v: sa.sageattn_varlen(q, k, v, cu, cu, 2000, 2000, is_causal=True),
                        fullgraph=True)(q, k, v)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fullgraph_with_inputs_that_require_grad(dtype):
    """Grad inputs trace the SDPA path (the only one the dispatcher allows them, with torch's
    backward); under no_grad the same compiled function runs a quantized kernel again."""
    import sageattention as sa

    torch._dynamo.reset()
    g = torch.Generator(device="cuda").manual_seed(6)
    q, k, v = (torch.randn(2, 8, 1000, 128, device="cuda", generator=g, dtype=dtype).requires_grad_()
               for _ in range(3))

    def fn(q, k, v):
        return sa.sageattn(q, k, v, is_causal=True)

    def grads(run):
        for t in (q, k, v):
            t.grad = None
        out = run(q, k, v)
        out.float().square().sum().backward()
        return out.detach(), [t.grad.clone() for t in (q, k, v)]

    compiled = torch.compile(fn, fullgraph=True)
    out, dqkv = grads(compiled)  # (a traced grad call leaves last_backend() alone: docs/api.md)
    ref, ref_dqkv = grads(fn)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for got, want in zip(dqkv, ref_dqkv):
        torch.testing.assert_close(got, want)
    with torch.no_grad(), sa.use_calibration(False):  # the static order: a native kernel first
        quantized = compiled(q, k, v)
        ran = sa.last_backend()
        if ran == "sdpa":
            pytest.skip(f"no quantized backend runs {dtype} on this GPU: {sa.explain(q, k, v)}")
    cos = torch.nn.functional.cosine_similarity(quantized.float().flatten(), ref.float().flatten(), dim=0)
    assert cos > 0.999, (ran, cos.item())
