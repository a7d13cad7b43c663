"""The calibrated default dispatch: choose() with an injected calibration table, without a GPU."""

import logging
import math

import pytest
import torch

import sageattention as sa
from sageattention import calibration, core, dispatch
from sageattention.backends import BACKEND_NAMES
from sageattention.dispatch import Inventory, Request, choose
from sageattention.inputs import SAGEATTN_KEYWORDS, parse_call

FAMILIES = ("sm75", "sm80", "sm89", "sm90", "sm90_fp8")
# Most tests below use a build without the sm90 family (as on an sm90 wheel built before it): they
# are about how the table ranks the backends it measured. The sm90 family's own tests (at the end)
# install it too.
ALL = ("sm75", "sm80", "sm89")


def inv(*families, triton=True):
    native = {f: (None if f in families else "not in this build") for f in FAMILIES}
    return Inventory(native=native, triton=(True, "ok") if triton else (False, "Triton is not installed"))


def req(cap=(9, 0), *, b=1, h=32, n=16384, d=128, causal=False, **kw):
    base = dict(device_type="cuda", capability=cap, dtype=torch.float16, head_dim=d, batch_heads=b * h,
                seq_q=n, seq_k=n, causal=causal)
    base.update(kw)
    return Request(**base)


def entry(b, h, n, d, causal=False, dtype="fp16", **ms):
    return {"dtype": dtype, "batch": b, "heads": h, "seq_len": n, "head_dim": d, "causal": causal,
            "ms": {name.replace("_", "-"): t for name, t in ms.items()}}


def table(*entries, label=None):
    data = {"_generated": "synthetic test table", "schema_version": 1, "capability": [9, 0],
            "gpu_name": "Test GPU", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-12-03",
            "command": "test", "method": "synthetic", "entries": list(entries)}
    return calibration.parse(data, source="test table", label=label)


# SDPA measured faster at long sequences, cuda-sm89-fp8 faster at short ones.
MIXED = table(
    entry(1, 32, 16384, 128, sdpa=0.95, cuda_sm80_fp16=2.1, cuda_sm89_fp8=2.5, triton_fp16=3.0,
          cuda_sm75_fp16=4.0),
    entry(32, 32, 128, 128, sdpa=0.20, cuda_sm80_fp16=0.15, cuda_sm89_fp8=0.10, triton_fp16=0.30),
    entry(1, 32, 16384, 128, causal=True, sdpa=0.5, cuda_sm80_fp16=1.1),
)


# --- SDPA faster, native faster ------------------------------------------------------------------

def test_sdpa_measured_faster_runs_sdpa_and_says_why_with_figures():
    choice = choose(req(), inv(*ALL), calibration=MIXED)
    assert choice.name == "sdpa" and choice.fallback and choice.calibrated
    assert choice.reason == (
        "SDPA is faster for this shape (calibration sm90, nearest measured: fp16 1x32x16384x128 "
        "non-causal: sdpa 0.95 ms, cuda-sm80-fp16 2.1 ms, cuda-sm89-fp8 2.5 ms, triton-fp16 3 ms, "
        "cuda-sm75-fp16 4 ms; not measured there: triton-fp8)")
    assert choice.sentence().startswith("runs PyTorch SDPA: SDPA is faster for this shape")
    assert (choice.qk_quant_gran, choice.pv_accum_dtype) == (None, None)


def test_native_measured_faster_runs_native_and_names_the_calibration():
    choice = choose(req(b=32, n=128), inv(*ALL), calibration=MIXED)
    assert choice.name == "cuda-sm89-fp8" and not choice.fallback and choice.calibrated
    assert (choice.qk_quant_gran, choice.pv_accum_dtype) == ("per_thread", "fp32+fp32")
    assert choice.reason.startswith("fastest measured for this shape (calibration sm90, nearest measured: "
                                    "fp16 32x32x128x128 non-causal: cuda-sm89-fp8 0.1 ms, "
                                    "cuda-sm80-fp16 0.15 ms, sdpa 0.2 ms")


def test_only_backends_that_can_run_the_call_compete():
    # Without the sm89 family the fastest measured one that is installed wins; the reason lists only
    # usable backends' figures and says why the others are out.
    choice = choose(req(b=32, n=128), inv("sm80", "sm75"), calibration=MIXED)
    assert choice.name == "cuda-sm80-fp16" and choice.calibrated
    assert "cuda-sm89-fp8 0.1" not in choice.reason
    assert "not usable here: " in choice.reason
    assert "cuda-sm89-fp8: family sm89 unavailable: not in this build" in choice.reason


