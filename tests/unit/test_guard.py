"""The runtime guard: its verdicts and the sentences it says (no GPU needed)."""

from __future__ import annotations

import sys

import pytest

from sageattention import __main__ as diagnostics
from sageattention import build_info, guard

INFO = {
    "version": "2.2.0+sm75.torch2.12cu130", "local_label": "sm75.torch2.12cu130",
    "sm_targets": ["sm75+PTX"], "families": ["sm75"], "ptx": ["compute_75"],
    "torch": "2.12.0+cu130", "cuda": "13.0", "python_tag": "cp312",
    "platform": "linux_x86_64", "cell_id": "linux-cp312-torch2.12-cu130-sm75",
}
SM80 = dict(INFO, version="2.2.0+sm80.torch2.12cu130", local_label="sm80.torch2.12cu130",
            sm_targets=["sm80"], families=["sm80"], ptx=[])
PY = f"cp{sys.version_info.major}{sys.version_info.minor}"


@pytest.fixture(autouse=True)
def _platform(monkeypatch):
    monkeypatch.setattr(guard, "_platform_tag", lambda info: "manylinux_2_34_x86_64")


def test_matching_environment_passes():
    assert guard.import_problem(INFO, "2.12.0+cu130", "13.0") is None
    assert guard.import_problem(INFO, "2.12.1", "13.1") is None   # patch/minor CUDA is fine
    assert guard.import_problem(None, "2.14.1", None) is None     # source checkout


def test_torch_mismatch_names_both_versions_and_the_wheel_to_install():
    msg = guard.import_problem(INFO, "2.14.1+cu130", "13.0")
    assert "built for torch 2.12 (installed: 2.14.1+cu130)" in msg
    assert (f"sageattention-2.2.0+sm75.torch2.14cu130-{PY}-{PY}-manylinux_2_34_x86_64.whl"
            in msg)
    assert "SAGEATTENTION_SM_TARGETS='sm75'" in msg


def test_cuda_major_mismatch_and_cpu_torch():
    msg = guard.import_problem(INFO, "2.12.0+cu128", "12.8")
    assert "CUDA 13.0 (installed torch uses CUDA 12.8)" in msg
    assert "sm75.torch2.12cu128" in msg
    cpu = guard.import_problem(INFO, "2.12.0+cpu", None)
    assert "CPU-only build" in cpu and "torch==2.12.*" in cpu and "cu130" in cpu
    rocm = guard.import_problem(INFO, "2.12.0+rocm6.4", None)  # torch.version.cuda is None
    assert "is a ROCm (AMD GPU) build" in rocm and "CPU-only" not in rocm
    assert "torch==2.12.*" in rocm and "cu130" in rocm


def test_device_served_by_sass_or_ptx():
    assert guard.served_by(SM80, (8, 0)) == "sm80 SASS"
    assert guard.served_by(SM80, (8, 6)) == "sm80 SASS"      # same major, newer minor
    assert guard.served_by(SM80, (9, 0)) is None             # no PTX: sm90 cannot run sm80
    assert guard.served_by(SM80, (7, 5)) is None
    assert guard.served_by(INFO, (7, 5)) == "sm75 SASS"
    assert "compute_75 PTX" in guard.served_by(INFO, (9, 0))  # the H200 runs sm75 as PTX


ADA_PTX = dict(INFO, version="2.2.0+sm89.torch2.12cu130", local_label="sm89.torch2.12cu130",
               sm_targets=["sm89+PTX"], families=["sm80", "sm89"], ptx=["compute_89"])


def test_plus_ptx_runs_only_on_the_gpus_its_families_serve():
    # The dispatcher runs the sm80 and sm89 families up to sm90: their compute_89 PTX would
    # JIT-compile on a Blackwell GPU, but no kernel of theirs runs there (it said it ran).
    assert guard.served_by(ADA_PTX, (8, 9)) == "sm89 SASS"
    assert "compute_89 PTX" in guard.served_by(ADA_PTX, (9, 0))
    assert guard.served_by(ADA_PTX, (10, 0)) is None
    assert guard.served_by(ADA_PTX, (12, 0)) is None
    assert "compute_75 PTX" in guard.served_by(INFO, (12, 0))   # the sm75 family's embed_ptx
    # build info without its families (older wheels): PTX reaches every newer GPU
    legacy = {k: v for k, v in ADA_PTX.items() if k != "families"}
    assert "compute_89 PTX" in guard.served_by(legacy, (12, 0))


def test_the_newest_ptx_that_runs_is_named_by_number_not_text():
    legacy = {k: v for k, v in INFO.items() if k != "families"}
    both = dict(legacy, ptx=["compute_75", "compute_100"])   # as text, compute_75 sorts last
    assert "compute_100 PTX" in guard.served_by(both, (12, 0))
    assert "compute_75 PTX" in guard.served_by(both, (9, 0))   # compute_100 cannot run there


def test_a_gpu_no_family_serves_is_pointed_at_the_embedded_ptx_wheel():
    msg = guard.device_problem(ADA_PTX, (12, 0), "NVIDIA RTX 5090 (cuda:0)")
    assert "cannot run on NVIDIA RTX 5090 (cuda:0) (sm120)" in msg
    assert "No kernel family is built for sm120; the sm75 family's embedded PTX runs there" in msg
    assert "sageattention-2.2.0+sm75.torch2.12cu130-" in msg
    assert "SAGEATTENTION_SM_TARGETS='sm75'" in msg
    # a GPU that a family serves is pointed at its own wheel
    assert "sageattention-2.2.0+sm86.torch2.12cu130-" in guard.device_problem(ADA_PTX, (8, 6))


