"""sageattn on a second GPU while the first is current, for every backend this build can run there.

Each backend must follow the tensors' device (a device guard around the kernels), never the current
device, and give what the same call gives on the first GPU.
"""

from __future__ import annotations

import pytest
import torch

from sageattention.backends import BACKEND_NAMES

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")


@pytest.mark.parametrize("name", BACKEND_NAMES)
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_second_gpu_gives_the_first_gpus_result(name, layout):
    import sageattention as sa

    if torch.cuda.get_device_capability(0) != torch.cuda.get_device_capability(1):
        pytest.skip("the two GPUs differ; their results may differ by design")
    g = torch.Generator(device="cuda:0").manual_seed(3)
    shape = (2, 4, 333, 128) if layout == "HND" else (2, 333, 4, 128)
    q, k, v = (torch.randn(shape, device="cuda:0", generator=g, dtype=torch.float16) for _ in range(3))
    with sa.force_backend(name):
        try:
            expected, lse0 = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True, return_lse=True)
        except sa.BackendUnavailableError as exc:
            pytest.skip(f"{name} cannot run here: {exc}")
        q1, k1, v1 = (t.to("cuda:1") for t in (q, k, v))
        side = torch.cuda.Stream(device="cuda:1")
        with torch.cuda.device(0), torch.cuda.stream(side):
            out, lse1 = sa.sageattn(q1, k1, v1, tensor_layout=layout, is_causal=True, return_lse=True)
        side.synchronize()
    assert sa.last_backend() == name
    assert out.device == q1.device and lse1.device == q1.device
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=0, atol=2e-3)
    torch.testing.assert_close(lse1.cpu(), lse0.cpu(), rtol=0, atol=1e-4)
