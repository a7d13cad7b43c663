"""GPU tests of the raw ops' argument checks (csrc/common/op_checks.h): every family's ops called
straight (``torch.ops.sageattention_<family>.*``) with one bad argument each raise, naming it, and
never crash the process, read out of bounds or return NaN. The calls run in a child process per
family (a crash there, SIGFPE or an illegal address, fails the test instead of killing pytest).
Skipped where there is no GPU, the family is not built, or the GPU is not one it runs on."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import sageattention
import sageattention.native as native

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ONLY_ON = {"sm90": (9, 0), "sm90_fp8": (9, 0)}
MIN_CAP = {"sm75": (7, 5), "sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0), "sm90_fp8": (9, 0)}

# Run in the child: `family` names the family; prints one JSON line {case: "RAISED <message>" | "RETURNED"}.
_CHILD = r"""
import json, sys
import torch
import sageattention.native as native
family = sys.argv[1]
native.family_module(family).load()
op = getattr(torch.ops, "sageattention_" + family)
dev = "cuda"
def t(*shape, dtype=torch.float16, device=dev):
    return torch.randn(shape, device=device).to(dtype)
q, kv = t(1, 2, 70, 64), t(1, 1, 33, 64)
def attn(q, k, v, layout="HND", sm_scale=0.125, gran="per_warp", accum=None):
    if family == "sm75":
        return op.qk_int8_pv_fp16(q, k, v, layout, False, sm_scale, gran, True, True)
    if family in ("sm80", "sm90"):
        return op.qk_int8_pv_fp16(q, k, v, layout, False, sm_scale, gran, accum or "fp32", True, True)
    return op.qk_int8_pv_fp8(q, k, v, layout, False, sm_scale, gran, accum or "fp32", True, False, True)
big = torch.zeros(1, 1, 1, 64, dtype=torch.float16, device=dev).expand(1, 1, (1 << 30) + 1, 64)
cases = {
    "k_on_cpu": lambda: attn(q, kv.cpu(), kv),
    "v_float32": lambda: attn(q, kv, kv.float()),
    "v_3d": lambda: attn(q, kv, kv[0]),
    "head_dim_96": lambda: attn(t(1, 2, 70, 96), t(1, 1, 33, 96), t(1, 1, 33, 96)),
    "batch_0": lambda: attn(t(0, 2, 70, 64), t(0, 1, 33, 64), t(0, 1, 33, 64)),
    "q_heads_0": lambda: attn(t(1, 0, 70, 64), kv, kv),
    "kv_tokens_differ": lambda: attn(q, kv, t(1, 1, 34, 64)),
    "q_tokens_past_limit": lambda: attn(big, kv, kv),
    "sm_scale_nan": lambda: attn(q, kv, kv, sm_scale=float("nan")),
    "sm_scale_inf": lambda: attn(q, kv, kv, sm_scale=float("inf")),
    "layout": lambda: attn(q, kv, kv, layout="BHND"),
    "gran": lambda: attn(q, kv, kv, gran="per_token"),
}
if family != "sm75":
    x = t(1, 3, 70, 64)
    quant = lambda x, mean=None, mult=1.0: op.quant_int8(x, mean, "HND", "per_warp", True, mult)
    cases.update({
        "accum": lambda: attn(q, kv, kv, accum="fp64"),
        "quant_head_dim_0": lambda: quant(t(1, 3, 70, 0)),
        "quant_head_dim_12": lambda: quant(t(1, 3, 70, 12)),
        "quant_x_float32": lambda: quant(x.float()),
        "quant_x_on_cpu": lambda: quant(x.cpu()),
        "quant_scale_mult_nan": lambda: quant(x, mult=float("nan")),
        "quant_tokens_past_limit": lambda: quant(torch.zeros(1, 1, 1, 8, dtype=torch.float16, device=dev)
                                                 .expand(1, 1, (1 << 30) + 1, 8)),
        "mean_on_cpu": lambda: quant(x, torch.zeros(1, 3, 64)),
        "mean_int32": lambda: quant(x, torch.zeros(1, 3, 64, dtype=torch.int32, device=dev)),
        "mean_wrong_order": lambda: quant(x, torch.zeros(1, 64, 3, device=dev)),
        "mean_flat": lambda: quant(x, torch.zeros(192, device=dev)),
        "mean_4d": lambda: quant(x, torch.zeros(1, 3, 1, 64, device=dev)),
    })
    if torch.cuda.device_count() > 1:
        cases["mean_on_other_gpu"] = lambda: quant(x, torch.zeros(1, 3, 64, device="cuda:1"))
if family in ("sm89", "sm90_fp8"):
    vq = lambda v: op.quant_v_fp8(v, "HND", False)
    cases.update({
        "v8_head_dim_0": lambda: vq(t(1, 2, 70, 0)),
        "v8_head_dim_256": lambda: vq(t(1, 2, 70, 256)),
        "v8_tokens_0": lambda: vq(t(1, 2, 0, 64)),
        "v8_int32": lambda: vq(torch.zeros(1, 2, 70, 64, dtype=torch.int32, device=dev)),
    })
