"""GPU test of an audit-30 fix.

quant_int8's kernel loads K's mean by 16-byte vectors (csrc/common/quant_kernels.cuh, load_mean8).
An fp32 mean at an odd storage offset (``flat[1:].view(B, H, D)``) was read at a misaligned
address: a sticky CUDA error. The op (csrc/common/torch_glue.h) now copies such a mean, so both the
raw op and the family wrappers must quantize with it exactly as with
an aligned copy. Each family runs in a child process, so a misaligned read fails the test instead
of poisoning this process's CUDA context. Skipped where there is no GPU, the family is not built,
or the GPU is not one it runs on.
"""
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
MIN_CAP = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0), "sm90_fp8": (9, 0)}

_CHILD = r"""
import json, sys
import torch
import sageattention.native as native
family = sys.argv[1]
module = native.family_module(family)
op = getattr(torch.ops, "sageattention_" + family)
B, H, N, D = 2, 3, 200, 64
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(B, H, N, D, generator=g, device="cuda").half()
flat = torch.randn(B * H * D + 1, generator=g, device="cuda")
odd = flat[1:].view(B, H, D)
assert odd.is_contiguous() and odd.data_ptr() % 16 != 0
aligned = odd.clone()
said = {}
for gran in ("per_warp", "per_thread"):
    want = op.quant_int8(x, aligned, "HND", gran, True, 1.0)
    for name, call in (("raw_op", lambda: op.quant_int8(x, odd, "HND", gran, True, 1.0)),
                       ("wrapper", lambda: module.quant_int8(x, tensor_layout="HND", qk_quant_gran=gran,
                                                            is_key=True, mean=odd))):
        try:
            got = call()
            torch.cuda.synchronize()
            same = all(torch.equal(a, b) for a, b in zip(got, want))
            said[f"{name}_{gran}"] = "SAME" if same else "DIFFERENT"
        except Exception as exc:
            said[f"{name}_{gran}"] = "RAISED " + str(exc).splitlines()[0]
torch.cuda.synchronize()
print(json.dumps(said))
"""


@pytest.mark.parametrize("fam", sorted(MIN_CAP))
def test_quant_int8_reads_a_mean_at_an_odd_offset_as_an_aligned_one(fam):
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
    assert res.returncode == 0, f"the child failed (exit {res.returncode}):\n{res.stderr[-4000:]}"
    said = json.loads(res.stdout.strip().splitlines()[-1])
    assert said and all(v == "SAME" for v in said.values()), json.dumps(said, indent=1)


def _overlapping(t: torch.Tensor, token_stride: int) -> torch.Tensor:
    """t's values where they fit, as windows over one buffer: token i of a head starts token_stride
    elements after token i-1, less than the head dim, so neighbouring tokens share memory."""
    b, h, n, d = t.shape
    buf = torch.empty(b * h * (n * token_stride + d), device=t.device, dtype=t.dtype)
    view = buf.as_strided((b, h, n, d), (h * (n * token_stride + d), n * token_stride + d, token_stride, 1))
    view.copy_(t)   # overlapping writes: the view then holds whatever landed last, read back below
    return view


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_backend_reads_overlapping_key_and_value_windows_as_their_copies(dtype):
    """K and V as as_strided windows whose token stride (8 elements, 16 bytes) is below the head
    dim: they pass the kernels' 16-byte stride rule, so sm90's V reaches the tensor-map encoder as
    given. Each backend that takes the call must give what it gives for contiguous copies."""
    from sageattention import backends

    g = torch.Generator(device="cuda").manual_seed(30)
    q, k, v = (torch.randn(1, 2, 256, 64, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    k_win, v_win = _overlapping(k, 8), _overlapping(v, 8)
    assert k_win.stride(2) == 8 and not k_win.is_contiguous()
    k_copy, v_copy = k_win.contiguous(), v_win.contiguous()
    ran = []
    for name in backends.BACKEND_NAMES:
        with sageattention.force_backend(name):
            try:
                sageattention.select_backend(q, k_win, v_win)
            except sageattention.BackendUnavailableError:
                continue
            got = sageattention.sageattn(q, k_win, v_win)
            assert sageattention.last_backend() == name
            want = sageattention.sageattn(q, k_copy, v_copy)
        torch.cuda.synchronize()
        assert torch.isfinite(got).all(), name
        # the same values in: the same output, up to a kernel choice of SDPA's (a misread gives ~0.1)
        torch.testing.assert_close(got, want, atol=5e-3, rtol=0, msg=lambda m, name=name: f"{name}: {m}")
        ran.append(name)
    assert "sdpa" in ran and len(ran) > 1, f"only {ran} took the call"
