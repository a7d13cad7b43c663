"""The validation suite's own logic, on the CPU, against a fake sageattention.

The fake computes attention with fp32 SDPA and reports a backend name like the real dispatcher;
variants of it carry one bug each (a fallback when forced, an ignored mask, NaN past a block
boundary, drift, an exception) and the tests assert the suite turns each into the right failure.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sageattention import backends, benchmark
from sageattention.validation import CHECK_NAMES, CHECKS, run_suite, suite
from sageattention.validation import profile as profile_module
from sageattention.validation import __main__ as cli
from sageattention.validation.accuracy import FP8_PV_BAR, FP16_PV_BAR, Errors, bar_for, errors
from sageattention.validation.api import Api
from sageattention.validation.expectation import NoNativeCode, backend_name, expect, parse_target
from sageattention.validation.profile import Profile
from sageattention.validation.runner import select

REPO = Path(__file__).resolve().parents[2]
FAMILIES = json.loads((REPO / "sageattention/native/families.json").read_text())

SEED_NAMES = [
    "Native runtime", "Public SageAttention API", "FP16", "BF16", "HND and NHD tensor layouts",
    "Causal and non-causal attention", "Head dimensions 64 and 128",
    "Sequence-length boundary testing", "GQA / MQA", "Cross-attention", "return_lse",
    "Custom attention scale", "CUDA graph capture", "PyTorch autocast FP16/BF16",
    "Two CUDA streams", "Two-GPU alternating-device testing", "Long sequence N=16384",
    "500-call FP16/BF16 stress testing", "Boolean attention masks",
    "Additive floating-point attention masks", "Float32 additive masks with FP16/BF16 Q/K/V",
    "Normal unmasked native path regression",
]

TINY = Profile(batch=1, heads=4, seq_len=48, head_dims=(64, 128),
               boundary_lengths=(1, 7, 16, 33), cross_lengths=(20, 45), long_seq_len=128,
               long_heads=2, stress_calls=12, stress_shape=(1, 2, 32, 64), two_gpu_calls=2,
               lane_shape=(1, 2, 32, 64), stream_calls=2, compile_backend="eager")

SM90_BUILD = {"version": "2.2.0+sm90.torch2.11cu130", "sm_targets": ["sm90"],
              "families": ["sm80", "sm89"], "torch": "2.11.0", "cuda": "13.0"}
SM75_BUILD = {"version": "2.2.0+sm75.torch2.11cu130", "sm_targets": ["sm75+PTX"],
              "families": ["sm75"], "torch": "2.11.0", "cuda": "13.0"}


class FakeLib:
    """Attention by fp32 SDPA, with the dispatch bookkeeping of the real package."""

    def __init__(self, native=("cuda-sm80-fp16", "cuda-sm89-fp8"), default="cuda-sm89-fp8"):
        self.native = set(native)
        self.default = default
        self.local = threading.local()
        self.calls = 0
        self.specific_calls = []  # (forced backend, pv_accum_dtype) of each kernel-specific call
        self.__version__ = "2.2.0+fake"
        for name in ("sageattn_varlen", "sageattn_qk_int8_pv_fp16_triton",
                     "sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp8_cuda",
                     "sageattn_qk_int8_pv_fp8_cuda_sm90"):
            setattr(self, name, self._specific)

    # -- dispatch API ------------------------------------------------------------------
    def force_backend(self, name):
        lib = self

        class _Force:
            def __enter__(self):
                self.prev = getattr(lib.local, "forced", None)
                lib.local.forced = name

            def __exit__(self, *exc):
                lib.local.forced = self.prev

        return _Force()

    def last_backend(self):
        return getattr(self.local, "last", None)

    def choose(self, attn_mask):
        forced = getattr(self.local, "forced", None)
        if attn_mask is not None:
            return "sdpa"
        if forced:
            return forced if forced in self.native else "sdpa"
        return self.default

    # -- the functions -----------------------------------------------------------------
    def _specific(self, q, k, v, tensor_layout="HND", is_causal=False, **kwargs):
        kwargs.pop("qk_quant_gran", None)
        self.specific_calls.append((getattr(self.local, "forced", None), kwargs.pop("pv_accum_dtype", None)))
        return self.sageattn(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, **kwargs)

    def sageattn(self, q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None,
                 return_lse=False, attn_mask=None):
        self.calls += 1
        self.local.last = self.choose(attn_mask)
        with torch.autocast(q.device.type, enabled=False):
            out, lse = self.attention(q, k, v, tensor_layout, is_causal, sm_scale, attn_mask)
        return (out, lse) if return_lse else out

    def attention(self, q, k, v, layout, causal, scale, mask):
        def hnd(x):
            return x if layout == "HND" else x.transpose(1, 2)

        qh, kh, vh = (hnd(t).float() for t in (q, k, v))
        group = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
        if mask is not None and mask.dtype != torch.bool:
            mask = mask.float()
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal,
                                             scale=scale)
        scale = qh.shape[-1] ** -0.5 if scale is None else scale
        s = qh @ kh.transpose(-1, -2) * scale
        if causal:
            keep = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
            s = s.masked_fill(~keep, -math.inf)
        return hnd(out).to(q.dtype), torch.logsumexp(s, -1)


def make_api(lib: FakeLib, build=SM90_BUILD, available=None) -> Api:
    fams = build["families"]
    return Api(sageattn=lib.sageattn, force_backend=lib.force_backend,
               last_backend=lib.last_backend, module=lib,
               available_families=lambda: available or {f: None for f in fams},
               build_info=lambda: build, families_table=lambda: FAMILIES,
               backends_table=lambda: None)


def run(lib, build=SM90_BUILD, only=None, gpu_sm=90, available=None):
    checks = select(CHECKS, only, None)
    return run_suite(api=make_api(lib, build, available), device=torch.device("cpu"),
                     profile=TINY, checks=checks, performance=False, gpu_sm=gpu_sm, argv=["x"])


def by_name(doc):
    return {c["name"]: c for c in doc["checks"]}


# -- the check list ----------------------------------------------------------------------

def test_check_names_are_the_seeds_plus_four():
    assert CHECK_NAMES == SEED_NAMES + ["torch.compile", "Non-contiguous inputs",
                                        "Extreme magnitudes", "Head dimensions 40 and 96 (zero-padded)"]
    assert len({c.slug for c in CHECKS}) == len(CHECKS)


def test_seed_names_appear_verbatim_in_the_seed():
    seed = REPO.parent / "shared/seeds/sm75-turing-release-notes.txt"
    if not seed.exists():
        pytest.skip(f"seed notes not present at {seed}")
    text = seed.read_text()
    generic = {"Native runtime": "Native SM75 runtime",
               "Normal unmasked native path regression": "Normal unmasked native SM75 path"}
    for name in SEED_NAMES:
        assert generic.get(name, name) in text, name


# -- a correct library ----------------------------------------------------------------------

def test_correct_library_passes_everything_that_can_run_on_cpu():
    doc = run(FakeLib())
    checks = by_name(doc)
    assert list(checks) == CHECK_NAMES
    cuda_only = {"CUDA graph capture", "Two CUDA streams", "Two-GPU alternating-device testing"}
    for name, rec in checks.items():
        if name in cuda_only:
            assert rec["status"] == "skip" and rec["reason"] == "needs a CUDA device", rec
        else:
            assert rec["status"] == "pass", (name, rec["reason"])
    assert doc["execution"] == "native"
    assert [b["name"] for b in doc["expectation"]["native_backends"]] == \
        ["cuda-sm80-fp16", "cuda-sm89-fp8"]
    fp16 = checks["FP16"]
    assert fp16["backends"] == ["cuda-sm80-fp16", "cuda-sm89-fp8"]
    assert fp16["errors"]["cosine"] > 0.9999 and fp16["errors"]["rel_l1"] < 0.01
    assert checks["Boolean attention masks"]["backend"] == "sdpa"
    assert doc["summary"] == {"pass": 23, "fail": 0, "skip": 3, "failed": [], "all_passed": True}
    assert set(doc["accuracy"]) == {"cuda-sm80-fp16", "cuda-sm89-fp8"}
    json.dumps(doc, allow_nan=False)  # strict JSON


# -- each bug becomes the right failure ---------------------------------------------------

def test_a_native_check_that_runs_the_fallback_fails():
    lib = FakeLib(native=("cuda-sm80-fp16",))  # the fp8 family "does not work": falls back
    doc = run(lib, only=["fp16", "bool-masks"])
    fp16 = by_name(doc)["FP16"]
    assert fp16["status"] == "fail"
    assert "forced cuda-sm89-fp8 but sdpa ran" in fp16["reason"]
    assert "sdpa" in fp16["backends"]
    # a masked check may use the fallback
    assert by_name(doc)["Boolean attention masks"]["status"] == "pass"


def test_default_dispatch_to_a_fallback_fails_public_api_and_regression():
    lib = FakeLib(default="triton-fp16")
    doc = run(lib, only=["public-api", "unmasked-regression"])
    for rec in doc["checks"]:
        assert rec["status"] == "fail"
        assert "triton-fp16" in rec["reason"]


class CalibratedLib(FakeLib):
    """Default dispatch runs SDPA because a calibration table says so; static order runs native."""

    def __init__(self, calibrated=True, static_default="cuda-sm89-fp8", calibrated_default="sdpa"):
        super().__init__(default=calibrated_default)
        self.calibrated = calibrated
        self.static_default = static_default

    def select_backend(self, *args, **kwargs):
        return type("Choice", (), {"name": self.default, "calibrated": self.calibrated,
                                   "reason": f"{self.default} is fastest for this shape (calibration sm90)"})()

    def static(self):
        lib = self

        class _Static:
            def __enter__(self):
                lib.default, self.prev = lib.static_default, lib.default

            def __exit__(self, *exc):
                lib.default = self.prev

        return _Static()


def run_calibrated(lib):
    api = make_api(lib)
    api.select_backend, api.static_dispatch = lib.select_backend, lib.static
    return run_suite(api=api, device=torch.device("cpu"), profile=TINY,
                     checks=select(CHECKS, ["public-api", "unmasked-regression"], None),
                     performance=False, gpu_sm=90, argv=["x"])


def test_default_dispatch_may_run_sdpa_by_calibration_then_the_static_order_must_be_native():
    doc = run_calibrated(CalibratedLib())
    for rec in doc["checks"]:
        assert rec["status"] == "pass", rec
        assert "cuda-sm89-fp8" in rec["backends"] and "sdpa" in rec["backends"]
        assert any("by calibration" in n for n in rec.get("notes", [])), rec


def test_a_calibrated_triton_choice_is_held_to_its_bar_then_the_static_order_must_be_native():
    doc = run_calibrated(CalibratedLib(calibrated_default="triton-fp16"))
    for rec in doc["checks"]:
        assert rec["status"] == "pass", rec
        assert {"triton-fp16", "cuda-sm89-fp8"} <= set(rec["backends"]), rec
        assert any("ran triton-fp16 by calibration" in n for n in rec.get("notes", [])), rec


def test_a_triton_choice_without_calibration_fails():
    doc = run_calibrated(CalibratedLib(calibrated=False, calibrated_default="triton-fp16"))
    for rec in doc["checks"]:
        assert rec["status"] == "fail", rec
        assert "expected one of this build's native backends" in rec["reason"]


def test_sdpa_without_a_calibrated_choice_or_a_non_native_static_order_fails():
    for lib in (CalibratedLib(calibrated=False), CalibratedLib(static_default="triton-fp16")):
        doc = run_calibrated(lib)
        for rec in doc["checks"]:
            assert rec["status"] == "fail", rec
            assert "expected one of this build's native backends" in rec["reason"]


def test_an_ignored_mask_fails_the_mask_checks():
    lib = FakeLib()
    original = lib.attention
    lib.attention = lambda q, k, v, lay, c, s, mask: original(q, k, v, lay, c, s, None)
    doc = run(lib, only=["bool-masks", "additive-masks", "fp32-additive-masks"])
    for rec in doc["checks"]:
        assert rec["status"] == "fail", rec["name"]
        assert "cosine" in rec["reason"]


def test_reading_past_the_sequence_end_is_caught():
    lib = FakeLib()
    original = lib.attention

    def sloppy(q, k, v, layout, causal, scale, mask):
        n = k.shape[2]
        if n % 16 and not k.is_contiguous():  # a view: read the whole last 16-token block
            size = (k.shape[0], k.shape[1], n + 16 - n % 16, k.shape[3])
            k = k.as_strided(size, k.stride(), k.storage_offset())
            v = v.as_strided(size, v.stride(), v.storage_offset())
        out, lse = original(q, k, v, layout, False, scale, mask)
        return out, lse

    lib.attention = sloppy
    doc = run(lib, only=["seq-boundaries"])
    rec = doc["checks"][0]
    assert rec["status"] == "fail"
    assert "non-finite" in rec["reason"]
    assert any(c["label"].endswith("N=7 causal=False") and not c["ok"] for c in rec["cases"])


def test_padding_that_scales_by_the_padded_width_is_caught():
    """A kernel run zero-padded must keep the call's own scale, head_dim ** -0.5 of the real head
    dim: one that takes the padded width's (64 for 40) is off, and the padded check says so."""
    lib = FakeLib()
    original = lib.attention

    def padded_scale(q, k, v, layout, causal, scale, mask):
        d = q.shape[-1]
        width = 64 if d <= 64 else 128
        return original(q, k, v, layout, causal, width ** -0.5 if scale is None else scale, mask)

    lib.attention = padded_scale
    doc = run(lib, only=["padded-head-dims", "head-dims"])
    padded, plain = (by_name(doc)[name] for name in ("Head dimensions 40 and 96 (zero-padded)",
                                                       "Head dimensions 64 and 128"))
    assert plain["status"] == "pass", plain
    assert padded["status"] == "fail", padded
    failed = [c["label"] for c in padded["cases"] if not c["ok"]]
    for d in (40, 96):   # every native backend, each head dim
        assert sum(label.endswith(f"head_dim={d} causal=False") for label in failed) == 2, failed