def test_device_mismatch_names_targets_gpu_and_wheel():
    msg = guard.device_problem(SM80, (9, 0), "NVIDIA H200 (cuda:0)")
    assert "has kernels for sm80 (embedded PTX: none)" in msg
    assert "cannot run on NVIDIA H200 (cuda:0) (sm90)" in msg
    assert "sageattention-2.2.0+sm90.torch2.12cu130-" in msg
    assert guard.device_problem(SM80, (8, 9)) is None
    assert guard.device_problem(None, (5, 0)) is None


def test_check_import_raises_or_defers_to_diagnostics(monkeypatch):
    monkeypatch.setattr(build_info, "load", lambda: INFO)
    monkeypatch.setattr(guard, "_torch_facts", lambda: ("2.14.1", "13.0"))
    monkeypatch.setattr(sys, "orig_argv", ["python", "-c", "import sageattention"],
                        raising=False)
    with pytest.raises(guard.IncompatibleBuildError, match="built for torch 2.12"):
        guard.check_import()
    assert issubclass(guard.IncompatibleBuildError, RuntimeError)
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "sageattention"], raising=False)
    guard.check_import()  # `python -m sageattention` must get to print its verdict


def test_check_import_and_device_are_no_ops_in_a_source_checkout(monkeypatch):
    monkeypatch.setattr(build_info, "load", lambda: None)
    guard.check_import()
    guard.check_device("cuda:0")  # no torch.cuda call is made without build info


def test_check_device_raises_for_an_unserved_gpu(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(build_info, "load", lambda: SM80)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(guard, "_checked_devices", set())
    with pytest.raises(guard.IncompatibleBuildError, match="cannot run on NVIDIA H200"):
        guard.check_device("cuda:3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 6))
    guard.check_device("cuda:3")
    assert 3 in guard._checked_devices


def test_diagnostics_verdict_lines():
    env = {"torch": "2.12.0+cu130", "torch_cuda": "13.0",
           "gpus": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0"}]}
    ok, lines = diagnostics.verdict(INFO, env)
    assert ok and "runs this build's compute_75 PTX" in lines[-2]
    assert lines[-1].startswith("cuda:0 sageattn dispatch: fastest measured backend per shape, "
                                "SDPA included, from calibration table sm90")
    ok, lines = diagnostics.verdict(SM80, env)
    assert not ok and lines[-1].startswith("MISMATCH: ") and "sm90" in lines[-1]
    ok, lines = diagnostics.verdict(INFO, dict(env, torch="2.14.1", gpus=[]))
    assert not ok and "no CUDA GPU visible" in lines[-1]
    assert diagnostics.verdict(None, env)[0]


def test_dispatch_summary_names_the_table_or_the_static_order(monkeypatch):
    assert "static order cuda-sm80-fp16, triton-fp16, cuda-sm75-fp16, sdpa (no calibration table" \
        in diagnostics.dispatch_summary((8, 6))
    monkeypatch.setenv("SAGEATTENTION_CALIBRATION", "off")
    assert "static order cuda-sm90-fp16, cuda-sm80-fp16, cuda-sm90-fp8, cuda-sm89-fp8" \
        in diagnostics.dispatch_summary((9, 0))
    monkeypatch.setenv("SAGEATTENTION_CALIBRATION", "maybe")
    assert diagnostics.dispatch_summary((9, 0)).startswith("error: SAGEATTENTION_CALIBRATION='maybe'")


def test_dispatch_summary_names_a_backend_the_variable_forces(monkeypatch):
    # it said "from calibration table sm90" while SAGEATTENTION_BACKEND, which wins, forced another
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "triton-fp16")
    summary = diagnostics.dispatch_summary((9, 0), "NVIDIA H200")
    assert summary.startswith("'triton-fp16' for every call, forced by SAGEATTENTION_BACKEND")
    assert "calibration table sm90" not in summary


def test_diagnostics_command_in_a_source_checkout(capsys, monkeypatch):
    monkeypatch.setattr(build_info, "load", lambda: None)
    monkeypatch.setattr(diagnostics, "_environment", lambda: dict(
        python="3.11.7", python_tag="cp311", platform="Linux", torch="2.14.1", torch_cuda="13.0", gpus=[]))
    assert diagnostics.main([]) == 0
    out = capsys.readouterr().out
    assert "build info: none (source checkout)" in out and "verdict: OK" in out
    assert "gpu          none visible to torch" in out  # it said nothing of the GPU there


def test_diagnostics_says_a_bad_dispatch_variable_makes_every_call_raise(capsys, monkeypatch):
    # it said "verdict: OK" while every sageattn call then raised
    monkeypatch.setattr(build_info, "load", lambda: None)
    monkeypatch.setenv("SAGEATTENTION_BACKEND", "cuda-sm91-fp16")
    assert diagnostics.main([]) == 1
    out = capsys.readouterr().out
    assert "verdict: NOT USABLE HERE" in out
    assert "MISCONFIGURED: SAGEATTENTION_BACKEND='cuda-sm91-fp16' is not a backend" in out
