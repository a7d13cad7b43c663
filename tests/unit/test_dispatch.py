"""Backend selection rules (capability table + dispatch), exercised without a GPU through choose()."""

import dataclasses
import json
import logging
import threading
from importlib import resources
from pathlib import Path

import pytest
import torch

import sageattention as sa
from sageattention import backends, dispatch
from sageattention.dispatch import BackendUnavailableError, Inventory, Request, choose

REPO = Path(__file__).resolve().parents[2]
ALL = ("sm75", "sm80", "sm89", "sm90", "sm90_fp8")


def inv(*families, triton=True):
    native = {f: (None if f in families else "not in this build") for f in ALL}
    return Inventory(native=native, triton=(True, "ok") if triton else (False, "Triton is not installed"))


def req(cap=(9, 0), **kw):
    base = dict(device_type="cuda", capability=cap, dtype=torch.float16, head_dim=128)
    base.update(kw)
    return Request(**base)


# --- the table ------------------------------------------------------------------------------

def test_one_record_per_backend_name_and_native_facts_come_from_families_json():
    table = backends.capability_table()
    assert tuple(r.name for r in table) == ("cuda-sm90-fp16", "cuda-sm90-fp8", "cuda-sm89-fp8",
                                            "cuda-sm80-fp16", "cuda-sm75-fp16", "triton-fp16",
                                            "triton-fp8", "sdpa")
    families = json.loads(resources.files("sageattention.native").joinpath("families.json").read_text())
    for row in table:
        if row.kind != "native":
            continue
        spec = families["families"][row.family]
        assert row.kernel_head_dims == tuple(sorted(spec["head_dims"]))
        assert row.head_dims == range(1, max(spec["head_dims"]) + 1)   # the rest zero-padded
        assert set(row.qk_quant_grans) == set(spec["qk_quant_gran"])
        assert set(row.pv_accum_dtypes) == set(spec["pv_accum_dtype"])
        assert row.op in spec["ops"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        table[0].name = "x"  # frozen records


@pytest.mark.parametrize("cap,order", [
    ((9, 0), ("cuda-sm90-fp16", "cuda-sm80-fp16", "cuda-sm90-fp8", "cuda-sm89-fp8", "triton-fp16",
              "cuda-sm75-fp16", "triton-fp8", "sdpa")),
    ((8, 9), ("cuda-sm80-fp16", "cuda-sm89-fp8", "triton-fp16", "cuda-sm75-fp16", "triton-fp8", "sdpa")),
    ((8, 6), ("cuda-sm80-fp16", "triton-fp16", "cuda-sm75-fp16", "sdpa")),
    ((8, 0), ("cuda-sm80-fp16", "triton-fp16", "cuda-sm75-fp16", "sdpa")),
    ((7, 5), ("cuda-sm75-fp16", "sdpa")),
    ((7, 0), ("sdpa",)),
    (None, ("sdpa",)),
])
def test_preference_order(cap, order):
    assert backends.preference_order(cap) == order


def test_sm75_family_reaches_newer_gpus_only_through_ptx():
    sm75, sm80 = backends.backend("cuda-sm75-fp16"), backends.backend("cuda-sm80-fp16")
    assert sm75.serves((7, 5)) and sm75.serves((9, 0)) and sm75.serves((12, 0)) and not sm75.serves((7, 0))
    assert sm80.serves((8, 6)) and not sm80.serves((7, 5)) and not sm80.serves((10, 0))


def test_sm90_family_serves_only_compute_capability_9_0():
    # sm_90a SASS, no PTX: it runs on exactly 9.0 (not on Ada, not on Blackwell, not on the CPU)
    sm90 = backends.backend("cuda-sm90-fp16")
    assert (sm90.family, sm90.op, sm90.kind) == ("sm90", "qk_int8_pv_fp16", "native")
    assert sm90.capabilities == frozenset({(9, 0)}) and sm90.min_capability is None
    assert sm90.serves((9, 0))
    for cap in ((8, 0), (8, 9), (9, 1), (10, 0), (12, 0), None):
        assert not sm90.serves(cap), cap
    assert sm90.pv_accum_dtypes == ("fp32",) and sm90.default_pv_accum_dtype == "fp32"
    assert sm90.qk_quant_grans == ("per_thread", "per_warp") and sm90.kernel_head_dims == (64, 128)
    assert sm90.head_dims == range(1, 129) and sm90.padded_head_dim(96) == 128 and sm90.padded_head_dim(32) == 64
    # only the 9.0 rule names it; a newer GPU that falls under that rule drops it through serves()
    assert [cap for cap, order in backends.PREFERENCE if "cuda-sm90-fp16" in order] == [(9, 0)]
    assert backends.preference_order((9, 0))[0] == "cuda-sm90-fp16"


def test_sm90_fp8_family_serves_only_compute_capability_9_0():
    fp8 = backends.backend("cuda-sm90-fp8")
    assert (fp8.family, fp8.op, fp8.kind) == ("sm90_fp8", "qk_int8_pv_fp8", "native")
    assert fp8.capabilities == frozenset({(9, 0)}) and fp8.min_capability is None
    assert fp8.serves((9, 0))
    for cap in ((8, 0), (8, 9), (9, 1), (10, 0), (12, 0), None):
        assert not fp8.serves(cap), cap
    # the sm89 family's modes but its fp16 inner accumulator; two-level fp32 when none is named
    assert fp8.pv_accum_dtypes == ("fp32+fp32", "fp32") and fp8.default_pv_accum_dtype == "fp32+fp32"
    assert fp8.qk_quant_grans == ("per_thread", "per_warp") and fp8.kernel_head_dims == (64, 128)
    assert fp8.head_dims == range(1, 129)
    assert fp8.takes_smooth_v and not fp8.takes_mask
    assert [cap for cap, order in backends.PREFERENCE if "cuda-sm90-fp8" in order] == [(9, 0)]
    # after the FP16 backends (more accurate), before the mma.sync FP8 backend (slower)
    order = backends.preference_order((9, 0))
    assert order.index("cuda-sm80-fp16") < order.index("cuda-sm90-fp8") < order.index("cuda-sm89-fp8")


def test_every_native_backend_is_named_by_the_validation_rule():
    # the validation suite and the release notes name a family's backends with backend_name();
    # the capability table must use the same names
    from sageattention.validation.expectation import backend_name

    for row in backends.capability_table():
        if row.kind == "native":
            assert backend_name(row.family, row.op) == row.name
    assert {backend_name(f, op) for f, s in backends.load_families().items() for op in s["ops"]} == \
        {r.name for r in backends.capability_table() if r.kind == "native"}


# --- the rule -------------------------------------------------------------------------------

@pytest.mark.parametrize("cap,families,triton,expect", [
    ((9, 0), ALL, True, "cuda-sm90-fp16"),          # wgmma: measured faster than mma.sync on the H200
    ((9, 0), ("sm80", "sm89"), True, "cuda-sm80-fp16"),  # measured faster than sm89-fp8 on the H200
    ((9, 0), ("sm80",), True, "cuda-sm80-fp16"),
    ((9, 0), ("sm90",), True, "cuda-sm90-fp16"),
    ((9, 0), ("sm89",), True, "cuda-sm89-fp8"),
    ((9, 0), ("sm89", "sm90_fp8"), True, "cuda-sm90-fp8"),  # wgmma FP8: faster than mma.sync FP8
    ((9, 0), ("sm80", "sm90_fp8"), True, "cuda-sm80-fp16"),  # FP16 PV first: more accurate
    ((9, 0), ("sm90_fp8",), False, "cuda-sm90-fp8"),
    ((9, 0), ("sm75",), True, "triton-fp16"),
    ((9, 0), ("sm75",), False, "cuda-sm75-fp16"),   # the Turing wheel on an H200: PTX JIT
    ((8, 9), ("sm80", "sm89"), True, "cuda-sm80-fp16"),  # two-term FP8 P.V: no faster on Ada, less accurate
    ((8, 9), ("sm89",), True, "cuda-sm89-fp8"),     # a build without the FP16 family
    ((8, 6), ALL, True, "cuda-sm80-fp16"),
    ((8, 0), (), True, "triton-fp16"),
    ((7, 5), ALL, True, "cuda-sm75-fp16"),
    ((12, 0), ALL, True, "triton-fp16"),            # no SASS for sm120 in sm80/sm89 families
    ((10, 0), ALL, False, "cuda-sm75-fp16"),        # sm_90a code does not run on sm100: PTX
    ((8, 9), ALL, True, "cuda-sm80-fp16"),          # nor on Ada
])
def test_best_backend_per_gpu_and_build(cap, families, triton, expect):
    choice = choose(req(cap), inv(*families, triton=triton))
    assert choice.name == expect and not choice.fallback
    assert choice.qk_quant_gran in backends.backend(expect).qk_quant_grans


def test_defaults_resolved_for_native_backends():
    fp8 = choose(req((8, 9)), inv("sm89"))
    assert (fp8.qk_quant_gran, fp8.pv_accum_dtype) == ("per_thread", "fp32+fp32")
    sm75 = choose(req((7, 5)), inv(*ALL))
    assert (sm75.qk_quant_gran, sm75.pv_accum_dtype) == ("per_thread", "fp32")


def test_reason_names_skipped_backends():
    choice = choose(req((9, 0)), inv("sm89"))
    assert "cuda-sm80-fp16" in choice.reason and "not in this build" in choice.reason
    assert "sm90" in choice.reason


@pytest.mark.parametrize("request_kw,cap,triton,expect,reason", [
    ({"device_type": "cpu", "capability": None}, None, True, "sdpa", "on cpu"),
    ({"dtype": torch.float32}, (9, 0), True, "sdpa", "float32"),
    ({"dtype": torch.float64}, (9, 0), True, "sdpa", "float64"),
    ({"requires_grad": True}, (9, 0), True, "sdpa", "require grad"),
    ({"dropout": True}, (9, 0), True, "sdpa", "dropout"),
    ({"has_mask": True}, (9, 0), True, "triton-fp16", ""),
    ({"has_mask": True}, (9, 0), False, "sdpa", "takes no attention mask"),
    ({"has_mask": True}, (7, 5), True, "sdpa", "mask"),
    # head dims below 128 run the native kernels zero-padded (96 at 128, 32 at 64)
    ({"head_dim": 96}, (9, 0), True, "cuda-sm90-fp16", ""),
    ({"head_dim": 96}, (9, 0), False, "cuda-sm90-fp16", ""),
    ({"head_dim": 96}, (7, 5), True, "cuda-sm75-fp16", ""),
    ({"head_dim": 32}, (8, 0), False, "cuda-sm80-fp16", ""),
    ({"head_dim": 160}, (9, 0), True, "triton-fp16", ""),
    ({"head_dim": 160}, (9, 0), False, "sdpa", "head dim 160"),
    ({"head_dim": 160}, (7, 5), True, "sdpa", "head dim 160 is not covered"),
    ({"head_dim": 512}, (9, 0), True, "sdpa", "head dim 512"),
    ({"batch": 65536, "q_heads": 1}, (9, 0), True, "sdpa", "batch 65536 exceeds the launch grid limit of 65535"),
    ({"batch": 1, "q_heads": 70000}, (8, 0), True, "sdpa", "query heads 70000 exceeds the launch grid limit"),
    ({"batch": 65535, "q_heads": 65535}, (9, 0), True, "cuda-sm90-fp16", ""),
    # the Triton kernels' 32-bit token positions (sageattention.triton.MAX_TOKENS): a masked call
    # past them has no quantized backend left
    ({"has_mask": True, "seq_q": 64, "seq_k": 2**30 + 1}, (9, 0), True, "sdpa",
     "triton-fp16: 1073741825 key tokens in one sequence exceed its limit"),
    ({"has_mask": True, "seq_q": 64, "seq_k": 2**30}, (9, 0), True, "triton-fp16", ""),
])
def test_fallbacks(request_kw, cap, triton, expect, reason):
    base = {"capability": cap, **request_kw}
    choice = choose(req(**base), inv(*ALL, triton=triton))
    assert choice.name == expect
    assert choice.fallback == (expect == "sdpa")
    assert reason in choice.reason


@pytest.mark.parametrize("cap", [(9, 0), (8, 9), (8, 0), (7, 5)])
@pytest.mark.parametrize("seq_q,seq_k,short", [(1, 8192, "1 query"), (63, 4096, "63 queries"),
                                               (4096, 8, "8 keys"), (1, 1, "1 query")])
def test_a_call_too_short_to_quantize_runs_sdpa_without_a_table(cap, seq_q, seq_k, short):
    choice = choose(req(cap, seq_q=seq_q, seq_k=seq_k, batch=8, q_heads=32, batch_heads=256), inv(*ALL))
    assert choice.name == "sdpa" and choice.fallback and not choice.calibrated
    assert choice.reason.startswith(dispatch.SDPA_FASTER) and f"{short} per sequence" in choice.reason
    assert f"fewer than {backends.MIN_QUANTIZED_TOKENS}" in choice.reason
    assert choice.sentence().startswith("runs PyTorch SDPA: ")  # a speed choice, not a fallback to act on


@pytest.mark.parametrize("seq_q,seq_k", [(64, 64), (64, 8192), (4096, 77), (None, None)])
def test_from_the_threshold_on_or_with_an_unknown_shape_the_static_order_applies(seq_q, seq_k):
    assert choose(req(seq_q=seq_q, seq_k=seq_k), inv(*ALL)).name == "cuda-sm90-fp16"


def test_the_short_call_rule_leaves_forcing_kernel_functions_and_input_reasons_alone():
    from sageattention.core import _FP16_NATIVE
    short = dict(seq_q=1, seq_k=8192)
    assert choose(req(**short), inv(*ALL), forced="cuda-sm80-fp16").name == "cuda-sm80-fp16"
    assert choose(req(**short), inv(*ALL), candidates=_FP16_NATIVE,
                  allow_fallback=False).name == "cuda-sm90-fp16"
    # SDPA for a reason of the input says that reason, not the speed rule
    assert "float32" in choose(req(dtype=torch.float32, **short), inv(*ALL)).reason
    assert "no quantized backend fits" in choose(req((8, 0), **short), inv(triton=False)).reason
    past_grid = choose(req(batch=65536, q_heads=1, batch_heads=65536, **short), inv(*ALL))
    assert "exceeds the launch grid limit" in past_grid.reason   # tests/gpu/test_limits_gpu.py's n=8
    # a short masked call too: SDPA takes the mask itself
    masked = choose(req(has_mask=True, **short), inv(*ALL))
    assert masked.name == "sdpa" and masked.reason.startswith(dispatch.SDPA_FASTER)
    # but not with return_lse: SDPA's LSE pass over Q.K^T would cost more than the kernel's LSE
    assert choose(req(return_lse=True, **short), inv(*ALL)).name == "cuda-sm90-fp16"


def test_requested_accumulator_picks_the_family_that_has_it():
    choice = choose(req(pv_accum_dtype="fp16+fp32"), inv(*ALL))
    assert choice.name == "cuda-sm80-fp16" and choice.pv_accum_dtype == "fp16+fp32"
    assert not choice.adjustments


def test_fp16_cuda_function_runs_sm90_where_it_serves_the_call_else_sm80():
    from sageattention.core import _FP16_NATIVE

    def pick(cap=(9, 0), families=ALL, **kw):
        return choose(req(cap, **kw), inv(*families), candidates=_FP16_NATIVE, allow_fallback=False)

    for gran in ("per_thread", "per_warp"):
        for d in (64, 128):
            choice = pick(qk_quant_gran=gran, pv_accum_dtype="fp32", head_dim=d, dtype=torch.bfloat16)
            assert choice.name == "cuda-sm90-fp16" and not choice.adjustments
            assert (choice.qk_quant_gran, choice.pv_accum_dtype) == (gran, "fp32")
    for accum in ("fp16+fp32", "fp16"):  # accumulation modes only the sm80 family has
        choice = pick(pv_accum_dtype=accum)
        assert choice.name == "cuda-sm80-fp16" and choice.pv_accum_dtype == accum
        assert not choice.adjustments and "cuda-sm90-fp16: pv_accum_dtype=" in choice.reason
    assert pick(families=("sm80", "sm89")).name == "cuda-sm80-fp16"  # a wheel without it
    assert pick((8, 0)).name == "cuda-sm80-fp16" and pick((8, 9)).name == "cuda-sm80-fp16"
    # only the sm90 family installed: it runs, with its own accumulator, and says so
    alone = pick(families=("sm90",), pv_accum_dtype="fp16")
    assert alone.name == "cuda-sm90-fp16" and alone.pv_accum_dtype == "fp32"
    assert "pv_accum_dtype='fp16' is not provided by cuda-sm90-fp16" in alone.adjustments[0]
    with pytest.raises(BackendUnavailableError, match="contains: native families sm90"):
        pick((8, 9), families=("sm90",))  # an sm_90a-only build on Ada: not in 8.9's order at all


def test_fp8_cuda_functions_run_sm90_fp8_where_it_serves_the_call_else_sm89():
    from sageattention.core import _FP8_NATIVE

    def pick(cap=(9, 0), families=ALL, **kw):
        return choose(req(cap, **kw), inv(*families), candidates=_FP8_NATIVE, allow_fallback=False)

    for gran in ("per_thread", "per_warp"):
        for accum in ("fp32+fp32", "fp32"):
            for d in (64, 128):
                choice = pick(qk_quant_gran=gran, pv_accum_dtype=accum, head_dim=d, dtype=torch.bfloat16)
                assert choice.name == "cuda-sm90-fp8" and not choice.adjustments
                assert (choice.qk_quant_gran, choice.pv_accum_dtype) == (gran, accum)
    # "fp32+fp16" (sageattn_qk_int8_pv_fp8_cuda's default) only the sm89 family has
    choice = pick(pv_accum_dtype="fp32+fp16")
    assert choice.name == "cuda-sm89-fp8" and choice.pv_accum_dtype == "fp32+fp16"
    assert not choice.adjustments and "cuda-sm90-fp8: pv_accum_dtype='fp32+fp16'" in choice.reason
    assert pick(families=("sm80", "sm89")).name == "cuda-sm89-fp8"  # a wheel without it
    assert pick((8, 9)).name == "cuda-sm89-fp8"  # sm_90a code: not on Ada
    # only the sm90_fp8 family installed: it runs, with its own accumulator, and says so
    alone = pick(families=("sm90_fp8",), pv_accum_dtype="fp32+fp16")
    assert alone.name == "cuda-sm90-fp8" and alone.pv_accum_dtype == "fp32+fp32"
    assert "pv_accum_dtype='fp32+fp16' is not provided by cuda-sm90-fp8 (it has fp32+fp32, fp32)" \
        in alone.adjustments[0]
    with pytest.raises(BackendUnavailableError, match="contains: native families sm90_fp8"):
        pick((8, 9), families=("sm90_fp8",))


def test_forcing_cuda_sm90_fp8_on_another_gpu_says_why():
    with pytest.raises(BackendUnavailableError, match=r"compute capability 8.9 is not served \(sm90\)"):
        choose(req((8, 9)), inv(*ALL), forced="cuda-sm90-fp8")
    forced = choose(req((9, 0)), inv(*ALL), forced="cuda-sm90-fp8")
    assert (forced.name, forced.pv_accum_dtype) == ("cuda-sm90-fp8", "fp32+fp32")


def test_forcing_cuda_sm90_fp16_on_another_gpu_says_why():
    with pytest.raises(BackendUnavailableError, match=r"compute capability 10.0 is not served \(sm90\)"):
        choose(req((10, 0)), inv(*ALL), forced="cuda-sm90-fp16")
    assert choose(req((9, 0)), inv(*ALL), forced="cuda-sm90-fp16").name == "cuda-sm90-fp16"


def test_unavailable_granularity_is_substituted_and_said():
    choice = choose(req((7, 5), qk_quant_gran="per_block"), inv(*ALL))
    assert choice.name == "cuda-sm75-fp16" and choice.qk_quant_gran == "per_thread"
    assert any("per_block" in a and "per_thread" in a for a in choice.adjustments)
    assert "skipped" not in choice.reason  # the chosen backend is not listed as skipped


@pytest.mark.parametrize("gran", ["per_warp", "per_thread"])
def test_sm75_takes_either_cuda_granularity_as_asked(gran):
    choice = choose(req((7, 5), qk_quant_gran=gran), inv(*ALL))
    assert choice.name == "cuda-sm75-fp16" and choice.qk_quant_gran == gran
    assert not choice.adjustments


# --- kernel-specific functions: candidates without fallback -----------------------------------

def test_kernel_function_without_its_family_is_a_clear_error():
    with pytest.raises(BackendUnavailableError, match=r"cuda-sm89-fp8.*installed build contains: native "
                                                      r"families sm80"):
        choose(req((8, 0)), inv("sm80"), candidates=("cuda-sm89-fp8",), allow_fallback=False)
    with pytest.raises(BackendUnavailableError, match="not in this build"):
        choose(req((9, 0)), inv("sm75"), candidates=("cuda-sm89-fp8",), allow_fallback=False)


@pytest.mark.parametrize("cap,candidates,why", [
    ((8, 0), ("cuda-sm90-fp8", "cuda-sm89-fp8"),
     ["cuda-sm90-fp8: compute capability 8.0 is not served (sm90)",
      "cuda-sm89-fp8: compute capability 8.0 is not served (sm89, sm90)"]),
    ((8, 6), ("cuda-sm89-fp8",), ["cuda-sm89-fp8: compute capability 8.6 is not served (sm89, sm90)"]),
    ((7, 5), ("triton-fp16",), ["triton-fp16: compute capability 7.5 is not served (sm80+)"]),
])
def test_kernel_function_refused_by_the_gpu_says_why_for_each_of_its_backends(cap, candidates, why):
    # Backends this GPU's preference order leaves out (FP8 on Ampere, Triton on Turing): every family
    # is installed, so the GPU is the reason, and the refusal must say so, not "none is listed".
    with pytest.raises(BackendUnavailableError) as raised:
        choose(req(cap), inv(*ALL), candidates=candidates, allow_fallback=False)
    message = str(raised.value)
    assert "no quantized backend is listed" not in message
    for text in why:
        assert text in message


def test_grid_limit_is_the_one_the_kernels_refuse_past():
    header = (REPO / "csrc" / "common" / "grid_limits.h").read_text()
    assert f"constexpr int64_t kMaxGridYZ = {backends.MAX_GRID_YZ};" in header
    from sageattention import triton as triton_backend
    assert triton_backend.MAX_GRID_YZ is backends.MAX_GRID_YZ
    assert backends.backend("sdpa").max_batch_and_heads is None
    assert all(backends.backend(n).max_batch_and_heads == backends.MAX_GRID_YZ
               for n in backends.BACKEND_NAMES if n != "sdpa")


def test_token_limits_are_the_ones_the_kernels_refuse_past():
    header = (REPO / "csrc" / "common" / "grid_limits.h").read_text()
    assert "constexpr int64_t kMaxTokens = int64_t{1} << 30;" in header
    assert backends.MAX_NATIVE_TOKENS == 2**30
    from sageattention import triton as triton_backend
    for name in backends.BACKEND_NAMES:
        row = backends.backend(name)
        want = {"native": backends.MAX_NATIVE_TOKENS, "triton": triton_backend.MAX_TOKENS, "sdpa": None}[row.kind]
        assert row.max_tokens == want, name
    long_call = choose(req((9, 0), seq_q=64, seq_k=2**30 + 1), inv(*ALL))
    assert long_call.name == "sdpa" and "cuda-sm90-fp16: 1073741825 key tokens" in long_call.reason


def test_kernel_function_falls_back_when_the_input_needs_sdpa():
    for kw in ({"has_mask": True}, {"dtype": torch.float32}, {"device_type": "cpu", "capability": None},
               {"requires_grad": True}, {"head_dim": 160}, {"batch": 70000}, {"q_heads": 70000}):
        choice = choose(req(**kw), inv(), candidates=("cuda-sm89-fp8",), allow_fallback=False)
        assert choice.name == "sdpa" and choice.fallback, kw


def test_triton_function_takes_masks():
    choice = choose(req(has_mask=True), inv(*ALL), candidates=("triton-fp16",), allow_fallback=False)
    assert choice.name == "triton-fp16"


# --- forcing --------------------------------------------------------------------------------

def test_forcing_a_usable_backend():
    assert choose(req(), inv(*ALL), forced="cuda-sm80-fp16").name == "cuda-sm80-fp16"
    assert choose(req(), inv(*ALL), forced="cuda-sm75-fp16").name == "cuda-sm75-fp16"
    forced_sdpa = choose(req(), inv(*ALL), forced="sdpa")
    assert forced_sdpa.name == "sdpa" and "forced" in forced_sdpa.reason


@pytest.mark.parametrize("name,kw,match", [
    ("cuda-sm89-fp8", {"capability": (8, 0)}, "not served"),
    ("cuda-sm80-fp16", {}, "not in this build"),
    ("cuda-sm89-fp8", {"has_mask": True}, "takes no attention mask"),
    ("triton-fp16", {"device_type": "cpu", "capability": None}, "CUDA"),
    ("cuda-sm89-fp8", {"batch": 70000}, "batch 70000 exceeds the launch grid limit of 65535"),
    ("triton-fp16", {"q_heads": 70000}, "query heads 70000 exceeds the launch grid limit"),
    ("triton-fp16", {"seq_k": 2**30 + 1}, "1073741825 key tokens in one sequence exceed its limit of 1073741824"),
    ("triton-fp8", {"seq_q": 2**30 + 1}, "query tokens in one sequence exceed its limit"),
])
def test_forcing_an_unusable_backend_is_an_error(name, kw, match):
    with pytest.raises(BackendUnavailableError, match=match):
        choose(req(**kw), inv("sm89"), forced=name)


def test_force_backend_context_and_env_var():
    assert dispatch.forced_backend(env={}) is None
    assert dispatch.forced_backend(env={"SAGEATTENTION_BACKEND": "sdpa"}) == "sdpa"
    with pytest.raises(ValueError, match="SAGEATTENTION_BACKEND='cuda'.*cuda-sm80-fp16"):
        dispatch.forced_backend(env={"SAGEATTENTION_BACKEND": "cuda"})
    with sa.force_backend("triton-fp16"):
        assert dispatch.forced_backend(env={"SAGEATTENTION_BACKEND": "sdpa"}) == "triton-fp16"
        with sa.force_backend("sdpa"):
            assert dispatch.forced_backend(env={}) == "sdpa"
        assert dispatch.forced_backend(env={}) == "triton-fp16"
    assert dispatch.forced_backend(env={}) is None
    with pytest.raises(ValueError, match="not a backend"):
        with sa.force_backend("flash"):
            pass


def test_forced_native_on_cpu_tensors_raises_through_the_api(monkeypatch):
    monkeypatch.delenv("SAGEATTENTION_BACKEND", raising=False)
    q = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    with sa.force_backend("cuda-sm80-fp16"):
        with pytest.raises(BackendUnavailableError, match="cuda-sm80-fp16.*CUDA"):
            sa.sageattn(q, q, q)
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "cuda-sm89-fp8")
    with pytest.raises(BackendUnavailableError):
        sa.sageattn(q, q, q)
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "sdpa")
    sa.sageattn(q, q, q)
    assert sa.last_backend() == "sdpa"