def test_drift_over_repeated_calls_fails_the_stress_check():
    lib = FakeLib()
    original = lib.attention

    def drifting(*args):
        out, lse = original(*args)
        return out + 1e-4 * lib.calls, lse  # small at first, then grows call by call

    lib.attention = drifting
    rec = run(lib, only=["stress"])["checks"][0]
    assert rec["status"] == "fail"
    assert any("drifted" in f for f in rec["failures"]), rec["failures"]


def test_an_exception_fails_one_check_and_the_run_goes_on():
    lib = FakeLib()
    original = lib.attention

    def broken(q, k, v, layout, *rest):
        if layout == "NHD":
            raise RuntimeError("NHD kernel exploded")
        return original(q, k, v, layout, *rest)

    lib.attention = broken
    doc = run(lib, only=["fp16", "layouts", "bf16"])
    status = {c["name"]: c["status"] for c in doc["checks"]}
    assert status == {"FP16": "pass", "HND and NHD tensor layouts": "fail", "BF16": "pass"}
    layouts = by_name(doc)["HND and NHD tensor layouts"]
    assert "RuntimeError: NHD kernel exploded" in layouts["reason"]
    assert "traceback" in layouts
    assert doc["summary"]["failed"] == ["HND and NHD tensor layouts"]


def test_a_family_that_did_not_load_fails_native_runtime():
    doc = run(FakeLib(), only=["native-runtime"],
              available={"sm80": None, "sm89": "undefined symbol: _ZN3c10..."})
    rec = doc["checks"][0]
    assert rec["status"] == "fail" and "sm89 did not load: undefined symbol" in rec["reason"]


