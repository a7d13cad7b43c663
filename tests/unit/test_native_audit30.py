"""No-GPU tests of a native wrapper defect (audit 30): the sm80 family's smooth_v converted any
bfloat16 V to fp16, so an fp16 q with a bfloat16 V, which the op refuses, ran when smooth_v=True
(and only then).
"""
from __future__ import annotations

import pytest
import torch

from bindings_source import family_schemas
from sageattention.native import checks, register_qk_int8_pv_fp16_fake, sm80



@pytest.fixture
def sm80_attention_on_fake(monkeypatch):
    """sm80.qk_int8_pv_fp16 calling the bindings' schema with the module's fake behind it (the
    op's checks, in Python), on meta tensors."""
    namespace = "sageattention_sm80_audit30_attn"
    lib = torch.library.Library(namespace, "DEF")
    (schema,) = [s for s in family_schemas("sm80") if s.startswith("qk_int8_pv_fp16(")]
    lib.define(schema)
    register_qk_int8_pv_fp16_fake(namespace, "sm80")
    monkeypatch.setattr(sm80, "load", lambda: None)
    monkeypatch.setattr(sm80, "_attention_op", getattr(torch.ops, namespace).qk_int8_pv_fp16)
    yield
    lib._destroy()


def _sm80_call(q, k, v, smooth_v, accum="fp16"):
    return sm80.qk_int8_pv_fp16(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=0.125,
                                qk_quant_gran="per_warp", pv_accum_dtype=accum, smooth_k=True,
                                smooth_v=smooth_v, return_lse=False)


@pytest.mark.parametrize("accum", ["fp16", "fp16+fp32"])
@pytest.mark.parametrize("smooth_v", [False, True])
def test_sm80_refuses_fp16_q_with_bf16_v_whatever_smooth_v(sm80_attention_on_fake, smooth_v, accum):
    q = torch.empty(1, 2, 70, 64, dtype=torch.float16, device="meta")
    v = torch.empty(1, 2, 70, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(checks.OpArgumentError, match=r"q, k and v must have one dtype .* got torch.float16, "
                                                     r"torch.float16, torch.bfloat16"):
        _sm80_call(q, q, v, smooth_v, accum)


@pytest.mark.parametrize("accum", ["fp16", "fp16+fp32"])
def test_sm80_smooth_v_still_takes_bf16_v_to_fp16_beside_bf16_q(sm80_attention_on_fake, accum):
    q = torch.empty(1, 2, 70, 64, dtype=torch.bfloat16, device="meta")
    out, lse = _sm80_call(q, q, q, True, accum)
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and lse is None
