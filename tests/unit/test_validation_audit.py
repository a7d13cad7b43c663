"""Honesty and robustness of the validation suite, on the CPU against a small fake sageattention:
a NaN that slipped past a comparison, a backend read from the call before, a non-finite reference
that crashed the progress line, NaN outputs left out of the accuracy summary, tracebacks lost for
all but one backend, and --help that did not say what --quick changes."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sageattention.validation import CHECKS, checks_runtime, run_suite
from sageattention.validation import __main__ as cli
from sageattention.validation.api import Api
from sageattention.validation.expectation import expect
from sageattention.validation.profile import Profile
from sageattention.validation.runner import Check, Context, Recorder, select

REPO = Path(__file__).resolve().parents[2]
FAMILIES = json.loads((REPO / "sageattention/native/families.json").read_text())
BUILD = {"version": "2.2.0+sm90.torch2.11cu130", "sm_targets": ["sm90"],
         "families": ["sm80", "sm89"], "torch": "2.11.0", "cuda": "13.0"}
NATIVE = ("cuda-sm80-fp16", "cuda-sm89-fp8")
TINY = Profile(batch=1, heads=2, seq_len=32, head_dims=(64,), boundary_lengths=(1, 7),
               cross_lengths=(20, 45), long_seq_len=64, long_heads=2, stress_calls=6,
               stress_shape=(1, 2, 32, 64), two_gpu_calls=2, lane_shape=(1, 2, 32, 64),
               stream_calls=3, compile_backend="eager")


class Lib:
    """fp32 SDPA that names a backend as the real dispatcher does; ``hook(out, q, layout)`` may
    spoil an output, ``records`` decides whether a call records its backend."""

    def __init__(self, hook=None, records=lambda layout: True, default="cuda-sm89-fp8"):
        self.local = threading.local()
        self.default = default
        self.hook = hook or (lambda out, q, layout: out)
        self.records = records
        self.calls = 0
        self.__version__ = "2.2.0+fake"
        for name in ("sageattn_varlen", "sageattn_qk_int8_pv_fp16_triton",
                     "sageattn_qk_int8_pv_fp16_cuda", "sageattn_qk_int8_pv_fp8_cuda",
                     "sageattn_qk_int8_pv_fp8_cuda_sm90"):
            setattr(self, name, self.sageattn)

    @contextlib.contextmanager
    def force_backend(self, name):
        prev, self.local.forced = getattr(self.local, "forced", None), name
        try:
            yield
        finally:
            self.local.forced = prev

    def last_backend(self):
        return getattr(self.local, "last", None)

    def sageattn(self, q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None,
                 return_lse=False, attn_mask=None, **_):
        self.calls += 1
        forced = getattr(self.local, "forced", None)
        if self.records(tensor_layout):
            self.local.last = "sdpa" if attn_mask is not None else forced or self.default
        hnd = (lambda x: x) if tensor_layout == "HND" else (lambda x: x.transpose(1, 2))
        qh, kh, vh = (hnd(t).float() for t in (q, k, v))
        group = qh.shape[1] // kh.shape[1]
        kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
        mask = attn_mask.float() if attn_mask is not None and attn_mask.dtype != torch.bool \
            else attn_mask
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=is_causal,
                                             scale=sm_scale)
        out = self.hook(hnd(out).to(q.dtype), q, tensor_layout)
        if return_lse:
            return out, torch.logsumexp(qh @ kh.transpose(-1, -2) * qh.shape[-1] ** -0.5, -1)
        return out


def api_for(lib: Lib, **extra) -> Api:
    return Api(sageattn=lib.sageattn, force_backend=lib.force_backend,
               last_backend=lib.last_backend, module=lib,
               clear_last_backend=lambda: setattr(lib.local, "last", None),
               available_families=lambda: {"sm80": None, "sm89": None},
               build_info=lambda: BUILD, families_table=lambda: FAMILIES, **extra)


def suite(lib: Lib, checks, **kw) -> dict:
    if isinstance(checks[0], str):
        checks = select(CHECKS, checks, None)
    return run_suite(api=api_for(lib), device=torch.device("cpu"), profile=TINY, checks=checks,
                     performance=False, gpu_sm=90, argv=["x"], **kw)


def context(lib: Lib) -> Context:
    return Context(api=api_for(lib), device=torch.device("cpu"), profile=TINY,
                   expectation=expect(gpu_sm=90, families_table=FAMILIES, build_info=BUILD,
                                      available={}))


# -- NaN must not slip through ------------------------------------------------------------

class _Stream:
    def wait_stream(self, other):
        pass


@pytest.fixture
def cpu_streams(monkeypatch):
    """The CUDA stream calls two_streams makes, as no-ops: the check's own logic on the CPU."""
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