# --- explain / last_backend / logging ----------------------------------------------------------

def test_select_backend_and_explain_on_cpu():
    q = torch.randn(1, 2, 8, 64)
    choice = sa.select_backend(q, q, q, is_causal=True)
    assert choice.name == "sdpa" and choice.fallback and "cpu" in choice.reason
    text = sa.explain(q, q, q)
    assert text.startswith("sageattn falls back to PyTorch SDPA because") and "cpu" in text


def test_explain_sentence_for_a_native_choice():
    choice = choose(req((8, 0)), inv(*ALL))
    text = choice.sentence()
    assert "'cuda-sm80-fp16'" in text and "per_thread" in text and "fp32" in text


def test_last_backend_is_thread_local():
    q = torch.randn(1, 2, 8, 64)
    sa.sageattn(q, q, q)
    assert sa.last_backend() == "sdpa"
    seen = []
    t = threading.Thread(target=lambda: seen.append(sa.last_backend()))
    t.start()
    t.join()
    assert seen == [None]


def test_each_fallback_reason_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(dispatch, "_logged", set())
    q = torch.randn(1, 2, 8, 64)
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        for _ in range(3):
            sa.sageattn(q, q, q)
            sa.sageattn(q.double(), q.double(), q.double())
    messages = [r.getMessage() for r in caplog.records if r.name == "sageattention"]
    assert len(messages) == 1 and "on cpu" in messages[0]
    # A different reason is a different message.
    monkeypatch.setattr(dispatch, "_logged", set())
    with caplog.at_level(logging.WARNING, logger="sageattention"):
        dispatch.log_once("a")
        dispatch.log_once("b")
        dispatch.log_once("a")
    assert [r.getMessage() for r in caplog.records][-2:] == ["a", "b"]