def test_nearest_entry_decides_in_log_space():
    # 2x32x8192 is nearer (in log2 seq and log2 batch*heads) to 1x32x16384 than to 32x32x128.
    assert choose(req(b=2, n=8192), inv(*ALL), calibration=MIXED).name == "sdpa"
    assert choose(req(b=16, n=256), inv(*ALL), calibration=MIXED).name == "cuda-sm89-fp8"
    # causal calls read causal entries only
    causal = choose(req(causal=True, b=32, n=128), inv(*ALL), calibration=MIXED)
    assert causal.name == "sdpa" and "fp16 1x32x16384x128 causal" in causal.reason


def test_a_quantized_backend_must_beat_sdpa_by_the_margin():
    # A tie, or a gain inside run-to-run noise, keeps SDPA and says so with the figures.
    for native_ms in (1.0, 0.97, 1.0 / dispatch.CALIBRATION_MIN_SPEEDUP + 1e-4):
        near = table(entry(1, 32, 4096, 128, sdpa=1.0, cuda_sm89_fp8=native_ms))
        choice = choose(req(n=4096), inv(*ALL), calibration=near)
        assert choice.name == "sdpa" and choice.calibrated, native_ms
        assert choice.reason.startswith("SDPA is faster for this shape within measurement noise "
                                        "(cuda-sm89-fp8 measured ")
        assert "less than the 5% a quantized backend must gain" in choice.reason
    clear = table(entry(1, 32, 4096, 128, sdpa=1.0, cuda_sm89_fp8=1.0 / dispatch.CALIBRATION_MIN_SPEEDUP - 1e-4))
    assert choose(req(n=4096), inv(*ALL), calibration=clear).name == "cuda-sm89-fp8"


# --- between measured shapes: an estimate from the nearest three ---------------------------------

# The kernel measured 1.25x SDPA at 4x32x4096 and 0.7x at 1x16x2048 and 8x32x1024.
AROUND_2048 = table(
    entry(4, 32, 4096, 128, causal=True, sdpa=1.0, cuda_sm90_fp16=0.8),
    entry(1, 16, 2048, 128, causal=True, sdpa=1.0, cuda_sm90_fp16=1.0 / 0.7),
    entry(8, 32, 1024, 128, causal=True, sdpa=1.0, cuda_sm90_fp16=1.0 / 0.7),
    entry(1, 32, 16384, 128, causal=True, sdpa=1.0, cuda_sm90_fp16=0.8))


def test_a_shape_between_entries_is_estimated_from_the_nearest_three():
    # 1x64x2048 causal (measured on an H100 at 0.79x SDPA with the kernel, 89ec0a7): its nearest
    # entry alone (4x32x4096, squared log2 distance 3) favours the kernel, the next two (distances 4
    # and 6) do not. Weighted by the inverse squared distance, their geometric mean of the kernel's
    # time over SDPA's is more than 1, so SDPA runs.
    choice = choose(req(b=1, h=64, n=2048, causal=True), inv(*FAMILIES), calibration=AROUND_2048)
    assert choice.name == "sdpa" and choice.calibrated
    assert choice.reason.startswith(
        "SDPA is faster for this shape (calibration sm90, estimated from the 3 nearest measured shapes "
        "(fp16 4x32x4096x128 causal, fp16 1x16x2048x128 causal, fp16 8x32x1024x128 causal), times as "
        "a multiple of SDPA's: sdpa 1, cuda-sm90-fp16 1.1")
    w = (1 / 3, 1 / 4, 1 / 6)
    logs = (math.log(0.8), math.log(1 / 0.7), math.log(1 / 0.7))
    expected = math.exp(sum(a * b for a, b in zip(w, logs)) / sum(w))
    estimate = AROUND_2048.estimate(dtype="fp16", head_dim=128, causal=True, seq_q=2048, seq_k=2048,
                                    batch_heads=64)
    assert estimate.time("cuda-sm90-fp16") == pytest.approx(expected) and estimate.time("sdpa") == 1.0
    assert estimate.verb == "estimated"