def test_two_streams_fails_a_nan_in_a_later_call(cpu_streams):
    # every output after the first was judged by max(float(...)) of the differences from the first:
    # Python's max() keeps 0.0 over a later NaN (nan > 0.0 is False), so the check passed
    def later_nan(out, q, layout):
        return out if lib.calls == 1 else torch.full_like(out, float("nan"))

    lib = Lib(hook=later_nan)
    rec = Recorder()
    checks_runtime.two_streams(context(lib), rec, "cuda-sm89-fp8")
    assert lib.calls == 2 * TINY.stream_calls
    assert any("stream 0" in f and "non-finite" in f for f in rec.failures), rec.failures
    assert any("stream 1" in f for f in rec.failures), rec.failures
    # and a correct library passes the same check
    ok = Recorder()
    checks_runtime.two_streams(context(Lib()), ok, "cuda-sm89-fp8")
    assert ok.failures == [] and len(ok.cases) == 2


# -- the backend that ran, not the one before ---------------------------------------------------

def test_a_call_that_records_no_backend_does_not_inherit_the_previous_calls():
    # NHD calls ran without recording a backend: last_backend() still named the HND call's forced
    # native backend, and the layouts check passed for a kernel it never saw run
    lib = Lib(records=lambda layout: layout == "HND")
    rec = suite(lib, ["layouts"])["checks"][0]
    assert rec["status"] == "fail"
    assert "forced cuda-sm80-fp16 but nothing ran" in rec["reason"]
    assert [c["backend"] for c in rec["cases"] if "NHD" in c["label"]] == [None] * 4


def test_public_api_kernel_functions_are_judged_by_their_own_call():
    # a kernel-specific function that recorded nothing read the default dispatch's backend, which
    # was its own family's: the check passed without knowing what the function ran
    lib = Lib(default="cuda-sm80-fp16")
    recording = lib.sageattn

    def silent(*args, **kwargs):
        keep = lib.records
        lib.records = lambda layout: False
        try:
            return recording(*args, **kwargs)
        finally:
            lib.records = keep

    lib.sageattn_qk_int8_pv_fp16_cuda = silent
    rec = suite(lib, ["public-api"])["checks"][0]
    assert rec["status"] == "fail"
    assert rec["failures"] == ["sageattn_qk_int8_pv_fp16_cuda() ran None, expected cuda-sm80-fp16"]
    assert suite(Lib(default="cuda-sm80-fp16"), ["public-api"])["checks"][0]["status"] == "pass"


def test_the_package_api_forgets_the_last_backend_before_a_call():
    from sageattention import dispatch

    api = Api.from_package()
    dispatch.record_backend("cuda-sm80-fp16")
    try:
        api.clear_last_backend()
        assert dispatch.last_backend() is None
    finally:
        dispatch.record_backend(None)


# -- a non-finite reference, NaN in the accuracy summary ------------------------------------------

def test_a_non_finite_reference_fails_its_case_and_the_progress_line_still_prints():
    # errors() called such a comparison finite with cosine None; the CLI's progress line then
    # formatted None with :.6f and the TypeError ended the whole run (no report written)
    def body(ctx, rec, backend):
        ref = torch.randn(1, 2, 8, 16)
        ref[0, 0, 0, 0] = float("nan")
        rec.compare("nan reference", ref.nan_to_num(), ref, ran="cuda-sm80-fp16")

    lines = []
    doc = suite(Lib(), [Check("Broken reference", "broken-ref", body, native=False)],
                progress=lambda r: lines.append(cli._line(r)))
    rec = doc["checks"][0]
    assert rec["status"] == "fail" and "non-finite fp32 reference" in rec["reason"]
    assert rec["errors"]["finite"] is False and rec["cases"][0]["ok"] is False
    assert len(lines) == 1 and lines[0].startswith("FAIL") and "NaN/Inf" in lines[0]