def test_two_gpu_check_skips_with_the_reason_on_one_gpu(monkeypatch):
    from sageattention.validation import checks_runtime
    from sageattention.validation.runner import Skip

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    with pytest.raises(Skip, match=r"needs two GPUs; this machine has 1 \(NVIDIA H200\)"):
        checks_runtime.two_gpus(None, None, "cuda-sm80-fp16")


# -- expectations: native, PTX-JIT, nothing ------------------------------------------------

def test_sm75_ptx_wheel_on_sm90_runs_ptx_jit_and_forces_the_family():
    lib = FakeLib(native=("cuda-sm75-fp16",), default="triton-fp16")
    doc = run(lib, build=SM75_BUILD, only=["native-runtime", "public-api", "fp16"])
    assert doc["execution"] == "ptx-jit"
    assert doc["expectation"]["native_backends"] == [
        {"name": "cuda-sm75-fp16", "family": "sm75", "via": "ptx", "ptx_arch": "compute_75"}]
    checks = by_name(doc)
    assert all(c["status"] == "pass" for c in checks.values()), checks
    assert checks["FP16"]["backend"] == "cuda-sm75-fp16"
    assert any("compute_75 PTX" in n for n in checks["Native runtime"]["notes"])


def test_sm75_wheel_on_sm75_is_native():
    e = expect(gpu_sm=75, families_table=FAMILIES, build_info=SM75_BUILD, available={})
    assert e.execution == "native" and e.names == ["cuda-sm75-fp16"]


def test_sass_runs_on_a_newer_minor_of_the_same_major():
    build = {**SM90_BUILD, "sm_targets": ["sm80"], "families": ["sm80"]}
    e = expect(gpu_sm=86, families_table=FAMILIES, build_info=build, available={})
    assert e.execution == "native" and e.names == ["cuda-sm80-fp16"]


def test_sass_never_runs_on_an_older_minor_or_another_major():
    # SASS is forward-compatible only within a major, from its own minor up (CUDA's rule): an sm86
    # wheel without PTX has nothing to run on an sm80 GPU, nor an sm80 wheel on sm90
    from sageattention.validation.expectation import sass_runs_on
    runs = {(t, g) for t in (75, 80, 86, 89, 90) for g in (75, 80, 86, 89, 90, 100) if sass_runs_on(t, g)}
    assert runs == {(75, 75), (80, 80), (80, 86), (80, 89), (86, 86), (86, 89), (89, 89), (90, 90)}
    build = {**SM90_BUILD, "sm_targets": ["sm86"], "families": ["sm80"]}
    with pytest.raises(NoNativeCode, match=r"this build has no kernel for .*SM targets \['sm86'\]"):
        expect(gpu_sm=80, families_table=FAMILIES, build_info=build, available={})
    build = {**SM90_BUILD, "sm_targets": ["sm80"], "families": ["sm80"]}
    with pytest.raises(NoNativeCode, match=r"this build has no kernel for .*SM targets \['sm80'\]"):
        expect(gpu_sm=90, families_table=FAMILIES, build_info=build, available={})


def test_ptx_listed_in_build_info_counts():
    build = {**SM75_BUILD, "sm_targets": ["sm75"], "ptx": ["compute_75"]}
    e = expect(gpu_sm=90, families_table=FAMILIES, build_info=build, available={})
    assert e.execution == "ptx-jit" and e.names == ["cuda-sm75-fp16"]
    build["ptx"] = []
    with pytest.raises(NoNativeCode):
        expect(gpu_sm=90, families_table=FAMILIES, build_info=build, available={})


@pytest.mark.parametrize("targets, families, ptx_arch", [
    (["sm80+PTX"], ["sm80"], "compute_80"),
    (["sm86+PTX"], ["sm80"], "compute_86"),
    (["sm89+PTX"], ["sm80", "sm89"], "compute_89"),
])
def test_ampere_and_ada_ptx_wheels_on_sm90_run_each_family_through_its_ptx(targets, families, ptx_arch):
    build = {**SM90_BUILD, "sm_targets": targets, "families": families}
    e = expect(gpu_sm=90, families_table=FAMILIES, build_info=build, available={})
    assert e.execution == "ptx-jit"
    assert [(b.family, b.via, b.ptx_arch) for b in e.backends] == [(f, "ptx", ptx_arch) for f in families]
    # the same wheel on its own GPU runs its SASS; PTX forward only: not on an older GPU
    own = int(targets[0][2:4])
    assert expect(gpu_sm=own, families_table=FAMILIES, build_info=build, available={}).execution == "native"
    with pytest.raises(NoNativeCode):
        expect(gpu_sm=75, families_table=FAMILIES, build_info=build, available={})