def test_an_estimate_past_the_margin_runs_the_kernel_and_says_it_was_estimated():
    # 2x32x8192 sits between 4x32x4096 and 1x32x16384 (1.25x, squared distance 3 each); the third
    # nearest, 1x16x2048 (0.7x), is at 12, so it weighs a quarter as much as each of them: 0.853.
    choice = choose(req(b=2, h=32, n=8192, causal=True), inv(*FAMILIES), calibration=AROUND_2048)
    assert choice.name == "cuda-sm90-fp16" and choice.calibrated
    assert choice.reason.startswith("fastest estimated for this shape (calibration sm90, estimated from "
                                    "the 3 nearest measured shapes (")
    assert "cuda-sm90-fp16 0.853, sdpa 1;" in choice.reason


def test_a_measured_point_decides_alone_whatever_its_neighbours_say():
    # At an entry's own point the measurement stands: 4x32x4096 runs the kernel although two of
    # its three nearest neighbours measured it slower.
    choice = choose(req(b=4, h=32, n=4096, causal=True), inv(*FAMILIES), calibration=AROUND_2048)
    assert choice.name == "cuda-sm90-fp16"
    assert "nearest measured: fp16 4x32x4096x128 causal: cuda-sm90-fp16 0.8 ms, sdpa 1 ms" in choice.reason
    # the other half dtype measured at the point: the same
    bf16 = choose(req(b=4, h=32, n=4096, causal=True, dtype=torch.bfloat16), inv(*FAMILIES),
                  calibration=AROUND_2048)
    assert bf16.name == "cuda-sm90-fp16" and "nearest measured: fp16 4x32x4096x128 causal" in bf16.reason


def test_a_neighbour_without_sdpa_leaves_the_nearest_entry_alone_to_decide():
    no_sdpa = table(entry(4, 32, 4096, 128, sdpa=1.0, cuda_sm90_fp16=0.8),
                    entry(1, 16, 2048, 128, cuda_sm90_fp16=2.0))
    choice = choose(req(b=2, h=32, n=4096), inv(*FAMILIES), calibration=no_sdpa)
    assert choice.name == "cuda-sm90-fp16" and "nearest measured: fp16 4x32x4096x128" in choice.reason


def test_an_estimate_ignores_entries_that_did_not_measure_a_backend():
    partial = table(entry(4, 32, 4096, 128, sdpa=1.0, cuda_sm90_fp16=0.8, cuda_sm80_fp16=0.5),
                    entry(1, 32, 16384, 128, sdpa=1.0, cuda_sm90_fp16=0.8))
    estimate = partial.estimate(dtype="fp16", head_dim=128, causal=False, seq_q=8192, seq_k=8192,
                                batch_heads=64)
    assert estimate.time("cuda-sm80-fp16") == pytest.approx(0.5)   # the one entry that measured it
    assert estimate.time("cuda-sm90-fp16") == pytest.approx(0.8)
    assert estimate.time("triton-fp16") is None


# --- unmeasured backends --------------------------------------------------------------------------

def test_unmeasured_fitting_backends_come_after_measured_ones_in_the_static_order():
    only_sm80 = table(entry(1, 32, 16384, 128, sdpa=2.0, cuda_sm80_fp16=1.5))
    choice = choose(req(), inv(*ALL), calibration=only_sm80)
    assert choice.name == "cuda-sm80-fp16" and choice.calibrated
    assert "not measured there: cuda-sm89-fp8, triton-fp16, cuda-sm75-fp16" in choice.reason
    # A measured SDPA beats backends that were not measured at all.
    only_sdpa = table(entry(1, 32, 16384, 128, sdpa=9.0))
    assert choose(req(), inv(*ALL), calibration=only_sdpa).name == "sdpa"


def test_nothing_usable_measured_keeps_the_static_order_and_says_so():
    # Only cuda-sm89-fp8 was measured, and this build does not have it.
    fp8_only = table(entry(1, 32, 16384, 128, cuda_sm89_fp8=0.5))
    choice = choose(req(), inv("sm80"), calibration=fp8_only)
    assert choice.name == "cuda-sm80-fp16" and not choice.calibrated
    assert choice.reason.startswith("first usable backend for sm90")
    assert "calibration sm90 measured none of the usable backends at fp16 1x32x16384x128 non-causal" \
        in choice.reason


