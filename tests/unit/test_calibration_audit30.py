"""Audit of the calibrated dispatch: times at the ends of float's range, a broken model table of
yours beside a good one, force_backend's process-wide name across threads."""

import json
import logging
import math
import threading

import pytest
import torch

from sageattention import calibration, dispatch
from sageattention.dispatch import Inventory, Request, choose

FAMILIES = ("sm75", "sm80", "sm89", "sm90", "sm90_fp8")
H200 = "NVIDIA H200"


def inv(*families):
    native = {f: (None if f in families else "not in this build") for f in FAMILIES}
    return Inventory(native=native, triton=(True, "ok"))


def req(*, b=1, h=32, n=2048, d=128, causal=False, **kw):
    base = dict(device_type="cuda", capability=(9, 0), dtype=torch.float16, head_dim=d,
                batch_heads=b * h, batch=b, q_heads=h, seq_q=n, seq_k=n, causal=causal)
    base.update(kw)
    return Request(**base)


def entry(b, h, n, d=128, causal=False, dtype="fp16", **ms):
    return {"dtype": dtype, "batch": b, "heads": h, "seq_len": n, "head_dim": d, "causal": causal,
            "ms": {name.replace("_", "-"): t for name, t in ms.items()}}


def data(*entries, gpu_name="NVIDIA H100 80GB HBM3"):
    return {"_generated": "synthetic test table", "schema_version": 1, "capability": [9, 0],
            "gpu_name": gpu_name, "torch": "2.11.0", "triton": None, "date": "2026-12-07",
            "command": "test", "method": "synthetic", "entries": list(entries)}


def table(*entries):
    return calibration.parse(data(*entries), source="test table")


# --- an estimate from valid times far apart ---------------------------------------------------------

def test_an_estimate_from_times_whose_quotient_underflows_does_not_raise():
    # 1e-320 / 1e10 rounds to 0.0, and math.log(0.0) raised ValueError out of every sageattn call
    # between these entries; both times are positive and finite, so the table is valid.
    t = table(entry(1, 32, 1024, sdpa=1e10, cuda_sm80_fp16=1e-320),
              entry(1, 32, 4096, sdpa=1.0, cuda_sm80_fp16=1.0))
    est = t.estimate(dtype="fp16", head_dim=128, causal=False, seq_q=2048, seq_k=2048, batch_heads=32)
    assert est.verb == "estimated" and est.time("sdpa") == 1.0
    # both at distance 1: the geometric mean of 1e-330 and 1
    assert math.log10(est.time("cuda-sm80-fp16")) == pytest.approx(-165, abs=0.01)
    choice = choose(req(), inv("sm80"), calibration=t)
    assert choice.name == "cuda-sm80-fp16" and choice.calibrated


def test_an_estimate_past_floats_range_is_infinitely_slow_not_an_overflow():
    # 1e300 / 1e-300 overflowed to inf, and with an underflowed neighbour gave log(0): now each
    # ratio is a difference of logarithms, and a mean past exp's range is inf.
    t = table(entry(1, 32, 1024, sdpa=1e-300, cuda_sm80_fp16=1e300),
              entry(1, 32, 4096, sdpa=1e-300, cuda_sm80_fp16=1e300))
    est = t.estimate(dtype="fp16", head_dim=128, causal=False, seq_q=2048, seq_k=2048, batch_heads=32)
    assert est.time("cuda-sm80-fp16") == math.inf
    choice = choose(req(), inv("sm80"), calibration=t)
    assert choice.name == "sdpa" and choice.calibrated and choice.reason.startswith(dispatch.SDPA_FASTER)


# --- a folder of your tables: a broken model table beside a good capability table -------------------

@pytest.fixture
def package_dir(tmp_path_factory, monkeypatch):
    folder = tmp_path_factory.mktemp("package")
    (folder / "sm90.json").write_text(json.dumps(data(entry(1, 32, 16384, sdpa=0.95, cuda_sm80_fp16=2.1))))
    monkeypatch.setattr(calibration, "tables_folder", lambda: folder)
    calibration.clear_cache()
    yield folder
    calibration.clear_cache()