def test_plus_ptx_counts_only_where_the_dispatcher_runs_the_family():
    # an [sm90+PTX] build on a newer GPU: the sm_90a families carry no PTX, and the dispatcher
    # runs the sm80 / sm89 families only on the GPUs they serve (only sm75's embed_ptx reaches on)
    build = {**SM90_BUILD, "sm_targets": ["sm90+PTX"], "families": ["sm80", "sm89", "sm90", "sm90_fp8"]}
    with pytest.raises(NoNativeCode, match="no kernel for sm100"):
        expect(gpu_sm=100, families_table=FAMILIES, build_info=build, available={})
    assert not backends.backend("cuda-sm80-fp16").serves((10, 0))
    assert backends.backend("cuda-sm80-fp16").serves((9, 0)) and backends.backend("cuda-sm89-fp8").serves((9, 0))


def test_ptx_serves_agrees_with_the_dispatchers_capabilities():
    # the rule the guard, the release manifest and the picker share (expectation.ptx_serves)
    # says what backends.py lets each family run on, for every PTX a wheel can carry
    from sageattention.validation.expectation import ptx_runs_on, ptx_serves, wheel_ptx_serves
    fams = FAMILIES["families"]
    assert ptx_serves(fams["sm75"], 75) is None                       # embed_ptx: every newer GPU
    assert ptx_serves(fams["sm80"], 80) == {80, 86, 87, 89, 90}
    assert ptx_serves(fams["sm89"], 89) == {89, 90}
    assert ptx_serves(fams["sm90"], 90) == frozenset()                # arch-specific: no PTX
    assert ptx_serves(fams["sm89"], 80) == frozenset()                # not one of its SMs
    assert wheel_ptx_serves(fams, ["sm80", "sm89"], 89) == {89, 90}
    assert wheel_ptx_serves(fams, ["sm75", "sm80"], 75) is None
    for gpu in (75, 80, 86, 89, 90, 100, 120):
        for family, spec in fams.items():
            for ptx_sm in (75, 80, 86, 89, 90):
                name = backend_name(family, spec["ops"][0])
                if ptx_runs_on(ptx_serves(spec, ptx_sm), ptx_sm, gpu):
                    assert backends.backend(name).serves((gpu // 10, gpu % 10)), (family, ptx_sm, gpu)


def test_wheel_without_code_for_the_gpu_is_refused():
    build = {**SM90_BUILD, "sm_targets": ["sm80"], "families": ["sm80"]}
    with pytest.raises(NoNativeCode, match="no kernel for sm90"):
        expect(gpu_sm=90, families_table=FAMILIES, build_info=build, available={})


def test_sm90_wheel_with_the_sm90_family_runs_three_families_natively_on_sm90_only():
    build = {**SM90_BUILD, "families": ["sm80", "sm89", "sm90"]}
    e = expect(gpu_sm=90, families_table=FAMILIES, build_info=build, available={})
    assert e.execution == "native"
    assert e.names == ["cuda-sm80-fp16", "cuda-sm89-fp8", "cuda-sm90-fp16"]
    assert {b.via for b in e.backends} == {"sass"}
    # an [sm80, sm90] wheel on an A100 or an sm86 GPU: the sm_90a family is not expected there
    multi = {**build, "sm_targets": ["sm80", "sm90"]}
    for gpu in (80, 86):
        assert expect(gpu_sm=gpu, families_table=FAMILIES, build_info=multi,
                      available={}).names == ["cuda-sm80-fp16"]


def test_sm90_family_is_validated_through_the_fp16_public_function():
    lib = FakeLib(native=("cuda-sm80-fp16", "cuda-sm89-fp8", "cuda-sm90-fp16"),
                  default="cuda-sm90-fp16")
    build = {**SM90_BUILD, "families": ["sm80", "sm89", "sm90"]}
    doc = run(lib, build=build, only=["native-runtime", "public-api"])
    assert [b["name"] for b in doc["expectation"]["native_backends"]] == [
        "cuda-sm80-fp16", "cuda-sm89-fp8", "cuda-sm90-fp16"]
    checks = by_name(doc)
    assert all(c["status"] == "pass" for c in checks.values()), checks


def test_sm90_wheel_with_the_sm90_fp8_family_runs_four_families_natively_on_sm90_only():
    families = ["sm80", "sm89", "sm90", "sm90_fp8"]
    build = {**SM90_BUILD, "families": families}
    e = expect(gpu_sm=90, families_table=FAMILIES, build_info=build, available={})
    assert e.execution == "native" and {b.via for b in e.backends} == {"sass"}
    assert [(b.name, b.family) for b in e.backends] == [
        ("cuda-sm80-fp16", "sm80"), ("cuda-sm89-fp8", "sm89"), ("cuda-sm90-fp16", "sm90"),
        ("cuda-sm90-fp8", "sm90_fp8")]
    for gpu in (80, 89):  # an [sm80, sm89, sm90] wheel on Ampere or Ada: no sm_90a family there
        names = expect(gpu_sm=gpu, families_table=FAMILIES, available={},
                       build_info={**build, "sm_targets": ["sm80", "sm89", "sm90"]}).names
        assert not {"cuda-sm90-fp16", "cuda-sm90-fp8"} & set(names), names


def test_sm90_fp8_family_is_validated_through_the_fp8_public_function_with_its_accumulation():
    native = ("cuda-sm80-fp16", "cuda-sm89-fp8", "cuda-sm90-fp16", "cuda-sm90-fp8")
    lib = FakeLib(native=native, default="cuda-sm90-fp16")
    doc = run(lib, build={**SM90_BUILD, "families": ["sm80", "sm89", "sm90", "sm90_fp8"]},
              only=["native-runtime", "public-api"])
    checks = by_name(doc)
    assert all(c["status"] == "pass" for c in checks.values()), checks
    accums = {accum for forced, accum in lib.specific_calls if forced == "cuda-sm90-fp8"}
    # the family's own first mode, one it accepts (not the sm89 family's "fp32+fp16")
    assert accums == {FAMILIES["families"]["sm90_fp8"]["pv_accum_dtype"][0]} == {"fp32+fp32"}
    assert {accum for forced, accum in lib.specific_calls if forced == "cuda-sm89-fp8"} == {"fp32+fp16"}


def test_source_checkout_expects_what_compiled_here():
    e = expect(gpu_sm=90, families_table=FAMILIES, build_info=None,
               available={"sm75": "not built", "sm80": None, "sm89": None})
    assert e.execution == "native" and e.names == ["cuda-sm80-fp16", "cuda-sm89-fp8"]


@pytest.mark.parametrize("text,sm,ptx", [("sm75+PTX", 75, True), ("sm90", 90, False),
                                         ("sm90a", 90, False), ("sm_86", 86, False)])
def test_parse_target(text, sm, ptx):
    t = parse_target(text)
    assert (t.sm, t.ptx) == (sm, ptx)


def test_parse_target_rejects_garbage():
    with pytest.raises(ValueError, match="unrecognised SM target 'compute75'"):
        parse_target("compute75")


# -- figures and bars ----------------------------------------------------------------------

def test_error_figures():
    ref = torch.randn(4, 64)
    same = errors(ref.half(), ref)
    assert same.cosine > 0.9999 and same.rel_l1 < 1e-3 and same.finite
    assert errors(-ref, ref).cosine == pytest.approx(-1.0, abs=1e-6)
    assert errors(2 * ref, ref).rel_l1 == pytest.approx(1.0, rel=1e-5)
    bad = ref.clone()
    bad[0, 0] = float("nan")
    e = errors(bad, ref)
    assert not e.finite and not e.within(FP16_PV_BAR)
    assert e.as_dict()["cosine"] is None  # JSON-safe
    assert Errors.from_dict(same.as_dict()) == same  # a stored figure reads back as it was
    back = Errors.from_dict(e.as_dict())
    assert not back.finite and not back.within(FP16_PV_BAR)
    with pytest.raises(ValueError, match="shape"):
        errors(ref[:2], ref)


def test_error_figures_are_exact_over_millions_of_elements():
    # ones against ones +- e, alternating (e and 1 +- e exact in fp32): cosine 1 / sqrt(1 + e^2),
    # relative L1 e.
    # fp32 sums gave a cosine above 1 here on the CPU (torch's fp32 norm was 3e-5 off), which
    # is more than the distance between a pass and a fail at the FP8 bar.
    n, e = 2 ** 21, 2.0 ** -6
    ref = torch.ones(n)
    out = 1 + e * (1 - 2 * (torch.arange(n) % 2)).float()
    got = errors(out, ref)
    assert got.cosine == pytest.approx(1 / math.sqrt(1 + e * e), abs=1e-9)
    assert got.rel_l1 == pytest.approx(e, rel=1e-12) and got.max_abs == e


def test_bars_follow_the_pv_precision():
    assert bar_for("cuda-sm89-fp8") is FP8_PV_BAR
    assert bar_for("cuda-sm80-fp16") is FP16_PV_BAR and bar_for("sdpa") is FP16_PV_BAR
    assert (FP16_PV_BAR.min_cosine, FP16_PV_BAR.max_rel_l1) == (0.9998, 0.02)
    assert (FP8_PV_BAR.min_cosine, FP8_PV_BAR.max_rel_l1) == (0.9993, 0.04)


# -- command line -----------------------------------------------------------------------------

def test_cli_refuses_without_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--no-performance"]) == 2
    assert "no CUDA GPU is visible" in capsys.readouterr().err


def test_cli_rejects_unknown_check_ids(capsys):
    assert cli.main(["--only", "fp17"]) == 2
    assert "unknown check id 'fp17'" in capsys.readouterr().err


def test_cli_refuses_a_json_path_that_is_a_folder_before_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("ran despite a bad --json"))
    with pytest.raises(SystemExit) as exc:
        cli.main(["--json", str(tmp_path)])
    assert exc.value.code == 2
    assert f"argument --json: {str(tmp_path)!r} is a folder; name the file to write" in \
        capsys.readouterr().err


def test_cli_lists_checks(capsys):
    assert cli.main(["--list"]) == 0
    assert "Two-GPU alternating-device testing" in capsys.readouterr().out


# -- benchmark --------------------------------------------------------------------------------

def test_standard_case_set_is_design_md_twenty():
    cases = benchmark.standard_cases()
    assert len(cases) == 20 and len({c.name for c in cases}) == 20
    assert benchmark.Case("fp16", 4, 32, 4096, 128, False).flops == 4 * 4 * 32 * 4096**2 * 128
    assert benchmark.Case("fp16", 1, 1, 10, 8, True).flops == 4 * 100 * 8 / 2
    assert benchmark.tops(benchmark.Case("fp16", 1, 1, 1000, 1000, False), 4.0) == \
        pytest.approx(4e9 / 4e-3 / 1e12)


def test_geomean():
    assert benchmark.geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert benchmark.geomean([4.0, None, 1.0]) == pytest.approx(2.0)
    assert benchmark.geomean([]) is None


def test_case_rejects_bad_values():
    with pytest.raises(ValueError, match="dtype must be one of"):
        benchmark.Case("fp8", 1, 1, 1, 64, False)
    with pytest.raises(ValueError, match="seq_len must be at least 1"):
        benchmark.Case("fp16", 1, 1, 0, 64, False)


def test_benchmark_run_with_a_fake_timer():
    lib = FakeLib(native=("cuda-sm80-fp16",))
    api = make_api(lib)
    cases = [benchmark.Case("fp16", 1, 2, 32, 64, c) for c in (False, True)]
    # sdpa takes 2 ms; sageattn (any backend) 1 ms
    timer = lambda fn: 2.0 if fn.__name__ == "sdpa" else 1.0  # noqa: E731
    perf = benchmark.run(cases, api=api, device=torch.device("cpu"), timer=timer,
                         others=["cuda-sm80-fp16", "cuda-sm89-fp8"])
    assert perf["geomean_speedup_vs_sdpa"] == pytest.approx(2.0)
    row = perf["cases"][0]
    assert row["backend"] == "cuda-sm89-fp8" and row["speedup_vs_sdpa"] == pytest.approx(2.0)
    assert row["accuracy"]["cosine"] > 0.9999
    assert row["backends"]["cuda-sm80-fp16"]["speedup_vs_sdpa"] == pytest.approx(2.0)
    assert row["backends"]["cuda-sm89-fp8"]["error"] == "forced cuda-sm89-fp8 but sdpa ran"
    assert perf["geomean_speedup_vs_sdpa_by_backend"]["cuda-sm89-fp8"] is None


def test_benchmark_rounds_interleave_and_keep_medians():
    lib = FakeLib(native=("cuda-sm80-fp16",))
    api = make_api(lib)
    case = benchmark.Case("fp16", 1, 2, 32, 64, False)
    order = []
    sdpa_ms = iter([9.0, 2.0, 2.2])  # a slow first round must not set the figure
    call_ms = iter([3.0, 1.0, 1.1, 4.0, 0.5, 0.6])  # sageattn, cuda-sm80-fp16, alternating

    def timer(fn):
        order.append(fn.__name__)
        return next(sdpa_ms) if fn.__name__ == "sdpa" else next(call_ms)

    perf = benchmark.run([case], api=api, device=torch.device("cpu"), timer=timer,
                         others=["cuda-sm80-fp16"], rounds=3)
    assert order == ["sdpa", "call", "call"] * 3  # interleaved rounds
    row = perf["cases"][0]
    assert row["sdpa_ms"] == 2.2 and row["sdpa_ms_rounds"] == [9.0, 2.0, 2.2]
    assert row["sageattn_ms"] == 1.1 and row["sageattn_ms_rounds"] == [3.0, 1.1, 0.5]
    sm80 = row["backends"]["cuda-sm80-fp16"]
    assert sm80["ms"] == 1.0 and sm80["ms_rounds"] == [1.0, 4.0, 0.6]
    assert sm80["speedup_vs_sdpa"] == pytest.approx(2.2 / 1.0)
    assert row["accuracy"]["cosine"] > 0.9999 and sm80["accuracy"]["cosine"] > 0.9999
    assert perf["rounds"] == 3 and "median of 3 interleaved rounds" in perf["method"]
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        benchmark.run([case], api=api, device=torch.device("cpu"), timer=timer, rounds=0)
    one = benchmark.run([case], api=api, device=torch.device("cpu"),
                        timer=lambda fn: 2.0 if fn.__name__ == "sdpa" else 1.0, rounds=1)
    assert "sdpa_ms_rounds" not in one["cases"][0] and "interleaved" not in one["method"]


class ModeLib(FakeLib):
    """FakeLib whose sageattn takes pv_accum_dtype, as the real one does, and records it."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.modes = []

    def sageattn(self, q, k, v, tensor_layout="HND", is_causal=False, pv_accum_dtype=None, **kw):
        self.modes.append((getattr(self.local, "forced", None), pv_accum_dtype))
        return super().sageattn(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, **kw)


def test_benchmark_times_an_accumulation_mode_as_a_kernel_of_its_own():
    lib = ModeLib(native=("cuda-sm80-fp16",))
    case = benchmark.Case("fp16", 1, 2, 32, 64, False)
    timer = lambda fn: 2.0 if fn.__name__ == "sdpa" else 1.0  # noqa: E731
    perf = benchmark.run([case], api=make_api(lib), device=torch.device("cpu"), timer=timer,
                         others=["cuda-sm80-fp16", "cuda-sm80-fp16@fp16"])
    row = perf["cases"][0]["backends"]
    assert row["cuda-sm80-fp16@fp16"]["ran"] == "cuda-sm80-fp16"
    assert row["cuda-sm80-fp16@fp16"]["speedup_vs_sdpa"] == pytest.approx(2.0)
    # the mode reaches sageattn with the backend forced; the plain name passes none
    assert ("cuda-sm80-fp16", "fp16") in lib.modes and ("cuda-sm80-fp16", None) in lib.modes
    assert set(perf["geomean_speedup_vs_sdpa_by_backend"]) == {"cuda-sm80-fp16", "cuda-sm80-fp16@fp16"}
    assert benchmark.split_timed_name("cuda-sm89-fp8@fp32+fp16") == ("cuda-sm89-fp8", "fp32+fp16")
    assert benchmark.split_timed_name("triton-fp16") == ("triton-fp16", None)
    args = benchmark.build_parser().parse_args(["--also", "cuda-sm80-fp16@fp16+fp32", "--backend", "cuda-sm80-fp16@fp16"])
    assert args.also == ["cuda-sm80-fp16@fp16+fp32"] and args.backend == "cuda-sm80-fp16@fp16"


@pytest.mark.parametrize("bad, why", [
    ("cuda-sm90-fp16@fp16", "cuda-sm90-fp16 has no pv_accum_dtype 'fp16'; its modes are: fp32"),
    ("cuda-sm81-fp16", "unknown backend 'cuda-sm81-fp16'; the backends are: cuda-sm90-fp16"),
])
def test_benchmark_refuses_a_bad_timed_name_in_words_before_anything_runs(bad, why, capsys):
    for flag in ("--also", "--backend"):
        with pytest.raises(SystemExit) as exc:
            benchmark.build_parser().parse_args([flag, bad])
        assert exc.value.code == 2 and why in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-2", "three", "1.5"])
def test_rounds_flag_refuses_what_is_not_a_positive_whole_number(bad, capsys):
    from sageattention import calibrate

    with pytest.raises(SystemExit) as exc:
        benchmark.build_parser().parse_args(["--rounds", bad])
    assert exc.value.code == 2
    assert f"--rounds: must be a whole number of at least 1, got '{bad}'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        calibrate.build_parser().parse_args(["--out", "x.json", "--rounds", bad])
    assert "--rounds: must be a whole number of at least 1" in capsys.readouterr().err
    assert benchmark.build_parser().parse_args(["--rounds", "3"]).rounds == 3


def test_benchmark_cli_grid_and_refusal(monkeypatch, capsys):
    args = benchmark.build_parser().parse_args(["--seq-len", "1024", "2048", "--causal", "yes",
                                                "--dtype", "bf16"])
    cases = benchmark.cases_from_args(args)
    assert [c.name for c in cases] == ["bf16 4x32x1024x128 causal", "bf16 4x32x2048x128 causal"]
    assert len(benchmark.cases_from_args(benchmark.build_parser().parse_args(
        ["--cases", "wide"]))) == 2 * 6 * 2 * 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert benchmark.main([]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_benchmark_render_makes_a_markdown_table_from_a_stored_report(tmp_path, capsys):
    report = REPO / "tests/unit/fixtures/reports" / \
        "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.report.json"
    out = tmp_path / "table.md"
    assert benchmark.main(["--render", str(report), "--markdown", str(out)]) == 0
    text = out.read_text()
    doc = json.loads(report.read_text())
    assert text.startswith("<!-- generated by `python -m sageattention.benchmark --render ")
    rows = [line for line in text.splitlines() if line.startswith("| fp16") or line.startswith("| bf16")]
    assert len(rows) == len(doc["performance"]["cases"])
    first = doc["performance"]["cases"][0]
    assert rows[0].startswith(f"| {first['name']} | {first['sdpa_tops']:.0f} |")
    # upstream 1.0.6 Triton's TOPS from design.md where the case has one (fp16 4x32x4096x128: 379)
    assert any(r.startswith("| fp16 4x32x4096x128 non-causal") and r.endswith("| 379 |") for r in rows)
    assert benchmark.main(["--render", str(tmp_path / "missing.json")]) == 2
    assert "cannot render" in capsys.readouterr().err


@pytest.mark.parametrize("change", [
    lambda d: d.update(environment="an H100"),
    lambda d: d["cases"][0].update(backends={"x": 5}),
    lambda d: d["environment"].update(date=None),
])
def test_benchmark_render_of_a_field_of_the_wrong_type_is_exit_2(tmp_path, capsys, change):
    # these were tracebacks (AttributeError, TypeError), exit 1
    stored = REPO / "benchmarks/results/h100-2026-12-07-bench-5b7cdab.json"
    doc = json.loads(stored.read_text())
    change(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert benchmark.main(["--render", str(bad)]) == 2
    assert f"cannot render {bad}" in capsys.readouterr().err


def test_benchmark_render_refuses_what_it_would_ignore_and_what_is_not_an_object(tmp_path, capsys):
    report = REPO / "tests/unit/fixtures/reports" / \
        "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.report.json"
    with pytest.raises(SystemExit) as done:
        benchmark.main(["--render", str(report), "--rounds", "5", "--json", str(tmp_path / "x.json")])
    assert done.value.code == 2
    assert "--rounds, --json would be ignored" in capsys.readouterr().err
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    assert benchmark.main(["--render", str(listed)]) == 2
    assert "must hold a JSON object" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        benchmark.main(["--render", str(report), "--markdown", str(tmp_path)])
    assert done.value.code == 2
    assert "is a folder; name the file to write" in capsys.readouterr().err
    out = tmp_path / "new" / "table.md"
    assert benchmark.main(["--render", str(report), "--markdown", str(out)]) == 0 and out.is_file()


def test_benchmark_times_cases_with_their_own_key_count(tmp_path):
    """A cross-attention case keeps kv_len in its row (a self-attention row has none), counts its
    own pairs, and never takes design.md's upstream figure of its query length."""
    lib = FakeLib()
    cross = benchmark.Case("fp16", 4, 32, 4096, 128, False, 40)
    square = benchmark.Case("fp16", 1, 2, 32, 64, False)
    perf = benchmark.run([cross, square], api=make_api(lib), device=torch.device("cpu"),
                         timer=lambda fn: 2.0 if fn.__name__ == "sdpa" else 1.0, accuracy=False)
    rows = perf["cases"]
    assert rows[0]["name"] == "fp16 4x32x4096/40x128 non-causal" and rows[0]["kv_len"] == 40
    assert rows[0]["flops"] == 4 * 4 * 32 * 4096 * 40 * 128
    assert "kv_len" not in rows[1]
    text = benchmark.markdown({"performance": perf, "environment": {}}, source="t.json")
    line = next(r for r in text.splitlines() if r.startswith("| fp16 4x32x4096/40x128"))
    assert line.endswith("| - |")   # 379 belongs to 4x32x4096x128 with 4096 keys, not this case


def test_suite_json_is_strict_and_written_atomically(tmp_path):
    doc = {"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 0.5}}
    path = tmp_path / "sub" / "suite.json"
    cli.write_json(str(path), doc)
    assert json.loads(path.read_text()) == {"a": None, "b": [1.0, None], "c": {"d": 0.5}}
    assert [p.name for p in path.parent.iterdir()] == ["suite.json"]


def test_suite_result_becomes_a_valid_report_and_note(tmp_path):
    """suite -> report -> note, the chain a real run takes (environment patched: no GPU here)."""
    from scripts.factory import notes, report

    lib = FakeLib()
    doc = run(lib, only=["native-runtime", "fp16", "bool-masks", "two-gpu"])
    doc["performance"] = benchmark.run(
        [benchmark.Case("fp16", 1, 2, 32, 64, False)], api=make_api(lib),
        device=torch.device("cpu"), timer=lambda fn: 2.0 if fn.__name__ == "sdpa" else 1.0)
    # the run a cp312 / torch 2.11 / cu130 wheel admits (a report only covers the wheel it ran)
    doc["environment"].update(gpu_name="Test GPU", compute_capability="9.0", gpu_sm="sm90",
                              os="Linux", python="3.12.3", torch="2.11.0+cu130",
                              cuda_runtime="13.0", driver="580.00 (test)")
    doc = json.loads(json.dumps(cli.jsonsafe(doc)))  # as the suite writes it
    wheel = tmp_path / "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"wheel")
    rep = report.build_report(doc, wheel=report.wheel_identity(wheel), command="test",
                              mode="system")
    path = report.write_report(rep, tmp_path)
    assert notes.main([str(path)]) == 0
    text = (tmp_path / (wheel.stem + ".md")).read_text()
    assert "- FP16: PASS (cuda-sm80-fp16, cuda-sm89-fp8)" in text
    assert "- Two-GPU alternating-device testing: SKIP: needs a CUDA device" in text
    assert "geometric-mean speed-up: 2.00x" in text
    assert (tmp_path / (wheel.stem + ".speedup.svg")).exists()


@pytest.mark.parametrize("profile", [profile_module.FULL, profile_module.QUICK])
def test_the_performance_section_times_the_profiles_rounds(monkeypatch, profile):
    seen = {}
    monkeypatch.setattr(benchmark, "run", lambda cases, **kw: seen.update(kw, cases=cases) or {"cases": []})
    ctx = SimpleNamespace(device=torch.device("cuda"), profile=profile, api=None,
                          expectation=SimpleNamespace(execution="native"), native_names=["cuda-sm90-fp16"])
    assert suite.performance_section(ctx)["quick"] is profile.perf_quick
    assert seen["rounds"] == profile.perf_rounds == 3
    assert seen["primary"] is None and "cuda-sm90-fp16" in seen["others"]
    assert {c.dtype for c in seen["cases"]} == ({"fp16"} if profile.perf_quick else {"fp16", "bf16"})


@pytest.mark.parametrize("extra", [["--json", "out.json"], ["--only", "fp16"], ["--skip", "fp16"],
                                   ["--quick"], ["--no-performance"]])
def test_cli_list_refuses_the_options_it_would_ignore(extra, tmp_path, monkeypatch, capsys):
    # --list printed the checks and exited 0; a --json beside it wrote nothing, silently
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--list", *extra])
    assert exc.value.code == 2
    assert f"--list only lists the checks; {extra[0]} would be ignored" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("argv", [["--only", "fp16", "--skip", "fp16"],
                                  ["--skip", *(c.slug for c in CHECKS)]])
def test_cli_refuses_only_and_skip_that_leave_no_check(argv, monkeypatch, capsys):
    # ran no check at all and reported "0 passed, 0 failed", exit 0: a pass of nothing
    monkeypatch.setattr(suite, "run_suite", lambda **kw: pytest.fail("ran with no check"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cli.main(argv) == 2
    assert "leave no check to run" in capsys.readouterr().err


def test_the_performance_section_shows_each_case_as_it_is_timed(monkeypatch):
    # the checks printed a line each, then the benchmark ran its cases for minutes in silence
    def fake_run(cases, **kw):
        for case in cases:
            kw["progress"](f"timed {case.name}")
        return {"cases": []}

    monkeypatch.setattr(benchmark, "run", fake_run)
    ctx = SimpleNamespace(device=torch.device("cuda"), profile=profile_module.QUICK, api=None,
                          expectation=SimpleNamespace(execution="native"), native_names=["cuda-sm90-fp16"])
    lines = []
    suite.performance_section(ctx, progress=lines.append)
    assert lines[0].startswith("performance: 10 benchmark cases against SDPA, 3 interleaved rounds")
    assert lines[1:] == [f"timed {c.name}" for c in benchmark.standard_cases(("fp16",))]
    seen = {}
    monkeypatch.setattr(suite, "performance_section", lambda ctx, **kw: seen.update(kw) or None)
    run_suite(api=make_api(FakeLib()), device=torch.device("cpu"), profile=TINY, checks=[],
              gpu_sm=90, argv=["x"], announce=print)
    assert seen == {"progress": print}


@pytest.mark.parametrize("doc, says", [
    # what `python -m sageattention.validation --no-performance --json` writes
    ({"suite_version": 1, "performance": None, "environment": {}}, "has no performance section"),
    ({"performance": {"cases": [1]}}, "cases[0] is not a benchmark case"),
    ({"cases": [{"sdpa_tops": 1.0}]}, "cases[0] is not a benchmark case"),
])
def test_benchmark_render_names_what_a_document_lacks_without_a_traceback(doc, says, tmp_path, capsys):
    # each was a traceback (AttributeError, KeyError) with exit status 1
    stored = tmp_path / "suite.json"
    stored.write_text(json.dumps(doc))
    assert benchmark.main(["--render", str(stored)]) == 2
    assert f"error: cannot render {stored}: " in (err := capsys.readouterr().err) and says in err


@pytest.mark.parametrize("flag", ["--warmup-ms", "--rep-ms"])
@pytest.mark.parametrize("bad", ["nan", "inf", "-5", "soon"])
def test_timing_lengths_must_be_finite_milliseconds(flag, bad, capsys):
    # nan and inf reached do_bench's int(warmup / estimate): a ValueError / OverflowError traceback
    # at the first timing; a negative length was taken as the shortest, silently
    from sageattention import calibrate

    for parser, argv in ((benchmark.build_parser(), []), (calibrate.build_parser(), ["--out", "x.json"])):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args([*argv, flag, bad])
        assert exc.value.code == 2
        assert f"argument {flag}: must be a number of milliseconds, 0 or more, got {bad!r}" in \
            capsys.readouterr().err
        assert getattr(parser.parse_args([*argv, flag, "0"]), flag[2:].replace("-", "_")) == 0.0


@pytest.mark.parametrize("module", ["benchmark", "calibrate", "validation"])
def test_every_option_of_the_commands_is_described_in_their_help(module):
    # benchmark --help listed --dtype, --rep-ms, --batch, --heads and --head-dim with no word
    from sageattention import calibrate

    parser = {"benchmark": benchmark.build_parser, "calibrate": calibrate.build_parser,
              "validation": cli.build_parser}[module]()
    bare = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert bare == []


def test_benchmark_refuses_a_case_set_beside_a_custom_grid(monkeypatch, capsys):
    # --cases wide --seq-len 1024 timed the grid (4x32x1024x128) and dropped --cases, silently
    monkeypatch.setattr(benchmark, "run", lambda *a, **k: pytest.fail("measured before refusing"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exc:
        benchmark.main(["--cases", "wide", "--seq-len", "1024", "--head-dim", "64"])
    assert exc.value.code == 2
    assert "--cases wide would be ignored: the custom grid (--seq-len, --head-dim) replaces it" in \
        capsys.readouterr().err


@pytest.mark.parametrize("parser, argv, dest, expected", [
    (cli.build_parser, ["--only", "fp16", "--only", "bf16"], "only", ["fp16", "bf16"]),
    (cli.build_parser, ["--skip", "fp16", "--skip", "bf16"], "skip", ["fp16", "bf16"]),
    (benchmark.build_parser, ["--seq-len", "1024", "--seq-len", "4096"], "seq_len", [1024, 4096]),
    (benchmark.build_parser, ["--head-dim", "64", "--head-dim", "128"], "head_dim", [64, 128]),
    (benchmark.build_parser, ["--dtype", "bf16"], "dtype", ["bf16"]),
    (benchmark.build_parser, ["--dtype", "bf16", "--dtype", "fp16"], "dtype", ["bf16", "fp16"]),
    (benchmark.build_parser, [], "dtype", ["fp16", "bf16"]),
    (benchmark.build_parser, ["--also", "triton-fp16", "--also", "triton-fp8"], "also",
     ["triton-fp16", "triton-fp8"]),
])
def test_a_list_option_given_twice_adds_to_itself(parser, argv, dest, expected):
    # argparse's store replaced the first list: `--only fp16 --only bf16` ran bf16 alone and
    # `--seq-len 1024 --seq-len 4096` timed 4096 alone, silently
    assert getattr(parser().parse_args(argv), dest) == expected


def test_factory_validate_passes_every_only_and_skip_to_the_suite():
    from scripts.factory import validate

    args = validate.build_parser().parse_args(["w.whl", "--only", "a", "--only", "b",
                                               "--skip", "c", "--skip", "d"])
    assert validate.suite_args(args, "s.json") == ["--json", "s.json", "--only", "a", "b",
                                                   "--skip", "c", "d"]


def test_the_newest_embedded_ptx_at_or_below_the_gpu_is_the_target_for_it():
    from sageattention.validation.expectation import newest_embedded_ptx

    assert newest_embedded_ptx([75], 120) == 75        # Blackwell: the sm75 wheel's compute_75
    assert newest_embedded_ptx([75, 90], 120) == 90
    assert newest_embedded_ptx([75, 90], 86) == 75
    assert newest_embedded_ptx([75], 70) is None        # PTX runs forward only
    assert newest_embedded_ptx([], 120) is None