def test_no_entry_for_the_dtype_uses_the_other_half_dtype_and_says_so():
    choice = choose(req(dtype=torch.bfloat16), inv(*ALL), calibration=MIXED)
    assert choice.name == "sdpa" and choice.calibrated
    assert "nearest measured: fp16 1x32x16384x128 non-causal" in choice.reason


def test_no_entry_for_the_causal_flag_keeps_the_static_order():
    non_causal_only = table(entry(1, 32, 16384, 128, sdpa=0.95, cuda_sm80_fp16=2.1))
    choice = choose(req(causal=True), inv(*ALL), calibration=non_causal_only)
    assert choice.name == "cuda-sm80-fp16" and not choice.calibrated
    assert "calibration sm90 has no causal entries" in choice.reason


def test_requested_options_still_pick_the_backend_that_provides_them():
    # cuda-sm89-fp8 is fastest but lacks fp16+fp32 accumulation; the sm80 family has it, and it
    # beats SDPA here, so it runs without an adjustment.
    t = table(entry(1, 32, 16384, 128, sdpa=3.0, cuda_sm80_fp16=2.0, cuda_sm89_fp8=1.0))
    choice = choose(req(pv_accum_dtype="fp16+fp32"), inv(*ALL), calibration=t)
    assert choice.name == "cuda-sm80-fp16" and choice.pv_accum_dtype == "fp16+fp32"
    assert not choice.adjustments



def test_smooth_v_does_not_demote_the_fp32_accumulating_triton_kernel():
    # For fp32 accumulation smooth_v is an identity (the native "fp32" modes skip it); triton-fp16
    # was marked as lacking it, so with smooth_v=True it ranked after every native backend even
    # where the table measured it fastest, and the call said "V is not smoothed".
    t = table(entry(1, 32, 16384, 128, sdpa=3.0, cuda_sm80_fp16=2.0, triton_fp16=1.0))
    choice = choose(req(smooth_v=True), inv(*ALL), calibration=t)
    assert choice.name == "triton-fp16" and not choice.adjustments
    fp8 = choose(req(smooth_v=True), inv(*ALL), calibration=table(
        entry(1, 32, 16384, 128, sdpa=3.0, cuda_sm80_fp16=2.0, triton_fp8=1.0)))
    assert fp8.name == "cuda-sm80-fp16"  # FP8 V without its smoothing: an adjustment, ranked after
# --- what the calibration does not decide ----------------------------------------------------------

@pytest.mark.parametrize("kw,expect,reason", [
    ({"device_type": "cpu", "capability": None}, "sdpa", "the inputs are on cpu"),
    ({"dtype": torch.float32}, "sdpa", "the inputs are torch.float32"),
    ({"requires_grad": True}, "sdpa", "the inputs require grad"),
    ({"dropout": True}, "sdpa", "dropout_p > 0"),
    ({"head_dim": 512}, "sdpa", "head dim 512 is not covered"),
])
def test_input_reasons_are_kept(kw, expect, reason):
    choice = choose(req(**kw), inv(*ALL), calibration=MIXED)
    assert choice.name == expect and choice.fallback and not choice.calibrated
    assert choice.reason.startswith(reason)
    assert choice == choose(req(**kw), inv(*ALL))  # the same choice as without a table


def test_masked_calls_keep_the_static_order():
    # The table times unmasked calls; a mask keeps Triton (which takes masks) or the old SDPA reason.
    with_triton = choose(req(has_mask=True), inv(*ALL), calibration=MIXED)
    assert with_triton.name == "triton-fp16" and not with_triton.calibrated
    assert "calibration sm90 not used: it times calls without an attention mask" in with_triton.reason
    without = choose(req(has_mask=True), inv(*ALL, triton=False), calibration=MIXED)
    assert without.name == "sdpa" and not without.calibrated
    assert without == choose(req(has_mask=True), inv(*ALL, triton=False))
    assert "takes no attention mask" in without.reason


def test_return_lse_and_unknown_shapes_keep_the_static_order():
    lse = choose(req(return_lse=True), inv(*ALL), calibration=MIXED)
    assert lse.name == "cuda-sm80-fp16" and "without return_lse" in lse.reason
    shapeless = Request(device_type="cuda", capability=(9, 0), dtype=torch.float16, head_dim=128)
    assert choose(shapeless, inv(*ALL), calibration=MIXED).name == "cuda-sm80-fp16"