def test_inventory_without_compiled_kernels_says_why():
    state = dispatch._native_state()
    assert set(state) == set(ALL)
    # In a source checkout nothing is compiled; each family reports a reason, never a crash.
    for why in state.values():
        assert why is None or isinstance(why, str)


def test_a_scale_past_the_checked_limit_runs_sdpa_and_forcing_a_kernel_is_refused():
    from sageattention.core import _FP16_NATIVE
    huge = dict(scale_magnitude=dispatch.scale_magnitude(-1e30))
    choice = choose(req(**huge), inv(*ALL))
    assert choice.name == "sdpa" and "|sm_scale| 1e+30 is above 1000" in choice.reason
    assert choose(req(**huge), inv(*ALL), candidates=_FP16_NATIVE, allow_fallback=False).name == "sdpa"
    with pytest.raises(BackendUnavailableError, match=r"\|sm_scale\| 1e\+30 is above 1000"):
        choose(req(**huge), inv(*ALL), forced="triton-fp16")
    # at the limit and below, and for zero or negative scales, nothing changes (one cache key)
    for scale in (1000.0, -1000.0, 0.0, -0.125, 0.125):
        assert dispatch.scale_magnitude(scale) == 0.0
    assert choose(req(), inv(*ALL)).name == "cuda-sm90-fp16"


def test_sageattn_passes_its_scale_to_the_dispatcher(monkeypatch):
    seen = []
    real = dispatch.choose
    monkeypatch.setattr(dispatch, "choose", lambda r, *a, **kw: seen.append(r) or real(r, *a, **kw))
    q = torch.randn(1, 2, 8, 64)
    sa.sageattn(q, q, q, sm_scale=-5e3)
    sa.sageattn_varlen(q[0].transpose(0, 1).contiguous(), q[0].transpose(0, 1).contiguous(),
                       q[0].transpose(0, 1).contiguous(), torch.tensor([0, 8], dtype=torch.int32),
                       torch.tensor([0, 8], dtype=torch.int32), 8, 8, sm_scale=2e3)
    assert [r.scale_magnitude for r in seen] == [5e3, 2e3]


def test_the_triton_rows_kernel_widths_are_the_widths_the_kernels_pad_to():
    # the calibration's padding factor reads them; the Triton quantization pads by its own rule
    quant = pytest.importorskip("sageattention.triton.quant")
    for name in ("triton-fp16", "triton-fp8"):
        row = backends.backend(name)
        assert all(row.padded_head_dim(d) == quant.padded_head_dim(d) for d in row.head_dims), name
