"""The GPU fuzz tier's draw (tests/gpu/fuzz_cases.py) on the Triton kernels, in Triton's interpreter
on the CPU: every draw of at most MAX_TOKENS keys and queries and MAX_ROWS batch x heads goes
through `sageattention.triton.attention` with FP16 and with FP8 P.V, in the draw's layout, dtype,
input view (sliced head dim, transposed layout, every other token, batch-broadcast K/V), GQA,
causal mask and scale, and is checked by the fuzz tier's own `check_call` (shape, dtype, no NaN,
design.md's bars against float64 attention, the LSE) against the same bars as on the GPU.

So CI, which has no GPU, runs the Triton kernels' index and stride logic on the same draws the GPU
tier uses. The interpreter runs the kernels' arithmetic in numpy, not on tensor cores: this
checks what the kernels compute, not how fast or with which instructions. Zero and negative
scales are not drawn here (the Triton function takes positive scales; `sageattn` routes the
others). Runs in one TRITON_INTERPRET=1 subprocess (interpreter_worker.py says why).
"""
from __future__ import annotations

import json
import sys

import pytest
from interpreter_worker import REPO, run_worker

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

sys.path.insert(0, str(REPO / "tests" / "gpu"))
import fuzz_cases as fc  # noqa: E402  (a helper of the GPU tier)

MAX_TOKENS = 257   # the interpreter's time grows with the tiles; 257 keeps tails of 128 and 64
MAX_ROWS = 8       # batch x query heads
PV_OPS = {"fp16": "qk_int8_pv_fp16", "fp8": "qk_int8_pv_fp8"}


def _worker() -> dict:
    from sageattention import triton as st

    checked, failures, drawn, views = [], [], 0, set()
    for case in fc.CASES:
        if max(case.q_len, case.kv_len) > MAX_TOKENS or case.batch * case.q_heads > MAX_ROWS:
            continue
        drawn += 1
        views.add(case.view)
        q, k, v = fc.make_inputs(case, device="cpu")
        ref_out, ref_lse = fc.expected(q, k, v, case.layout, case.causal, case.scale)
        for pv, op in PV_OPS.items():
            label = f"{case} triton {pv}"
            try:
                out, lse = st.attention(q, k, v, tensor_layout=case.layout, is_causal=case.causal,
                                        sm_scale=case.scale, return_lse=case.return_lse, pv_dtype=pv)
                fc.check_call(label, out, lse, ref_out, ref_lse, q, fc.bars_for(op, case),
                              case.scale, case.head_dim)
            except Exception as exc:  # every failure is reported, not only the first
                failures.append(f"{label}: {type(exc).__name__}: {exc}"[:600])
            else:
                checked.append(label)
    return {"drawn": drawn, "checked": checked, "failures": failures, "views": sorted(views)}


@pytest.fixture(scope="module")
def interp_fuzz():
    return run_worker(__file__, timeout=900)


def test_the_fuzz_draw_on_the_triton_kernels_meets_the_gpu_bars(interp_fuzz):
    assert not interp_fuzz["failures"], "\n".join(interp_fuzz["failures"])
    # both P.V types on every small draw, and enough of the draw to mean something
    assert len(interp_fuzz["checked"]) == 2 * interp_fuzz["drawn"] >= 2 * 8, interp_fuzz["drawn"]


def test_the_small_draws_cover_every_input_view(interp_fuzz):
    assert interp_fuzz["views"] == sorted(fc.VIEWS), interp_fuzz["views"]


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(_worker()))