def test_forcing_wins_over_the_calibration():
    forced = choose(req(), inv(*ALL), forced="cuda-sm89-fp8", calibration=MIXED)
    assert forced.name == "cuda-sm89-fp8" and not forced.calibrated and "forced" in forced.reason
    sdpa = choose(req(b=32, n=128), inv(*ALL), forced="sdpa", calibration=MIXED)
    assert sdpa.name == "sdpa" and "forced" in sdpa.reason and not sdpa.calibrated


def test_kernel_specific_functions_ignore_the_calibration():
    for candidates in (("cuda-sm89-fp8",), ("cuda-sm80-fp16", "cuda-sm75-fp16"), ("triton-fp16",)):
        choice = choose(req(), inv(*ALL), candidates=candidates, allow_fallback=False, calibration=MIXED)
        assert choice.name == candidates[0] and not choice.calibrated
    # sageattn_varlen: Triton only, fallback allowed; also not the default path
    assert choose(req(), inv(*ALL), candidates=("triton-fp16",), calibration=MIXED).name == "triton-fp16"


def test_kernel_specific_functions_never_read_the_table(monkeypatch):
    looked_up = []
    monkeypatch.setattr(dispatch, "calibration_for",
                        lambda cap, env=None, gpu_name=None: looked_up.append((cap, gpu_name)))
    monkeypatch.delenv("SAGEATTENTION_BACKEND", raising=False)
    q = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    sa.sageattn_qk_int8_pv_fp16_cuda(q, q, q)
    sa.sageattn_qk_int8_pv_fp8_cuda(q, q, q)
    sa.sageattn_qk_int8_pv_fp16_triton(q, q, q)
    with sa.force_backend("sdpa"):
        sa.sageattn(q, q, q)
    assert looked_up == []
    sa.sageattn(q, q, q)
    assert looked_up == [(None, None)]  # the default path asks (CPU: capability None, so no table)
    # and names the call's GPU, whose model may have a table of its own
    monkeypatch.setattr(dispatch, "device_name", lambda device: f"GPU of {device}")
    sa.sageattn(q, q, q)
    assert looked_up[-1] == (None, "GPU of cpu")


def test_the_cache_key_holds_the_calibration():
    with_table = choose(req(), inv(*ALL), calibration=MIXED)
    without = choose(req(), inv(*ALL))
    assert (with_table.name, without.name) == ("sdpa", "cuda-sm80-fp16")
    other = table(entry(1, 32, 16384, 128, sdpa=5.0, cuda_sm89_fp8=1.0))
    assert choose(req(), inv(*ALL), calibration=other).name == "cuda-sm89-fp8"
    assert choose(req(), inv(*ALL), calibration=MIXED) is with_table


# --- switching it off ---------------------------------------------------------------------------

def test_env_var_values():
    assert dispatch.calibration_enabled(env={}) is True
    for value in ("on", "ON", " on ", ""):
        assert dispatch.calibration_enabled(env={"SAGEATTENTION_CALIBRATION": value}) is True
    assert dispatch.calibration_enabled(env={"SAGEATTENTION_CALIBRATION": "off"}) is False
    with pytest.raises(ValueError, match=r"SAGEATTENTION_CALIBRATION='0' is not accepted; use one of: on, off"):
        dispatch.calibration_enabled(env={"SAGEATTENTION_CALIBRATION": "0"})


def test_use_calibration_context_wins_over_the_env_var():
    off = {"SAGEATTENTION_CALIBRATION": "off"}
    with dispatch.use_calibration(True):
        assert dispatch.calibration_enabled(env=off) is True
        with dispatch.use_calibration(False):
            assert dispatch.calibration_enabled(env={}) is False
        assert dispatch.calibration_enabled(env=off) is True
    assert dispatch.calibration_enabled(env=off) is False
    with pytest.raises(TypeError, match="True or False"):
        with dispatch.use_calibration("off"):
            pass


def test_calibration_for_respects_the_switch(monkeypatch):
    monkeypatch.setattr(calibration, "for_gpu", lambda cap, gpu_name=None, user_path=None: MIXED)
    assert dispatch.calibration_for((9, 0), env={}) is MIXED
    assert dispatch.calibration_for((9, 0), env={"SAGEATTENTION_CALIBRATION": "off"}) is None
    assert dispatch.calibration_for(None, env={}) is None
    with dispatch.use_calibration(False):
        assert dispatch.calibration_for((9, 0), env={}) is None


