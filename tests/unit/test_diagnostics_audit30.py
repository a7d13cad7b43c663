"""`python -m sageattention` and `python -m sageattention.validation` as a user meets them when
something is wrong (CPU only): a SAGEATTENTION_BACKEND that forces a backend which cannot run
here, a source checkout that shadows an installed wheel, and a forcing or bad SAGEATTENTION_*
variable under the validation suite."""

from __future__ import annotations

import json
import os

import pytest

from sageattention import __main__ as diagnostics
from sageattention import build_info, guard
from sageattention.validation import __main__ as cli
from sageattention.validation import suite as suite_module
from sageattention.validation.api import _families_json
from sageattention.validation.expectation import NoNativeCode, expect

INFO = {
    "schema_version": 1, "version": "2.2.0+sm80.sm90.torch2.11cu130",
    "local_label": "sm80.sm90.torch2.11cu130", "sm_targets": ["sm80", "sm90"],
    "families": ["sm80", "sm90"], "ptx": [], "torch": "2.11.0+cu130", "cuda": "13.0",
    "python_tag": "cp312", "platform": "linux_x86_64",
    "cell_id": "linux-cp312-torch2.11-cu130-sm80.sm90",
}
H100 = {"index": 0, "name": "NVIDIA H100", "capability": "9.0"}
A100 = {"index": 1, "name": "NVIDIA A100", "capability": "8.0"}


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setattr(guard, "_platform_tag", lambda info: "manylinux_2_34_x86_64")
    for var in ("SAGEATTENTION_BACKEND", "SAGEATTENTION_CALIBRATION"):
        monkeypatch.delenv(var, raising=False)


def _diagnose(monkeypatch, capsys, *, info, gpus, native=None, shadowed=None):
    """main(["--json"]) on a faked machine: (exit status, the JSON document)."""
    env = {"python": "3.12.3", "python_tag": "cp312", "platform": "Linux",
           "torch": "2.11.0+cu130", "torch_cuda": "13.0", "gpus": list(gpus)}
    monkeypatch.setattr(build_info, "load", lambda: info)
    monkeypatch.setattr(diagnostics, "_environment", lambda: dict(env))
    monkeypatch.setattr(diagnostics, "_native_status", lambda info, env: native)
    if shadowed is not None:
        monkeypatch.setattr(diagnostics, "shadowed_installs", lambda: shadowed, raising=False)
    rc = diagnostics.main(["--json"])
    return rc, json.loads(capsys.readouterr().out)


# -- python -m sageattention: a forced backend that cannot run here ----------------------------

@pytest.mark.parametrize("forced", ["cuda-sm80-fp16", "triton-fp16"])
def test_a_forced_gpu_backend_without_a_gpu_is_not_ok(monkeypatch, capsys, forced):
    # It said "OK ... sageattn runs PyTorch SDPA on CPU tensors" (exit 0), while every sageattn
    # call raises BackendUnavailableError: forcing never falls back.
    monkeypatch.setenv("SAGEATTENTION_BACKEND", forced)
    rc, doc = _diagnose(monkeypatch, capsys, info=None, gpus=[], shadowed=[])
    assert rc == 1 and doc["ok"] is False
    bad = [line for line in doc["verdict"] if line.startswith("MISCONFIGURED: ")]
    assert len(bad) == 1 and f"SAGEATTENTION_BACKEND={forced!r}" in bad[0]
    assert "needs a CUDA GPU, and none is visible" in bad[0]
    assert "BackendUnavailableError" in bad[0]


def test_a_forced_backend_with_a_wheel_and_no_gpu_does_not_claim_sdpa_runs(monkeypatch, capsys):
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "cuda-sm80-fp16")
    rc, doc = _diagnose(monkeypatch, capsys, info=INFO, gpus=[],
                        native={"sm80": None, "sm90": None})
    assert rc == 1
    assert not any("sageattn runs PyTorch SDPA" in line for line in doc["verdict"])
    assert any("sageattn raises on CPU tensors ('cuda-sm80-fp16' is forced)" in line
               for line in doc["verdict"])


def test_forcing_sdpa_or_nothing_stays_ok(monkeypatch, capsys):
    rc, doc = _diagnose(monkeypatch, capsys, info=None, gpus=[], shadowed=[])
    assert rc == 0 and doc["ok"] is True
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "sdpa")
    rc, doc = _diagnose(monkeypatch, capsys, info=INFO, gpus=[H100],
                        native={"sm80": None, "sm90": None})
    assert rc == 0 and doc["ok"] is True, doc["verdict"]
    assert any("no CUDA GPU" not in line and "'sdpa' for every call" in line
               for line in doc["verdict"])


def test_a_forced_backend_the_gpu_is_not_served_by_is_not_ok(monkeypatch, capsys):
    # cuda-sm90-fp16 is sm90-only: on the A100 of a two-GPU machine every call raises
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "cuda-sm90-fp16")
    rc, doc = _diagnose(monkeypatch, capsys, info=INFO, gpus=[H100, A100],
                        native={"sm80": None, "sm90": None})
    assert rc == 1
    bad = [line for line in doc["verdict"] if line.startswith("MISCONFIGURED: ")]
    assert len(bad) == 1
    assert "does not run on cuda:1 NVIDIA A100 (sm80)" in bad[0] and "cuda:0" not in bad[0]