def sageattention_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "sageattention" and r.levelno == logging.WARNING]


def test_your_broken_model_table_is_said_when_your_capability_table_serves_instead(package_dir, tmp_path,
                                                                                   caplog):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sm90-nvidia-h200.json").write_text("{not json")
    (mine / "sm90.json").write_text(json.dumps(data(entry(1, 32, 16384, sdpa=2.0, cuda_sm80_fp16=1.0))))
    env = {"SAGEATTENTION_CALIBRATION": str(mine)}
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        for _ in range(2):
            found = dispatch.calibration_for((9, 0), env, gpu_name=H200)
            assert found.source == str(mine / "sm90.json")
    # It was dropped without a word: the H200 ran by the H100 numbers while you thought its own
    # table served.
    [warning] = sageattention_warnings(caplog)
    assert warning.startswith(f"sageattention: ignoring what SAGEATTENTION_CALIBRATION={mine} holds for "
                              f"this GPU (sm90, {H200}): calibration table {mine / 'sm90-nvidia-h200.json'}: "
                              "not valid JSON")
    assert warning.endswith(f"; using {found.label} instead")
    assert found.label == f"sm90 from {mine / 'sm90.json'} (measured on NVIDIA H100 80GB HBM3)"


def test_your_good_model_table_is_still_used_silently(package_dir, tmp_path, caplog):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sm90-nvidia-h200.json").write_text(json.dumps(data(entry(1, 32, 16384, sdpa=2.0,
                                                                      cuda_sm80_fp16=1.0), gpu_name=H200)))
    (mine / "sm90.json").write_text("{not json")   # never read: the model's table comes first
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        found = dispatch.calibration_for((9, 0), {"SAGEATTENTION_CALIBRATION": str(mine)}, gpu_name=H200)
    assert found.source == str(mine / "sm90-nvidia-h200.json")
    assert sageattention_warnings(caplog) == []


# --- force_backend's plain name (read by traced code) across threads --------------------------------

def test_force_backend_left_out_of_order_by_two_threads_leaves_no_name_behind():
    # A enters, B enters, A leaves, B leaves. Each restored the name it had found on entry, so A
    # cleared B's name while B was still inside, and B then restored A's "sdpa" for good: traced
    # code (sdpa_compat under torch.compile, traced.grad_sdpa) saw a backend forced forever.
    a_in, b_in, a_out, b_checked = (threading.Event() for _ in range(4))
    seen = {}

    def a():
        with dispatch.force_backend("sdpa"):
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b():
        a_in.wait(5)
        with dispatch.force_backend("triton-fp16"):
            b_in.set()
            a_out.wait(5)
            seen["inside b"] = dispatch.forced_backend_plain()
        b_checked.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert b_checked.is_set()
    assert seen["inside b"] == "triton-fp16"
    assert dispatch.forced_backend_plain() is None
    assert dispatch.forced_backend({}) is None


def test_nested_force_backend_still_restores_the_outer_name():
    with dispatch.force_backend("sdpa"):
        with dispatch.force_backend("triton-fp16"):
            assert dispatch.forced_backend_plain() == "triton-fp16"
        assert dispatch.forced_backend_plain() == "sdpa"
    assert dispatch.forced_backend_plain() is None


# --- SDPA chosen over a pick that was never measured: the reason says so ----------------------------

