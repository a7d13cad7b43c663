"""torch.compile on a GPU while other threads compile (sageattention/traced.py).

torch.compiler.is_compiling() reads one process-wide flag held for a whole compile session: a
thread running a compiled graph while another compiled re-entered the custom op from its own
implementation (RecursionError). Here the threads compile one function at once on CUDA tensors and
each must get the eager result and its own last_backend(); one thread forces a backend for itself.
"""

from __future__ import annotations

import threading

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("name", ["sageattn", "sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp16_triton"])
def test_threads_compiling_at_once_get_the_eager_result(name, monkeypatch):
    import sageattention as sa

    torch._dynamo.reset()
    fn = getattr(sa, name)
    g = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (torch.randn(1, 8, 300, 128, device="cuda", generator=g, dtype=torch.float16) for _ in range(3))
    try:
        expected = fn(q, k, v, is_causal=True)
    except sa.BackendUnavailableError as exc:
        pytest.skip(f"{name} cannot run here: {exc}")
    ran = sa.last_backend()
    compiled = torch.compile(lambda q, k, v: fn(q, k, v, is_causal=True), fullgraph=True, backend="aot_eager")
    # torch 2.11 keeps FX's "tracing now" flag process-wide (later releases keep it per thread): one
    # thread's AOT trace makes another thread's compiled call raise "Detected that you are using FX to
    # symbolically trace a dynamo-optimized function". That is torch's, not ours; with this off the
    # other thread runs the function eagerly, which must still give the eager result and backend.
    monkeypatch.setattr(torch._dynamo.config, "error_on_nested_fx_trace", False)
    errors, start = [], threading.Barrier(4)

    def worker(forced):
        try:
            start.wait()
            for _ in range(3):
                if forced:
                    with sa.force_backend("sdpa"):
                        compiled(q, k, v)
                    want = "sdpa"
                else:
                    out = compiled(q, k, v)
                    torch.cuda.synchronize()
                    if not torch.equal(out, expected):
                        errors.append("output differs from eager")
                    want = ran
                if sa.last_backend() != want:
                    errors.append(f"last_backend() {sa.last_backend()!r}, expected {want!r}")
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(repr(exc)[:300])

    # one sageattn thread forces SDPA for itself (force_backend is per thread)
    threads = [threading.Thread(target=worker, args=(i == 0 and name == "sageattn",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
