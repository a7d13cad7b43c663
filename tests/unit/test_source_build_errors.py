"""How a source build fails: before any compile, with what is wrong and what to do instead.

Each case here was a traceback, a silent guess or a message without its fix before; the
resolution runs with fake torch facts and fake toolkits, never a compile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from scripts.factory import arch, kernels, source_build
from scripts.factory.errors import BuildError, ToolchainError
from scripts.factory.model import Target

ROOT = Path(__file__).resolve().parents[2]
TARGETS = source_build.TARGETS_ENV
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="fake tools are shell scripts")


def _facts(version="2.14.1+cu130", cuda="13.0", caps=()):
    return lambda need_gpus: source_build.TorchFacts(version, cuda, caps)


def _resolve(env, **kw):
    """resolve() with a fake nvcc 13.0 unless a real (fake-toolkit) one is asked for."""
    fake = dict(find_nvcc=lambda e: Path("/fake/nvcc"), nvcc_identity=lambda p: "V13.0.88")
    if kw.pop("real_nvcc", False):
        fake = {}
    return source_build.resolve(env, torch_facts=kw.pop("facts", _facts()), **fake, **kw)


@pytest.fixture
def nvcc13(monkeypatch):
    monkeypatch.setattr(arch, "nvcc_version", lambda p: Version("13.0.88"))


def _toolkit(tmp_path: Path, name: str, body: str, mode: int = 0o755) -> Path:
    (tmp_path / name / "bin").mkdir(parents=True)
    nvcc = tmp_path / name / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\n" + body)
    nvcc.chmod(mode)
    return tmp_path / name


# --- SM targets -----------------------------------------------------------------------------

@pytest.mark.parametrize("given, meant", [
    ("sm_80", "sm80"), ("80", "sm80"), ("8.0", "sm80"), ("compute_80", "sm80"),
    ("sm_80,sm_90+ptx", "sm80;sm90+PTX"), ("80 86", "sm80;sm86"), ("sm80;sm_89", "sm80;sm89"),
])
def test_other_spellings_of_an_sm_get_a_did_you_mean(nvcc13, given, meant):
    # before: "not an SM target: 'sm_80'; write e.g. 'sm80'" without the corrected list
    with pytest.raises(ToolchainError) as exc:
        _resolve({TARGETS: given})
    assert f"did you mean {TARGETS}='{meant}'?" in str(exc.value)
    assert _resolve({TARGETS: meant}).targets  # and the suggestion builds


def test_sm90a_says_the_sm90_target_already_builds_sm_90a(nvcc13):
    with pytest.raises(ToolchainError) as exc:
        _resolve({TARGETS: "sm90a"})
    message = str(exc.value)
    assert f"did you mean {TARGETS}='sm90'?" in message
    assert "already compiles the arch-specific families as sm_90a" in message


@pytest.mark.parametrize("given", ["sm80;ampere", "sm 80x", "sm80;sm80+PTX"])
def test_no_suggestion_where_none_fits(nvcc13, given):
    with pytest.raises(ToolchainError) as exc:
        _resolve({TARGETS: given})
    assert "did you mean" not in str(exc.value)


@pytest.mark.parametrize("given", ["sm800", "sm999", "sm81"])
def test_a_typo_sm_is_not_called_a_newer_gpu(nvcc13, given):
    # before: "for an sm999 GPU build sm75 ..., whose compute_75 PTX the driver compiles for it"
    with pytest.raises(ToolchainError) as exc:
        _resolve({TARGETS: given})
    message = str(exc.value)
    assert f"{given} (from {TARGETS}) is not an NVIDIA GPU architecture" in message
    assert "supports sm75, sm80" in message and "PTX the driver" not in message
    # a real GPU newer than every family still gets the PTX hint
    with pytest.raises(ToolchainError, match="for an sm120 GPU build sm75"):
        _resolve({TARGETS: "sm120"})


@pytest.mark.parametrize("given", ["sm80;sm80", "sm80,,sm80 ;"])
def test_duplicates_and_stray_separators_build_once(nvcc13, given):
    assert _resolve({TARGETS: given}).targets == (Target(80),)


@pytest.mark.parametrize("env, caps", [
    ({TARGETS: "sm90;sm80"}, ()), ({TARGETS: "sm75+PTX;sm86"}, ()),
    ({"TORCH_CUDA_ARCH_LIST": "8.6;9.0a"}, ()), ({}, ((8, 9), (8, 9))),
])
def test_the_version_label_is_the_label_of_what_is_built(nvcc13, env, caps):
    cfg = _resolve(env, facts=_facts(caps=caps))
    version = Version(cfg.version)
    assert version.local == str(cfg.label)
    assert version.local.split(".torch")[0] == ".".join(f"sm{t.sm}" for t in cfg.targets)
    assert version.local.endswith(".torch2.14cu130")


# --- nvcc and the host compiler ---------------------------------------------------------------

@posix_only
@pytest.mark.parametrize("body, mode, words", [
    ("echo 'Cuda compilation tools, release 13.0, V13.0.88'\n", 0o644, "Permission denied"),
    ("exit 3\n", 0o755, "exit status 3"),
])
def test_an_nvcc_that_does_not_run_is_a_toolchain_error(tmp_path, body, mode, words):
    # before: a PermissionError / CalledProcessError traceback out of setup.py
    home = _toolkit(tmp_path, "cuda", body, mode)
    with pytest.raises(ToolchainError, match=words) as exc:
        _resolve({TARGETS: "sm80", "CUDA_HOME": str(home)}, real_nvcc=True)
    assert str(home / "bin" / "nvcc") in str(exc.value)


@posix_only
def test_an_nvcc_of_another_major_names_its_path_and_where_it_came_from(tmp_path):
    home = _toolkit(tmp_path, "cuda-12.8",
                    "echo 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    with pytest.raises(ToolchainError) as exc:
        _resolve({TARGETS: "sm80", "CUDA_HOME": str(home)}, real_nvcc=True)
    message = str(exc.value)
    assert "nvcc 12.8.93 does not match the cell's CUDA 13.0" in message
    assert f"(nvcc 12.8.93 is {home / 'bin' / 'nvcc'}, found through CUDA_HOME)" in message


@posix_only
def test_a_cxx_that_is_no_program_is_named(nvcc13, tmp_path):
    # before: FileNotFoundError traceback from the host compiler's version probe
    with pytest.raises(ToolchainError, match="CXX='/nonexistent/g\\+\\+': /nonexistent/g\\+\\+ "
                                             "is not an executable program"):
        _resolve({TARGETS: "sm80", "CXX": "/nonexistent/g++"})


@posix_only
def test_a_wrapped_cxx_is_read_as_its_compiler(nvcc13, tmp_path):
    # before: CXX='ccache g++' (which setuptools accepts) was run as one program name
    wrapper, compiler = tmp_path / "ccache", tmp_path / "fake-g++"
    wrapper.write_text("#!/bin/sh\necho 'ccache version 4'\n")
    compiler.write_text("#!/bin/sh\necho 'fake-g++ (GCC) 13.2.0'\n")
    wrapper.chmod(0o755)
    compiler.chmod(0o755)
    cfg = _resolve({TARGETS: "sm80", "CXX": f"{wrapper} {compiler} -m64"})
    assert cfg.nvcc_id.endswith("\nfake-g++ (GCC) 13.2.0")


# --- an incomplete source tree (an sdist without csrc/) ---------------------------------------

def _tree(tmp_path: Path, families: bool = True) -> Path:
    root = tmp_path / "src"
    json_path = root / arch.FAMILIES_JSON.relative_to(arch.REPO_ROOT)
    json_path.parent.mkdir(parents=True)
    if families:
        shutil.copy(arch.FAMILIES_JSON, json_path)
    return root


def test_missing_kernel_folders_stop_before_torch_is_asked_to_build(nvcc13, tmp_path):
    # before: BuildError traceback from setup.py's module level (binding_sources)
    root = _tree(tmp_path)
    with pytest.raises(ToolchainError) as exc:
        _resolve({TARGETS: "sm80"}, root=root)
    assert f"family sm80: {root / 'csrc' / 'sm80'} is missing" in str(exc.value)
    assert "build from a complete git checkout or a fresh sdist" in str(exc.value)


def test_a_family_folder_without_sources_is_named(nvcc13, tmp_path):
    root = _tree(tmp_path)
    (root / "csrc" / "common").mkdir(parents=True)
    (root / "csrc" / "sm80").mkdir()
    with pytest.raises(BuildError, match="family sm80: no .cu files in .*fresh sdist"):
        _resolve({TARGETS: "sm80"}, root=root)
    (root / "csrc" / "sm80" / "k.cu").write_text("// k\n")
    with pytest.raises(BuildError, match="family sm80: no bindings .cpp in .*fresh sdist"):
        _resolve({TARGETS: "sm80"}, root=root)
    (root / "csrc" / "sm80" / "bindings.cpp").write_text("// b\n")
    assert _resolve({TARGETS: "sm80"}, root=root).targets == (Target(80),)


def test_a_missing_or_broken_families_json_is_named(nvcc13, tmp_path):
    root = _tree(tmp_path, families=False)
    with pytest.raises(ToolchainError, match="families.json is missing: this source tree"):
        _resolve({TARGETS: "sm80"}, root=root)
    (root / arch.FAMILIES_JSON.relative_to(arch.REPO_ROOT)).write_text(json.dumps({"x": 1}))
    with pytest.raises(ToolchainError, match="families.json is malformed"):
        _resolve({TARGETS: "sm80"}, root=root)


# --- setup.py itself ----------------------------------------------------------------------------

def _setup_py(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if k not in (TARGETS, "TORCH_CUDA_ARCH_LIST", "SAGEATTENTION_CELL")}
    return subprocess.run([sys.executable, "setup.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**full, **env})


def test_setup_py_stops_without_a_traceback_and_says_what_to_write():
    pytest.importorskip("torch", reason="resolve reads torch's version first")
    out_dir = Path(__file__).parent  # never written: the build stops before
    res = _setup_py("dist_info", "--output-dir", str(out_dir), **{TARGETS: "sm_80"})
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    assert "error: cannot build sageattention's CUDA kernels" in res.stderr
    assert f"did you mean {TARGETS}='sm80'?" in res.stderr


# --- progress -----------------------------------------------------------------------------------

@posix_only
def test_a_long_compile_prints_a_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(kernels, "HEARTBEAT_S", 0.1)
    root = tmp_path / "src"
    (root / "csrc" / "common").mkdir(parents=True)
    (root / "csrc" / "fam").mkdir()
    (root / "csrc" / "fam" / "slow.cu").write_text("// slow\n")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text('#!/bin/sh\nsleep 0.6\nwhile [ "$1" != "-o" ]; do shift; done; '
                    'echo obj > "$2"\n')
    nvcc.chmod(0o755)
    fam = arch.Family("fam", "pkg._fam", "csrc/fam", (80,), "11.0", None)
    logs: list[str] = []
    kernels.compile_family(arch.FamilyBuild(fam, (80,), ()), nvcc=nvcc, nvcc_id="x", jobs=1,
                           cache_dir=tmp_path / "cache", root=root, log=logs.append)
    assert any(line.startswith("[kernels fam] still compiling: slow.cu") for line in logs)
    assert any("1/1 slow.cu: compiled in" in line for line in logs)
