"""torch.compile(fullgraph=True) around sageattn: the dispatcher is hidden in one custom op.

On the CPU every call runs the SDPA fallback inside the op, which is enough to check the op's
contract (fake shapes, validation while tracing, results equal to eager, last_backend, grad path);
tests/gpu covers the kernels themselves under torch.compile.
"""

from __future__ import annotations

import pytest
import torch

import sageattention as sa
from sageattention import traced


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


def test_grad_inputs_take_the_eager_path_and_get_gradients():
    q, k, v = qkv(requires_grad=True)
    out = torch.compile(lambda q, k, v: sa.sageattn(q, k, v), backend="aot_eager")(q, k, v)
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_the_op_passes_opcheck():
    q, k, v = qkv()
    args = (q, k, v, None, "HND", False, None, True, 0.0, None, None, None, True, False)
    torch.library.opcheck(traced.sageattn_op, args)


def test_arguments_the_schema_cannot_carry_take_the_eager_path():
    q, k, v = qkv()
    # smooth_k must be a bool: the eager path raises sageattn's own TypeError while tracing
    fn = torch.compile(lambda q, k, v: sa.sageattn(q, k, v, smooth_k="yes"), backend="eager")
    with pytest.raises(Exception, match="smooth_k"):
        fn(q, k, v)
