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
others). Runs in one subprocess with TRITON_INTERPRET=1 (Triton decides interpreter-or-compile
at import: see test_triton_interpret.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
MAX_TOKENS = 257   # the interpreter's time grows with the tiles; 257 keeps tails of 128 and 64
MAX_ROWS = 8       # batch x query heads
PV_OPS = {"fp16": "qk_int8_pv_fp16", "fp8": "qk_int8_pv_fp8"}


def _worker() -> dict:
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import fuzz_cases as fc

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
    return {"drawn": drawn, "checked": checked, "failures": failures, "views": sorted(views),
            "all_views": list(fc.VIEWS)}


@pytest.fixture(scope="module")
def interp_fuzz():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, __file__, "--worker"], env=env, capture_output=True,
                          text=True, timeout=900, cwd=REPO)
    if proc.returncode != 0:
        pytest.fail(f"interpreter worker failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_fuzz_draw_on_the_triton_kernels_meets_the_gpu_bars(interp_fuzz):
    assert not interp_fuzz["failures"], "\n".join(interp_fuzz["failures"])
    # both P.V types on every small draw, and enough of the draw to mean something
    assert len(interp_fuzz["checked"]) == 2 * interp_fuzz["drawn"] >= 2 * 8, interp_fuzz["drawn"]


def test_the_small_draws_cover_every_input_view(interp_fuzz):
    assert interp_fuzz["views"] == sorted(interp_fuzz["all_views"]), interp_fuzz["views"]


if __name__ == "__main__" and "--worker" in sys.argv:
    print(json.dumps(_worker()))
