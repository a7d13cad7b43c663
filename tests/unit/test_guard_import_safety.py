"""Import-time safety as a user meets it: a wheel's build info against the running torch, broken
build info, extensions that are missing or do not load, GPUs no family serves, and what
`python -m sageattention` says in each case (no GPU needed)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import sageattention.native as native
from sageattention import __main__ as diagnostics
from sageattention import build_info, guard

INFO = {
    "schema_version": 1, "version": "2.2.0+sm80.sm90.torch2.11cu130",
    "local_label": "sm80.sm90.torch2.11cu130", "sm_targets": ["sm80", "sm90"],
    "families": ["sm80", "sm90"], "ptx": [], "torch": "2.11.0+cu130", "cuda": "13.0",
    "python_tag": "cp312", "platform": "linux_x86_64", "cell_id": "linux-cp312-torch2.11-cu130-sm80.sm90",
}


@pytest.fixture(autouse=True)
def _platform(monkeypatch):
    monkeypatch.setattr(guard, "_platform_tag", lambda info: "manylinux_2_34_x86_64")


# --- the running torch against the wheel's ------------------------------------------------------

@pytest.mark.parametrize("torch_version, cuda, verdict", [
    ("2.11.0+cu130", "13.0", None),
    ("2.11.1+cu130", "13.0", None),                   # a patch release keeps the ABI
    ("2.11.0+cu130", "13.2", None),                   # CUDA minor: same major
    ("2.11.0a0+git1234", "13.0", None),               # source build: a note, not a mismatch
    ("2.12.0+cu130", "13.0", "built for torch 2.11 (installed: 2.12.0+cu130)"),
    ("2.12.0.dev20260301+cu130", "13.0", "built for torch 2.11 (installed: 2.12.0.dev20260301"),
    ("2.11.0+cu128", "12.8", "built for CUDA 13.0 (installed torch uses CUDA 12.8)"),
    ("2.11.0+cpu", None, "is a CPU-only build"),
])
def test_each_running_torch_gets_a_verdict(torch_version, cuda, verdict):
    problem = guard.import_problem(INFO, torch_version, cuda)
    if verdict is None:
        assert problem is None
    else:
        assert verdict in problem


@pytest.mark.parametrize("torch_version, cuda", [("unknown", "13.0"), ("2", "13.0"),
                                                 ("2.11.0", ""), ("2.11.0", "thirteen")])
def test_a_torch_version_the_guard_cannot_read_is_a_clear_mismatch(torch_version, cuda):
    # It was a ValueError ('unknown') or IndexError ('2') traceback out of `import sageattention`.
    problem = guard.import_problem(INFO, torch_version, cuda)
    assert f"the installed torch reports version {torch_version!r}" in problem
    assert "Install torch==2.11.* built for CUDA 13.0" in problem


def test_a_pre_release_torch_of_the_same_minor_gets_a_note():
    note = guard.import_caveat(INFO, "2.11.0a0+git1234")
    assert note.startswith("torch 2.11.0a0+git1234 is a pre-release or source build of torch 2.11")
    assert "may fail to load (undefined symbol)" in note and "torch==2.11.0" in note
    assert "SAGEATTENTION_SM_TARGETS='sm80;sm90'" in note
    assert guard.import_caveat(INFO, "2.11.0.dev20260101+cu130") is not None
    assert guard.import_caveat(INFO, "2.11.1+cu130") is None
    assert guard.import_caveat(None, "2.11.0a0+git1234") is None


# --- build info that is not build info --------------------------------------------------------

def _load(tmp_path, monkeypatch, info):
    text = info if isinstance(info, str) else json.dumps(info)
    (tmp_path / build_info.BUILD_INFO_FILE).write_text(text)
    monkeypatch.setattr(build_info, "resources", SimpleNamespace(files=lambda package: tmp_path))
    build_info.load.cache_clear()
    try:
        return build_info.load()
    finally:
        build_info.load.cache_clear()


def _without(key):
    return {k: v for k, v in INFO.items() if k != key}


@pytest.mark.parametrize("info, problem", [
    (_without("torch"), "has no 'torch' field (expected the torch version it was built against"),
    (_without("cuda"), "has no 'cuda' field"),
    (_without("sm_targets"), "has no 'sm_targets' field (expected a non-empty list of SM targets"),
    (_without("local_label"), "has no 'local_label' field"),
    (dict(INFO, torch=None), "has 'torch' = None"),
    (dict(INFO, torch="latest"), "has 'torch' = 'latest'"),
    (dict(INFO, sm_targets="sm80"), "has 'sm_targets' = 'sm80'"),
    (dict(INFO, sm_targets=["sm8x"]), "has 'sm_targets' = ['sm8x']"),
    (dict(INFO, sm_targets=[]), "has 'sm_targets' = []"),
    (dict(INFO, local_label="garbage"), "has 'local_label' = 'garbage'"),
    (dict(INFO, ptx="compute_75"), "has 'ptx' = 'compute_75'"),
    (dict(INFO, families=[80]), "has 'families' = [80]"),
], ids=["no-torch", "no-cuda", "no-targets", "no-label", "torch-null", "torch-word",
        "targets-string", "target-bad", "targets-empty", "label-bad", "ptx-string", "families-int"])
def test_build_info_with_a_missing_or_malformed_field_is_a_damaged_installation(
        tmp_path, monkeypatch, info, problem):
    # Each was a KeyError or ValueError traceback at `import sageattention` (or only once a
    # mismatch was found, for the label).
    with pytest.raises(build_info.DamagedInstallError) as exc:
        _load(tmp_path, monkeypatch, info)
    assert str(exc.value).startswith(f"{tmp_path / build_info.BUILD_INFO_FILE} {problem}")
    assert "Reinstall the wheel" in str(exc.value)


def test_build_info_with_extra_fields_or_without_optional_ones_loads(tmp_path, monkeypatch):
    assert _load(tmp_path, monkeypatch, dict(INFO, added_later={"x": 1}))["added_later"] == {"x": 1}
    legacy = {k: v for k, v in INFO.items() if k not in ("families", "ptx")}
    assert _load(tmp_path, monkeypatch, legacy) == legacy
    hopper = dict(INFO, sm_targets=["sm80", "sm90a"])   # the target rule's 'a' suffix
    assert _load(tmp_path, monkeypatch, hopper) == hopper
    assert guard.served_by(hopper, (9, 0)) == "sm90 SASS"  # was int('90a'): ValueError


# --- GPUs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("capability", [(7, 0), (6, 1), (5, 0)])
def test_a_gpu_older_than_every_family_is_not_pointed_at_a_wheel_that_cannot_exist(capability):
    sm = capability[0] * 10 + capability[1]
    msg = guard.device_problem(INFO, capability, "Tesla V100 (cuda:0)")
    assert f"cannot run on Tesla V100 (cuda:0) (sm{sm})" in msg
    assert f"No sageattention kernel family runs on sm{sm}: the oldest GPU they serve is sm75" in msg
    # it said "Install sageattention-2.2.0+sm70.torch2.11cu130-... instead" and
    # SAGEATTENTION_SM_TARGETS='sm70', neither of which exists or builds
    assert f"+sm{sm}." not in msg and f"SAGEATTENTION_SM_TARGETS='sm{sm}'" not in msg


# --- extensions that are missing or do not load -----------------------------------------------

@pytest.fixture
def loader(monkeypatch):
    """The native loader with fresh state, this module's build info and a chosen failure per
    extension: ``loader(sm80=OSError(...))``; an extension not named is not installed."""
    monkeypatch.setattr(native, "_status", {})
    monkeypatch.setattr(native, "_modules", {})
    for family in native.FAMILIES:
        wrapper = importlib.import_module(f"sageattention.native.{family}")
        monkeypatch.setattr(wrapper.load, "loaded", False)
    monkeypatch.setattr(build_info, "load", lambda: INFO)
    monkeypatch.setattr(guard, "_torch_facts", lambda: ("2.11.0a0+git1234", "13.0"))

    def configure(**errors):
        def import_module(name, package=None):
            if name.startswith("sageattention._kernels_"):
                family = name.removeprefix("sageattention._kernels_")
                if family in errors:
                    raise errors[family]
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return importlib.import_module(name, package)
        monkeypatch.setattr(native, "importlib", SimpleNamespace(import_module=import_module))
    return configure


UNDEFINED = "_kernels_sm80.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"


@pytest.mark.parametrize("error", [OSError(UNDEFINED), ImportError(UNDEFINED)],
                         ids=["OSError", "ImportError"])
def test_an_extension_that_does_not_load_names_both_torches_and_what_to_install(loader, error):
    # An OSError went out of available_families, and the dispatcher then counted every family
    # unusable; the ImportError's reason said "not in this installation" for a file that is there.
    loader(sm80=error)
    reason = native.available_families()["sm80"]
    assert reason.startswith(f"sageattention._kernels_sm80 could not be loaded "
                             f"({type(error).__name__}: {UNDEFINED})")
    assert "was built against torch 2.11.0+cu130 (CUDA 13.0), the running torch is " \
        "2.11.0a0+git1234 (CUDA 13.0)" in reason
    assert "install torch==2.11.0 for CUDA 13.0" in reason
    assert "SAGEATTENTION_SM_TARGETS='sm80;sm90'" in reason
    with pytest.raises(ImportError, match="undefined symbol"):
        native.family_module("sm80")


def test_a_load_failure_under_another_torch_names_the_wheel_to_install():
    msg = guard.load_failure(INFO, "2.12.0+cu130", "13.0", "sageattention._kernels_sm80",
                             ImportError("undefined symbol: x"))
    assert "built against torch 2.11.0+cu130 (CUDA 13.0), the running torch is 2.12.0+cu130" in msg
    assert "sageattention-2.2.0+sm80.sm90.torch2.12cu130-" in msg
    same = guard.load_failure(INFO, "2.11.0+cu130", "13.0", "sageattention._kernels_sm80",
                              OSError("libcudart.so.13: cannot open shared object file"))
    assert "That is the same torch, so a library the extension needs is missing" in same


def test_a_missing_extension_says_whether_the_wheel_has_its_family(loader):
    loader()
    status = native.available_families()
    assert status["sm89"] == ("sageattention._kernels_sm89 is not in this installation: "
                              "sageattention 2.2.0+sm80.sm90.torch2.11cu130 was built without "
                              "sm89-family targets (its families: sm80, sm90)")
    assert status["sm90"].startswith("sageattention._kernels_sm90 is missing from this "
                                     "installation although sageattention "
                                     "2.2.0+sm80.sm90.torch2.11cu130 lists the sm90 family")
    assert "Reinstall the wheel" in status["sm90"]


def test_an_extension_raising_anything_else_is_one_unusable_family(loader):
    loader(sm80=RuntimeError("Only a single TORCH_LIBRARY can be used to register the namespace"))
    status = native.available_families()
    assert "could not be loaded (RuntimeError: Only a single TORCH_LIBRARY" in status["sm80"]
    assert "built without sm89-family targets" in status["sm89"]  # the others are still told apart


# --- python -m sageattention ------------------------------------------------------------------

ENV = {"python": "3.12.3", "python_tag": "cp312", "platform": "Linux", "torch": "2.11.0a0+git1234",
       "torch_cuda": "13.0", "gpus": []}


def test_diagnostics_report_each_family_of_the_wheel_and_the_pre_release_note():
    env = dict(ENV, native={"sm80": "sageattention._kernels_sm80 could not be loaded (...)",
                            "sm90": None})
    ok, lines = diagnostics.verdict(INFO, env)
    assert not ok
    assert lines[0] == "torch 2.11.0a0+git1234 (CUDA 13.0) matches this build"
    assert lines[1].startswith("note: torch 2.11.0a0+git1234 is a pre-release or source build")
    assert "BROKEN: native family sm80 does not load: sageattention._kernels_sm80 could not be " \
        "loaded (...)" in lines
    assert "native family sm90: loads" in lines
    ok, lines = diagnostics.verdict(INFO, dict(env, native={"sm80": None, "sm90": None}))
    assert ok and lines[-1].startswith("no CUDA GPU visible: GPU check skipped; sageattn runs "
                                       "PyTorch SDPA")


def test_diagnostics_load_only_the_wheels_families_and_only_under_a_matching_torch(loader):
    loader(sm80=OSError(UNDEFINED))
    status = diagnostics._native_status(INFO, ENV)
    assert set(status) == {"sm80", "sm90"} and "undefined symbol" in status["sm80"]
    # a mismatched torch: loading its extensions could do worse than raise, so none is loaded
    assert diagnostics._native_status(INFO, dict(ENV, torch="2.12.0+cu130")) is None
    assert diagnostics._native_status(None, ENV) is None


def test_diagnostics_with_an_unreadable_torch_version_or_gpu_query_do_not_crash(monkeypatch):
    ok, lines = diagnostics.verdict(INFO, dict(ENV, torch="unknown"))
    assert not ok and lines[0].startswith("MISMATCH: ") and "reports version 'unknown'" in lines[0]
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def too_old(i):
        raise RuntimeError("The NVIDIA driver on your system is too old")
    monkeypatch.setattr(torch.cuda, "get_device_capability", too_old)
    env = diagnostics._environment()
    assert env["gpu_error"] == "RuntimeError: The NVIDIA driver on your system is too old"
    ok, lines = diagnostics.verdict(None, env)
    assert ok


def test_an_installed_wheel_whose_extension_does_not_load_imports_and_diagnoses(tmp_path):
    """End to end, in a fresh interpreter: a wheel's package with build info matching the running
    torch and an sm80 extension that raises OSError when imported."""
    import torch

    if torch.version.cuda is None:
        pytest.skip("the wheel's build info needs a CUDA torch here")
    package = tmp_path / "sageattention"
    shutil.copytree(Path(build_info.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__", build_info.BUILD_INFO_FILE,
                                                  "_kernels_*"))
    version, cuda = str(torch.__version__), torch.version.cuda
    label = build_info.LocalLabel.create([80], version, cuda)
    info = dict(INFO, version=f"2.2.0+{label}", local_label=str(label), sm_targets=["sm80"],
                families=["sm80"], torch=version, cuda=cuda)
    (package / build_info.BUILD_INFO_FILE).write_text(json.dumps(info))
    (package / "_kernels_sm80.py").write_text(f"raise OSError({UNDEFINED!r})\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("SAGEATTENTION_BACKEND", None)
    env.pop("SAGEATTENTION_CALIBRATION", None)
    code = ("import sageattention, torch\n"
            "from sageattention import dispatch\n"
            "print(repr(dispatch._native_state()['sm75']))\n"
            "q = torch.randn(1, 2, 8, 16)\n"
            "print(tuple(sageattention.sageattn(q, q, q).shape))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    # the sm75 family is told apart from the broken sm80 one (an OSError marked every family)
    assert "built without sm75-family targets" in res.stdout and "(1, 2, 8, 16)" in res.stdout
    res = subprocess.run([sys.executable, "-m", "sageattention"], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert "verdict: NOT USABLE HERE" in res.stdout
    assert (f"BROKEN: native family sm80 does not load: sageattention._kernels_sm80 could not be "
            f"loaded (OSError: {UNDEFINED})") in res.stdout