def test_a_bad_env_value_fails_the_sageattn_call_clearly(monkeypatch):
    monkeypatch.delenv("SAGEATTENTION_BACKEND", raising=False)
    monkeypatch.setenv("SAGEATTENTION_CALIBRATION", "fast")
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match="SAGEATTENTION_CALIBRATION='fast'"):
        sa.sageattn(q, q, q)
    monkeypatch.setenv("SAGEATTENTION_CALIBRATION", "off")
    sa.sageattn(q, q, q)
    assert sa.last_backend() == "sdpa"


# --- the request and the log ------------------------------------------------------------------

def test_request_carries_the_shape():
    q = torch.randn(2, 6, 10, 64)
    k = torch.randn(2, 3, 24, 64)
    call = parse_call(q, k, k, tensor_layout="HND", is_causal=True, sm_scale=None, return_lse=False,
                      options=dict(SAGEATTN_KEYWORDS))
    r = dispatch.request_for(call)
    assert (r.batch_heads, r.seq_q, r.seq_k, r.causal, r.return_lse) == (12, 10, 24, True, False)


def test_a_mask_that_requires_grad_makes_the_request_need_grad():
    q = torch.randn(1, 2, 8, 64)

    def request(mask):
        options = dict(SAGEATTN_KEYWORDS, attn_mask=mask)
        return dispatch.request_for(parse_call(q, q, q, tensor_layout="HND", is_causal=False, sm_scale=None,
                                               return_lse=False, options=options))
    bias = torch.zeros(8, 8, requires_grad=True)
    assert request(bias).requires_grad
    assert not request(bias.detach()).requires_grad
    with torch.no_grad():
        assert not request(bias).requires_grad


def test_a_calibrated_sdpa_choice_is_logged_once_at_info_not_as_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(dispatch, "_logged", set())
    choice = choose(req(), inv(*ALL), calibration=MIXED)
    q = torch.randn(1, 2, 8, 64)
    call = parse_call(q, q, q, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False,
                      options=dict(SAGEATTN_KEYWORDS))
    with caplog.at_level(logging.INFO, logger="sageattention"):
        for _ in range(3):
            out = core._run(call, choice, q, q, q)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))
    records = [r for r in caplog.records if r.name == "sageattention"]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert "SDPA is faster for this shape" in records[0].getMessage()
    assert sa.last_backend() == "sdpa"
    # a real fallback is still a warning
    with caplog.at_level(logging.INFO, logger="sageattention"):
        core._run(call, choose(req(dtype=torch.float32), inv(*ALL), calibration=MIXED), q, q, q)
    assert caplog.records[-1].levelno == logging.WARNING


# --- the sm90 family: installed, but in no table yet ------------------------------------------------

def test_a_table_that_did_not_measure_cuda_sm90_fp16_never_picks_it():
    # Nothing is invented for it: the table ranks the backends it measured, and it only shows as
    # "not measured there".
    choice = choose(req(b=32, n=128), inv(*FAMILIES), calibration=MIXED)
    assert choice.name == "cuda-sm89-fp8" and choice.calibrated
    assert "not measured there: cuda-sm90-fp16" in choice.reason
    assert choose(req(), inv(*FAMILIES), calibration=MIXED).name == "sdpa"


def test_the_packaged_sm90_table_picks_what_it_measured_fastest_past_the_margin():
    packaged = calibration.for_gpu((9, 0))
    assert packaged is not None
    picked = set()
    for e in packaged.entries:
        times = {n: e.time(n) for n in BACKEND_NAMES if e.time(n) is not None}
        fastest = min((n for n in times if n != "sdpa"), key=times.get)
        if times["sdpa"] < times[fastest] * dispatch.CALIBRATION_MIN_SPEEDUP:
            fastest = "sdpa"  # SDPA faster, or the quantized gain inside the noise margin
        choice = choose(req(b=e.batch, h=e.heads, n=e.seq_len, seq_k=e.case.keys, d=e.head_dim,
                            causal=e.causal, dtype=calibration.DTYPES[e.dtype]),
                        inv(*FAMILIES), calibration=packaged)
        assert choice.calibrated and choice.name == fastest, (e.name, choice.reason)
        picked.add(choice.name)
    # the table of benchmarks/results/h100-2026-12-05-calibration-7b16d71.json: cuda-sm90-fp16
    # measured 6-37% faster than SDPA at 11 shapes (d=128 from 4096 tokens on), SDPA fastest at most
    # others, the decode and cross shapes included; cuda-sm90-fp8, with V's two e4m3 terms, is
    # slower than cuda-sm90-fp16 on every shape there and is picked nowhere
    assert picked == {"cuda-sm90-fp16", "sdpa"}, picked