def test_sdpa_over_an_unmeasured_pick_does_not_claim_it_beat_the_figures_shown():
    # pv_accum_dtype="fp16+fp32" puts cuda-sm80-fp16 (which provides it, not measured) before
    # cuda-sm89-fp8 (measured 3x faster than SDPA, without it): SDPA runs, and the reason said
    # "SDPA is faster for this shape (... cuda-sm89-fp8 1 ms, sdpa 3 ms ...)", which its own figures
    # contradict.
    t = table(entry(1, 32, 2048, sdpa=3.0, cuda_sm89_fp8=1.0))
    choice = choose(req(pv_accum_dtype="fp16+fp32"), inv("sm80", "sm89"), calibration=t)
    assert choice.name == "sdpa" and choice.calibrated
    assert choice.reason.startswith(
        f"{dispatch.SDPA_FASTER} as far as it was measured: cuda-sm80-fp16, the backend that would run, "
        "was not measured there (cuda-sm89-fp8 measured faster but without an option asked for) "
        "(calibration sm90, nearest measured: fp16 1x32x2048x128 non-causal: cuda-sm89-fp8 1 ms, sdpa 3 ms")
    # only SDPA measured: the same words, nothing said to be faster
    only_sdpa = choose(req(), inv("sm80"), calibration=table(entry(1, 32, 2048, sdpa=3.0)))
    assert only_sdpa.name == "sdpa" and only_sdpa.reason.startswith(
        f"{dispatch.SDPA_FASTER} as far as it was measured: cuda-sm80-fp16, the backend that would run, "
        "was not measured there (calibration sm90")
    # measured and slower: unchanged
    slower = choose(req(), inv("sm80"), calibration=table(entry(1, 32, 2048, sdpa=1.0, cuda_sm80_fp16=2.0)))
    assert slower.reason.startswith(f"{dispatch.SDPA_FASTER} (calibration sm90, nearest measured:")


# --- a key given twice in a table file ---------------------------------------------------------------

# two "entries" lists (two tables pasted together): json kept the second, dropping the first; two
# times of one backend in one entry: json kept the last without a word
@pytest.mark.parametrize("key", ["entries", "sdpa"])
def test_a_key_given_twice_is_refused_by_name(tmp_path, key):
    good = data(entry(1, 32, 2048, sdpa=1.0, cuda_sm80_fp16=2.0))
    body = json.dumps(good)
    if key == "entries":
        body = body[:-1] + ', "entries": ' + json.dumps(good["entries"]) + "}"
    else:
        body = body.replace('"sdpa": 1.0', '"sdpa": 1.0, "sdpa": 5.0')
    path = tmp_path / "sm90.json"
    path.write_text(body)
    with pytest.raises(calibration.CalibrationError,
                       match=rf"calibration table {path}: the key '{key}' appears twice in one object"):
        calibration.load(path)
    # the same table with the key once loads
    path.write_text(json.dumps(good))
    assert calibration.load(path).entries[0].time("sdpa") == 1.0


# --- explain() of a call with nothing to attend over ------------------------------------------------

@pytest.mark.parametrize("q_shape,k_shape,words,result", [
    ((0, 2, 8, 64), (0, 2, 8, 64), "batch 0", "an empty result"),
    ((1, 2, 0, 64), (1, 2, 8, 64), "0 queries per sequence", "an empty result"),
    ((1, 2, 8, 64), (1, 2, 0, 64), "0 keys per sequence", "zeros of the queries' shape"),
])
def test_explain_of_an_empty_call_says_no_backend_runs_as_sageattn_does(q_shape, k_shape, words, result):
    import sageattention as sa
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    sa.sageattn(q, k, k)
    assert sa.last_backend() is None          # what sageattn ran: nothing
    said = sa.explain(q, k, k)
    # It said "falls back to PyTorch SDPA because the inputs are on cpu".
    assert said == (f"sageattn runs no backend: the call has nothing to attend over ({words}), so it "
                    f"returns {result} without choosing one (last_backend() is None after it; a forced "
                    "backend is not checked)")
    with dispatch.force_backend("cuda-sm80-fp16"):
        sa.sageattn(q, k, k)                  # returns, as unforced
        assert sa.explain(q, k, k) == said    # raised BackendUnavailableError
