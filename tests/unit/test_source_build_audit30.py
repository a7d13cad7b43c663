"""Source-build settings that were refused, misread or had no effect (audit 30).

Target resolution runs with fake torch facts and a fake nvcc version; the setup.py cases run
setup.py build_ext on a copy of the tree with a fake toolkit whose nvcc never compiles.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from packaging.version import Version

from scripts.factory import arch, source_build
from scripts.factory.errors import ToolchainError
from scripts.factory.model import Target

ROOT = Path(__file__).resolve().parents[2]
ARCH_LIST = "TORCH_CUDA_ARCH_LIST"


@pytest.fixture(autouse=True)
def _nvcc13(monkeypatch):
    monkeypatch.setattr(arch, "nvcc_version", lambda p: Version("13.0.88"))


def _resolve(env, caps=()):
    """resolve() with torch 2.14/cu130 that sees ``caps`` only when asked for the GPUs; returns
    (config, whether the GPUs were asked for)."""
    asked = []

    def facts(need_gpus):
        asked.append(need_gpus)
        return source_build.TorchFacts("2.14.1+cu130", "13.0", caps if need_gpus else ())

    cfg = source_build.resolve(env, torch_facts=facts, find_nvcc=lambda e: Path("/fake/nvcc"),
                               nvcc_identity=lambda p: "V13.0.88")
    return cfg, asked == [True]


# --- TORCH_CUDA_ARCH_LIST -------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["native", " native "])
def test_torch_arch_list_native_builds_for_the_visible_gpus(value):
    # before: "TORCH_CUDA_ARCH_LIST item 'native' is not like '8.0'": torch's own spelling of
    # "the GPUs I can see" (cpp_extension._get_cuda_arch_flags) stopped the build
    cfg, asked = _resolve({ARCH_LIST: value}, caps=((8, 6), (8, 9)))
    assert asked
    assert cfg.targets == (Target(86), Target(89))
    assert "TORCH_CUDA_ARCH_LIST=native" in cfg.targets_from
    assert cfg.version.startswith("2.2.0+sm86.sm89.")


def test_torch_arch_list_native_without_a_gpu_says_what_to_set():
    with pytest.raises(ToolchainError) as exc:
        _resolve({ARCH_LIST: "native"})
    message = str(exc.value)
    assert "TORCH_CUDA_ARCH_LIST=native" in message and "sees no CUDA GPU" in message
    assert f"{source_build.TARGETS_ENV}='sm80'" in message


@pytest.mark.parametrize("value, sms", [
    ("8.0;8.6;", (80, 86)), (";8.0", (80,)), ("8.0; 8.6+PTX;\n", (80, 86)), ("9.0a;", (90,)),
])
def test_stray_separators_in_torch_arch_list_are_skipped(value, sms):
    # before: "TORCH_CUDA_ARCH_LIST item '' is not like '8.0'" for a trailing or leading ';'
    # (while '8.0;;8.6' was taken, and SAGEATTENTION_SM_TARGETS takes all of these)
    cfg, asked = _resolve({ARCH_LIST: value}, caps=((7, 5),))
    assert not asked
    assert tuple(t.sm for t in cfg.targets) == sms


@pytest.mark.parametrize("value", [" ", ";", " ; "])
def test_a_torch_arch_list_of_only_separators_is_unset_as_torch_reads_an_empty_one(value):
    # before: "item '' is not like '8.0'" for ' ' while '' built for the visible GPU
    cfg, asked = _resolve({ARCH_LIST: value}, caps=((8, 9),))
    assert asked and cfg.targets == (Target(89),) and cfg.targets_from == "the visible GPU(s)"


def test_a_bad_item_is_still_refused():
    with pytest.raises(ToolchainError, match="TORCH_CUDA_ARCH_LIST item 'sm_80'"):
        _resolve({ARCH_LIST: "8.0;sm_80;"})


# --- setup.py build_ext: progress lines and the toolkit torch builds with ------------------------

_TREE = ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in", "build_matrix.yaml",
         "csrc", "scripts", "sageattention")


@pytest.fixture(scope="module")
def stalled_build(tmp_path_factory):
    """setup.py build_ext with stdout a pipe (as under pip), CUDA_HOME set but empty and PATH's
    nvcc a link into a fake toolkit; the fake nvcc's first compile records CUDA_HOME and waits.
    Returns (stdout lines seen while that compile waited, CUDA_HOME the compile ran with)."""
    if sys.platform == "win32":
        pytest.skip("the fake toolkit is a shell script")
    pytest.importorskip("torch", reason="setup.py reads torch's version and build machinery")
    tmp = tmp_path_factory.mktemp("stalled_build")
    tree = tmp / "src"
    tree.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "_build_info.json")
    for name in _TREE:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=ignore)
        else:
            shutil.copy(src, tree / name)
    toolkit = tmp / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    started, release = tmp / "started", tmp / "release"
    nvcc = toolkit / "bin" / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        "if [ \"$1\" = --version ]; then\n"
        "  echo 'Cuda compilation tools, release 13.0, V13.0.88'; exit 0\nfi\n"
        f"printf '%s' \"$CUDA_HOME\" > '{started}'\n"
        "i=0\n"
        f"while [ ! -e '{release}' ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n"
        "exit 1\n")
    nvcc.chmod(0o755)
    (tmp / "bin").mkdir()
    (tmp / "bin" / "nvcc").symlink_to(nvcc)  # as /usr/bin/nvcc -> /usr/local/cuda/bin/nvcc
    drop = {source_build.TARGETS_ENV, ARCH_LIST, source_build.CELL_ENV, "PYTHONUNBUFFERED",
            "CUDA_PATH", "CXX", "MAX_JOBS", "SOURCE_DATE_EPOCH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({source_build.TARGETS_ENV: "sm80", "CUDA_HOME": "", "MAX_JOBS": "1",
                "PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                "SAGEATTENTION_KERNEL_CACHE": str(tmp / "cache")})
    lines: list[str] = []
    proc = subprocess.Popen([sys.executable, "setup.py", "build_ext"], cwd=tree, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not started.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                reader.join(5)
                pytest.fail("setup.py never reached the kernel compile:\n" + "".join(lines))
            time.sleep(0.1)
        time.sleep(5)  # the compile is waiting: whatever was printed has had time to arrive
        seen = list(lines)
        cuda_home = started.read_text()
    finally:
        release.touch()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return seen, cuda_home


def test_kernel_progress_reaches_a_pipe_while_the_compile_runs(stalled_build):
    # before: the kernel lines went through a block-buffered stdout and reached pip's pipe only
    # after every compile had finished (README: shown with `pip install -v`, a line per object
    # and a `still compiling` line every 30 s)
    seen, _ = stalled_build
    assert any(line.startswith("[kernels sm80] ") and "1 job(s)" in line for line in seen), \
        "".join(seen)


def test_an_empty_cuda_home_is_replaced_by_the_toolkit_that_compiles(stalled_build):
    # before: setdefault kept CUDA_HOME='', and torch's extension builder guessed the toolkit as
    # dirname(dirname(which nvcc)) without following the link: the bin/.. of the link
    _, cuda_home = stalled_build
    assert cuda_home and Path(cuda_home).resolve() == \
        (Path(cuda_home).parent / "cuda-13.0").resolve()
    assert (Path(cuda_home) / "include" / "cuda_runtime.h").is_file()