def test_a_forced_backend_whose_family_is_absent_or_broken_is_not_ok(monkeypatch, capsys):
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "cuda-sm89-fp8")  # the wheel has no sm89 family
    rc, doc = _diagnose(monkeypatch, capsys, info=INFO, gpus=[H100],
                        native={"sm80": None, "sm90": None})
    assert rc == 1
    assert any("needs the sm89 kernel family, which this build does not carry (families: sm80, "
               "sm90)" in line for line in doc["verdict"])
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "cuda-sm90-fp16")
    rc, doc = _diagnose(monkeypatch, capsys, info=INFO, gpus=[H100],
                        native={"sm80": None, "sm90": "undefined symbol: _ZN3c10"})
    bad = [line for line in doc["verdict"] if line.startswith("MISCONFIGURED: ")]
    assert rc == 1 and len(bad) == 1
    assert "needs the sm90 kernel family, which does not load (undefined symbol" in bad[0]


# -- python -m sageattention: a source checkout shadowing an installed wheel --------------------

def _fake_install(root, version="9.9.9+sm90.torch2.11cu130"):
    (root / "sageattention").mkdir(parents=True)
    (root / "sageattention" / "__init__.py").write_text("")
    info = root / f"sageattention-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sageattention\nVersion: {version}\n")


def test_a_checkout_that_shadows_an_installed_wheel_says_so(monkeypatch, capsys, tmp_path):
    # It said only "source checkout ... nothing to check" and OK: the installed wheel the user
    # meant to diagnose was never looked at, and nothing said so.
    _fake_install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, doc = _diagnose(monkeypatch, capsys, info=None, gpus=[])
    notes = [line for line in doc["verdict"] if "shadows the installed" in line]
    assert len(notes) == 1, doc["verdict"]
    assert f"sageattention 9.9.9+sm90.torch2.11cu130 at {tmp_path / 'sageattention'}" in notes[0]
    assert "from another directory" in notes[0]


def test_the_imported_package_itself_is_not_reported_as_shadowed():
    here = diagnostics.os.path.dirname(diagnostics.__file__)
    assert not any(entry.endswith(f" at {here}") for entry in diagnostics.shadowed_installs())


# -- the validation suite -----------------------------------------------------------------------

def test_a_source_checkout_without_kernels_is_not_told_to_install_the_wheel():
    # It said "SM targets ['sm90'] ... install the wheel built for sm90", inventing the targets
    # and blaming the install, where a checkout (perhaps shadowing that very wheel) was imported.
    available = {f: "sageattention._kernels_x is not in this installation"
                 for f in _families_json()["families"]}
    with pytest.raises(NoNativeCode) as refused:
        expect(gpu_sm=90, families_table=_families_json(), build_info=None, available=available)
    text = str(refused.value)
    assert "no build info (a source checkout, not an installed wheel)" in text
    assert "run from outside the checkout" in text
    assert "SM targets" not in text


@pytest.fixture
def fake_run(monkeypatch):
    calls = []

    def run_suite(**kwargs):
        calls.append(kwargs)
        return {"execution": "native", "summary": {"pass": 1, "fail": 0, "skip": 0,
                                                   "all_passed": True}, "performance": None}
    monkeypatch.setattr(suite_module, "run_suite", run_suite)
    return calls


@pytest.mark.parametrize("var, value, said", [
    ("SAGEATTENTION_BACKEND", "sdpa", "refused: SAGEATTENTION_BACKEND=sdpa forces every sageattn call"),
    ("SAGEATTENTION_BACKEND", "cuda-sm90-fp16", "refused: SAGEATTENTION_BACKEND=cuda-sm90-fp16"),
    ("SAGEATTENTION_BACKEND", "bogus", "refused: SAGEATTENTION_BACKEND='bogus' is not a backend"),
    ("SAGEATTENTION_CALIBRATION", "false", "refused: SAGEATTENTION_CALIBRATION='false' is not "
                                           "accepted"),
])
def test_the_suite_refuses_a_forcing_or_bad_variable(monkeypatch, capsys, fake_run, var, value,
                                                     said):
    # It ran: forced SDPA failed the default-dispatch checks blaming the dispatcher, a native
    # backend failed the mask checks, and the performance headline timed the forced backend.
    monkeypatch.setenv(var, value)
    assert cli.main(["--no-performance"]) == 2
    assert capsys.readouterr().err.startswith(said)
    assert fake_run == []


def test_the_suite_runs_with_the_variables_unset_or_calibration_off(monkeypatch, fake_run):
    assert cli.main(["--no-performance"]) == 0
    monkeypatch.setenv("SAGEATTENTION_CALIBRATION", "off")
    assert cli.main(["--no-performance"]) == 0
    assert len(fake_run) == 2


def test_without_an_importable_torch_the_diagnostics_say_so_instead_of_a_traceback(tmp_path):
    # the package's import (its guard, then core) raised ImportError before __main__ could run
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text('raise ImportError("torch broken on purpose")\n')
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"}
    diag = subprocess.run([sys.executable, "-m", "sageattention"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert diag.returncode == 1, diag.stderr
    assert "Traceback" not in diag.stderr
    assert "NOT USABLE HERE" in diag.stdout and "torch is not importable" in diag.stdout
    plain = subprocess.run([sys.executable, "-c", "import sageattention"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=120)
    assert plain.returncode == 1 and "ImportError: torch broken on purpose" in plain.stderr