def test_the_accuracy_summary_counts_the_nan_outputs_it_has_no_figures_for():
    # a backend's NaN outputs were left out of its summary: the notes said "cosine at least
    # 0.99999 over 2 comparisons" and nothing of the two that were NaN
    lib = Lib(hook=lambda out, q, layout: torch.full_like(out, float("nan"))
              if q.dtype == torch.bfloat16 else out)
    doc = suite(lib, ["fp16", "bf16"])
    acc = doc["accuracy"]["cuda-sm80-fp16"]
    assert acc["cases"] == 2 and acc["non_finite"] == 2
    assert doc["accuracy"]["cuda-sm89-fp8"]["non_finite"] == 2
    assert by_status(doc) == {"FP16": "pass", "BF16": "fail"}
    clean = suite(Lib(), ["fp16"])["accuracy"]["cuda-sm80-fp16"]
    assert clean["non_finite"] == 0 and clean["cases"] == 2


def by_status(doc):
    return {c["name"]: c["status"] for c in doc["checks"]}


def test_bars_follow_the_backend_that_ran():
    # cosine about 0.9995: inside the FP8 PV bar (0.9993), outside the FP16 PV bar (0.9998)
    def noisy(out, q, layout):
        gen = torch.Generator().manual_seed(5)
        return (out.float() + 0.032 * out.float().std() * torch.randn(out.shape, generator=gen)
                ).to(out.dtype)

    rec = suite(Lib(hook=noisy), ["fp16"])["checks"][0]
    by_backend = {}
    for c in rec["cases"]:
        by_backend.setdefault(c["backend"], set()).add(c["ok"])
        assert 0.9993 < c["cosine"] < 0.9998, c
    assert by_backend == {"cuda-sm80-fp16": {False}, "cuda-sm89-fp8": {True}}


# -- a check that raises ------------------------------------------------------------------------

def test_every_backend_that_raised_keeps_its_traceback_and_the_run_goes_on():
    def boom(out, q, layout):
        raise RuntimeError(f"kernel exploded ({getattr(lib.local, 'forced', None)})")

    lib = Lib(hook=boom)
    doc = suite(lib, ["fp16", "public-api"])
    rec = next(c for c in doc["checks"] if c["id"] == "fp16")
    assert rec["status"] == "fail"
    assert rec["failures"][:2] == ["[cuda-sm80-fp16] RuntimeError: kernel exploded (cuda-sm80-fp16)",
                                   "[cuda-sm89-fp8] RuntimeError: kernel exploded (cuda-sm89-fp8)"]
    # the traceback of each backend, not only the last one's
    assert rec["traceback"].count("Traceback") == 2
    assert "(cuda-sm80-fp16)" in rec["traceback"] and "(cuda-sm89-fp8)" in rec["traceback"]
    assert [c["name"] for c in doc["checks"]] == ["Public SageAttention API", "FP16"]
    assert doc["summary"]["fail"] == 2


def test_a_skipped_check_is_counted_as_skipped_not_passed():
    from sageattention.validation.runner import Skip

    def skips(ctx, rec, backend):
        raise Skip("not on this machine")

    doc = suite(Lib(), [Check("Skipper", "skipper", skips), *select(CHECKS, ["fp16"], None)])
    assert by_status(doc) == {"Skipper": "skip", "FP16": "pass"}
    assert {k: doc["summary"][k] for k in ("pass", "fail", "skip")} == {"pass": 1, "fail": 0, "skip": 1}
    rec = doc["checks"][0]
    assert rec["reason"] == "not on this machine" and rec["backend"] is None
    assert cli._line(rec).startswith("SKIP")


# -- --help ---------------------------------------------------------------------------------------

def test_help_says_what_quick_changes_the_bars_and_the_exit_status(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "aot_eager instead of Inductor" in text           # --quick's torch.compile
    assert "cosine >= 0.9998 and relative L1 <= 0.02" in text
    assert "cosine >= 0.9993 and relative L1 <= 0.04" in text
    assert "Exit status: 0 no check failed" in text and "1 a check failed" in text
    for check in CHECKS:
        assert check.slug in text
    parser = cli.build_parser()
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in text


# -- refusals -------------------------------------------------------------------------------------

def test_unreadable_sm_targets_are_a_refusal_not_a_traceback(monkeypatch, capsys):
    # parse_target's ValueError escaped run_suite: a traceback and exit status 1 ("a check failed")
    from sageattention.validation import suite as suite_module

    bad = {**BUILD, "sm_targets": ["compute90"]}
    lib = Lib()
    api = api_for(lib)
    api.build_info = lambda: bad
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(suite_module, "capture", lambda device, argv=None: {"torch": "x"})
    monkeypatch.setattr(Api, "from_package", classmethod(lambda cls: api))
    assert cli.main(["--no-performance", "--only", "fp16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refused: the build info's sm_targets cannot be read")
    assert "unrecognised SM target 'compute90'" in err and lib.calls == 0