def test_where_the_table_does_not_apply_cuda_sm90_fp16_comes_first():
    lse = choose(req(return_lse=True), inv(*FAMILIES), calibration=MIXED)
    assert lse.name == "cuda-sm90-fp16" and not lse.calibrated
    assert (lse.qk_quant_gran, lse.pv_accum_dtype) == ("per_thread", "fp32")
    assert choose(req(), inv(*FAMILIES)).name == "cuda-sm90-fp16"  # calibration off


def test_the_packaged_sm90_table_runs_sdpa_where_the_kernel_lost_off_the_grid():
    # Measured on an H100 (benchmarks/results/h100-2026-12-07-session-89ec0a7.log): fp16
    # 1x64x2048x128 causal ran cuda-sm90-fp16 at 0.79x SDPA when the nearest entry alone decided.
    packaged = calibration.for_gpu((9, 0))
    choice = choose(req(b=1, h=64, n=2048, causal=True), inv(*FAMILIES), calibration=packaged)
    assert choice.name == "sdpa" and "estimated from the 3 nearest measured shapes" in choice.reason
    # and where the kernel measured 1.20x off the grid (1x40x12288x128), it still runs
    assert choose(req(b=1, h=40, n=12288), inv(*FAMILIES), calibration=packaged).name == "cuda-sm90-fp16"


def test_a_calibrated_fp8_pick_says_it_trades_accuracy_and_how_to_keep_fp16():
    fp8_fastest = table(
        entry(1, 32, 16384, 128, sdpa=1.0, cuda_sm90_fp8=0.7, cuda_sm90_fp16=0.8, cuda_sm80_fp16=1.2),
        entry(4, 32, 4096, 128, sdpa=1.0, cuda_sm90_fp8=0.95, cuda_sm90_fp16=0.8, cuda_sm80_fp16=1.2))
    fp8 = choose(req(b=1, h=32, n=16384, d=128), inv(*FAMILIES), calibration=fp8_fastest)
    assert fp8.calibrated and fp8.name == "cuda-sm90-fp8"  # measured fastest there
    assert "runs P.V in FP8, less accurate than the FP16 P.V backends" in fp8.reason
    assert "SAGEATTENTION_CALIBRATION=off" in fp8.reason
    fp16 = choose(req(b=4, h=32, n=4096, d=128), inv(*FAMILIES), calibration=fp8_fastest)
    assert fp16.name == "cuda-sm90-fp16" and "FP8" not in fp16.reason


# --- head dims the table did not measure -----------------------------------------------------------

# Measured at head dim 128 only: the native kernel 1.25x SDPA, Triton 1.1x.
AT_128 = table(entry(1, 32, 16384, 128, sdpa=1.0, cuda_sm80_fp16=0.8, triton_fp16=0.9))


@pytest.mark.parametrize("d, expect", [
    (128, "cuda-sm80-fp16"),   # measured: as the table says
    (112, "cuda-sm80-fp16"),   # 0.8 x 128 / 112 = 0.91 of SDPA's time: still faster
    (96, "sdpa"),              # 0.8 x 128 / 96 = 1.07: both kernels run at 128, SDPA at 96
    (64, "cuda-sm80-fp16"),    # the 64 kernel, no padding: the 128 entry's ratio as it is
])
def test_a_head_dim_the_table_did_not_measure_counts_the_kernels_padding(d, expect):
    choice = choose(req(cap=(8, 0), d=d), inv(*ALL), calibration=AT_128)
    assert choice.name == expect, choice.reason
    if d in (112, 96):
        assert f"for head dim {d}, each quantized backend's time times its kernel's width over {d}" \
            in choice.reason


def test_a_measured_head_dim_is_not_scaled_again():
    measured_96 = table(entry(1, 32, 16384, 96, sdpa=1.0, cuda_sm80_fp16=0.8, triton_fp16=0.9))
    choice = choose(req(cap=(8, 0), d=96), inv(*ALL), calibration=measured_96)
    assert choice.name == "cuda-sm80-fp16" and "width over" not in choice.reason