said = {}
for name, call in cases.items():
    try:
        call()
        torch.cuda.synchronize()
        said[name] = "RETURNED"
    except (RuntimeError, ValueError) as exc:
        said[name] = "RAISED " + str(exc).splitlines()[0]
torch.cuda.synchronize()   # no sticky error left behind by a launch
print(json.dumps(said))
"""

EXPECTED = {
    "k_on_cpu": "k must be a CUDA tensor, got one on cpu",
    "v_float32": "v must be float16 or bfloat16, got torch.float32",
    "v_3d": "v must be 4-D",
    "head_dim_96": "head dim must be 64 or 128, got 96",
    "batch_0": "need a batch, heads and tokens (at least one of each), got batch 0",
    "q_heads_0": "q 0 heads",
    "kv_tokens_differ": "k and v must have the same heads and tokens",
    "q_tokens_past_limit": "q has 1073741825 tokens; the kernels take at most 1073741824",
    "sm_scale_nan": "sm_scale must be finite, got nan",
    "sm_scale_inf": "sm_scale must be finite, got inf",
    "layout": "tensor_layout must be 'HND' or 'NHD', got 'BHND'",
    "gran": "qk_quant_gran must be",
    "accum": "got 'fp64'",
    "quant_head_dim_0": "head dim must be a multiple of 8 from 8 to 256, got 0",
    "quant_head_dim_12": "head dim must be a multiple of 8 from 8 to 256, got 12",
    "quant_x_float32": "x must be float16 or bfloat16, got torch.float32",
    # torch's dispatcher refuses it before our op runs: the op has no CPU kernel (H100, cb54be5)
    "quant_x_on_cpu": "from the 'CPU' backend",
    "quant_scale_mult_nan": "scale_mult must be finite, got nan",
    "quant_tokens_past_limit": "x has 1073741825 tokens",
    "mean_on_cpu": "mean is on cpu but x is on cuda",
    "mean_int32": "mean must be a floating-point [B, H, D] = [1, 3, 64] tensor",
    "mean_wrong_order": "got shape (1, 64, 3)",
    "mean_flat": "got shape (192,)",
    "mean_4d": "got shape (1, 3, 1, 64)",
    "mean_on_other_gpu": "mean is on cuda:1 but x is on cuda:0",
    "v8_head_dim_0": "head dim must be a multiple of 8 from 8 to 128, got 0",
    "v8_head_dim_256": "head dim must be a multiple of 8 from 8 to 128, got 256",
    "v8_tokens_0": "v needs at least one token",
    "v8_int32": "v must be float16 or bfloat16, got torch.int32",
}


@pytest.mark.parametrize("fam", sorted(MIN_CAP))
def test_raw_ops_refuse_each_bad_argument_in_words(fam):
    cap = torch.cuda.get_device_capability()
    if fam in ONLY_ON and cap != ONLY_ON[fam]:
        pytest.skip(f"family {fam} runs only on compute capability {ONLY_ON[fam]}, this GPU is {cap}")
    if cap < MIN_CAP[fam]:
        pytest.skip(f"family {fam} needs compute capability >= {MIN_CAP[fam]}")
    reason = native.available_families()[fam]
    if reason is not None:
        pytest.skip(reason)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(sageattention.__file__)))
    res = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _CHILD, fam], capture_output=True,
                         text=True, timeout=600, env=env)
    assert res.returncode == 0, f"a bad call killed the process (exit {res.returncode}):\n{res.stderr[-4000:]}"
    said = json.loads(res.stdout.strip().splitlines()[-1])
    wrong = {name: got for name, got in said.items()
             if not (got.startswith("RAISED ") and EXPECTED[name] in got)}
    assert not wrong, json.dumps(wrong, indent=1)


@pytest.mark.parametrize("fam", ["sm80", "sm89", "sm90", "sm90_fp8"])
def test_quant_int8_of_an_empty_batch_returns_empty_outputs(fam):
    cap = torch.cuda.get_device_capability()
    if (fam in ONLY_ON and cap != ONLY_ON[fam]) or cap < MIN_CAP[fam] or native.available_families()[fam]:
        pytest.skip(f"family {fam} is not usable here")
    native.family_module(fam).load()
    op = getattr(torch.ops, f"sageattention_{fam}")
    x = torch.randn(0, 3, 70, 64, device="cuda", dtype=torch.float16)
    xi8, scale = op.quant_int8(x, None, "HND", "per_thread", False, 1.0)
    assert xi8.shape == (0, 3, 128, 64) and scale.shape == (0, 3, 32)
    xi8, scale = op.quant_int8(torch.randn(1, 3, 0, 64, device="cuda", dtype=torch.float16), None, "HND",
                               "per_warp", True, 1.0)
    assert xi8.shape == (1, 3, 0, 64) and scale.shape == (1, 3, 0)
    if fam in ("sm89", "sm90_fp8"):
        v8, vs, vm = op.quant_v_fp8(x, "HND", True)
        assert v8.shape[:2] == (0, 3) and vs.shape == (0, 3, 64) and vm.shape == (0, 3, 64)
    torch.cuda.synchronize()
