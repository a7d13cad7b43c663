"""torch.compile around the public functions while other threads compile.

torch.compiler.is_compiling(), which core._tracing asks, reads one process-wide flag that torch
holds for a whole compile session. A thread running a compiled graph while another thread compiled
saw it set inside the custom op's real implementation, whose sageattn called the op again, without
end (RecursionError). These tests hold the flag as another thread's compile does, and compile from
several threads at once.
"""

from __future__ import annotations

import threading

import pytest
import torch

import sageattention as sa
from sageattention import traced


def qkv(b=1, hq=4, hkv=2, nq=40, nk=56, d=32):
    g = torch.Generator().manual_seed(11)
    return tuple(torch.randn(b, h, n, d, generator=g) for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))


@pytest.fixture(autouse=True)
def _reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _dense(name):
    fn = getattr(sa, name)
    return lambda q, k, v: fn(q, k, v, is_causal=True, return_lse=True)


DENSE = ["sageattn", "sageattn_qk_int8_pv_fp16_triton", "sageattn_qk_int8_pv_fp16_cuda",
         "sageattn_qk_int8_pv_fp8_cuda", "sageattn_qk_int8_pv_fp8_cuda_sm90"]


@pytest.mark.parametrize("name", DENSE)
def test_compiled_call_runs_while_another_thread_compiles(name, monkeypatch):
    q, k, v = qkv()
    fn = _dense(name)
    expected = fn(q, k, v)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    compiled(q, k, v)   # compiled here; below it only runs
    sa.sageattn(q[:, :, :0], k, v)   # last_backend() None
    # another thread's compile session, as this thread sees it
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    out, lse = compiled(q, k, v)
    torch.testing.assert_close(out, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, expected[1], rtol=0, atol=0)
    assert sa.last_backend() == "sdpa"


def test_the_ops_run_eagerly_while_another_thread_compiles(monkeypatch):
    q, k, v = qkv()
    expected = sa.sageattn(q, k, v, return_lse=True)
    cu = torch.tensor([0, 17, 40], dtype=torch.int32)
    qv, kv, vv = (t[0].transpose(0, 1).contiguous() for t in (q, k, v[:, :, :40]))
    kv = kv[:40]
    expected_varlen = sa.sageattn_varlen(qv, kv, vv, cu, cu, 23, 23, is_causal=True)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    out, lse = traced.sageattn_op(q, k, v, None, "HND", False, None, True, 0.0, None, None, None,
                                  True, False, None)
    torch.testing.assert_close(out, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(lse, expected[1], rtol=0, atol=0)
    slots = [None] * len(traced._SLOTS)
    slots[traced._SLOTS.index("max_seqlen_q")] = slots[traced._SLOTS.index("max_seqlen_k")] = 23
    slots[traced._SLOTS.index("is_causal")] = True
    out, _ = traced.call_op("sageattn_varlen", qv, kv, vv, None, cu, cu, "max_seqlen_q,max_seqlen_k,is_causal",
                            *slots, None)
    torch.testing.assert_close(out, expected_varlen, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["sageattn", "sageattn_qk_int8_pv_fp16_cuda"])
def test_threads_compiling_one_function_at_once_all_get_the_eager_result(name):
    q, k, v = qkv()
    fn = _dense(name)
    expected = fn(q, k, v)
    compiled = torch.compile(fn, fullgraph=True, backend="eager")   # cold: the threads compile it
    errors, start = [], threading.Barrier(4)

    def worker():
        try:
            start.wait()
            for _ in range(4):
                out, lse = compiled(q, k, v)
                if not (torch.equal(out, expected[0]) and torch.equal(lse, expected[1])):
                    errors.append("output differs from eager")
                if sa.last_backend() != "sdpa":
                    errors.append(f"last_backend() {sa.last_backend()!r}")
        except Exception as exc:   # noqa: BLE001 - reported below
            errors.append(repr(exc)[:300])

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_fullgraph_still_traces_one_op_call():
    # the thread-local check is not read while dynamo traces: no graph break, one op in the graph
    q, k, v = qkv()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    out = torch.compile(_dense("sageattn"), fullgraph=True, backend=backend)(q, k, v)
    torch.testing.assert_close(out[0], sa.sageattn(q, k, v, is_causal=True))
    assert len(graphs) == 1
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.sageattention.sageattn.default in targets
