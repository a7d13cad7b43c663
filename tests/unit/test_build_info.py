"""Build info: what setup.py writes, what the package reads, and one naming rule for both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from sageattention import build_info
from scripts.factory import arch, buildinfo, labels
from scripts.factory.model import Cell, Target

ARCHITECTURE_FIELDS = {"version", "local_label", "sm_targets", "families", "torch", "cuda",
                       "python_tag", "platform", "compilers", "git_commit", "build_date",
                       "cell_id"}


def make(**kw):
    families = arch.load_families()
    args = dict(version="2.2.0+sm75.torch2.14cu130", local_label="sm75.torch2.14cu130",
                targets=[Target(75, True)], builds=arch.family_builds([(75, True)], families),
                torch_version="2.14.1+cu130", cuda="13.0", torch_requirement="torch==2.14.*",
                nvcc_version="13.0.88", cell_id="linux-cp311-torch2.14-cu130-sm75",
                env={"SOURCE_COMMIT": "a" * 40, "SOURCE_DATE_EPOCH": "1764633600"})
    args.update(kw)
    return buildinfo.make_build_info(**args)


def test_build_info_has_every_contract_field():
    info = make()
    assert ARCHITECTURE_FIELDS <= set(info)
    assert info["sm_targets"] == ["sm75+PTX"] and info["families"] == ["sm75"]
    assert info["ptx"] == ["compute_75"]
    assert info["gencode"]["sm75"][0] == "-gencode=arch=compute_75,code=sm_75"
    assert info["compilers"]["nvcc"] == "13.0.88" and info["compilers"]["host"]
    assert info["git_commit"] == "a" * 40
    assert info["build_date"] == "2025-12-02T00:00:00+00:00"
    json.dumps(info)  # serializable as written into the wheel


def test_guard_accepts_what_the_build_writes():
    from sageattention import guard

    info = make()
    assert guard.import_problem(info, "2.14.1+cu130", "13.0") is None
    assert guard.served_by(info, (7, 5)) == "sm75 SASS"


def test_source_checkout_has_no_build_info():
    build_info.load.cache_clear()
    try:
        assert build_info.load() is None
        assert build_info.package_version() == labels.base_version()
    finally:
        build_info.load.cache_clear()


def test_package_version_comes_from_build_info(monkeypatch):
    monkeypatch.setattr(build_info, "load", lambda: {"version": "2.2.0+sm80.torch2.14cu130"})
    assert build_info.package_version() == "2.2.0+sm80.torch2.14cu130"


@pytest.mark.parametrize("text, problem", [
    ('{"version": ', "is not valid JSON (Expecting value"),
    ("[]", "holds a JSON list, not an object"),
    ('{"torch": "2.14.1"}', "has no 'version' field"),
], ids=["not-json", "not-an-object", "no-version"])
def test_malformed_build_info_is_a_damaged_installation(tmp_path, monkeypatch, text, problem):
    # A JSONDecodeError traceback at `import sageattention` (a RuntimeError without a remedy
    # for a missing version): now an ImportError naming the file and what to do.
    (tmp_path / build_info.BUILD_INFO_FILE).write_text(text)
    monkeypatch.setattr(build_info, "resources", SimpleNamespace(files=lambda package: tmp_path))
    build_info.load.cache_clear()
    try:
        with pytest.raises(build_info.DamagedInstallError) as exc:
            build_info.load()
    finally:
        build_info.load.cache_clear()
    assert isinstance(exc.value, ImportError)
    assert str(exc.value).startswith(f"{tmp_path / build_info.BUILD_INFO_FILE} {problem}")
    assert "this sageattention installation is damaged. Reinstall the wheel: pip install " \
        "--force-reinstall --no-deps" in str(exc.value)


def test_import_of_a_wheel_with_malformed_build_info_says_the_installation_is_damaged(tmp_path):
    package = tmp_path / "sageattention"
    shutil.copytree(Path(build_info.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__", build_info.BUILD_INFO_FILE))
    (package / build_info.BUILD_INFO_FILE).write_text('{"version": ')
    res = subprocess.run([sys.executable, "-c", "import sageattention"], capture_output=True,
                         text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"sageattention.build_info.DamagedInstallError: "
                           f"{package / build_info.BUILD_INFO_FILE} is not valid JSON"), res.stderr
    assert "JSONDecodeError" not in last and "Reinstall the wheel" in last


def test_factory_and_runtime_share_one_label_rule():
    assert labels.LocalLabel.__module__ == "_sageattention_label_rule"
    assert labels.LocalLabel.__qualname__ == build_info.LocalLabel.__qualname__
    cell = Cell(os="linux", python="3.12", torch="2.12.0", cuda="13.0",
                targets=(Target(75, True),))
    runtime = build_info.LocalLabel.create([75], "2.12.0", "13.0")
    assert str(runtime) == str(cell.label)
    name = build_info.wheel_filename(runtime, "cp312", "linux_x86_64", "2.2.0")
    assert name == "sageattention-2.2.0+sm75.torch2.12cu130-cp312-cp312-linux_x86_64.whl"
    assert labels.cell_for_wheel(name, [cell]) == cell


def test_label_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one SM"):
        build_info.LocalLabel.create([], "2.14", "13.0")
    with pytest.raises(ValueError, match="torch version"):
        build_info.LocalLabel.create([80], "latest", "13.0")


@pytest.mark.parametrize("given, warns", [("a" * 40, False), ("b" * 40 + "-dirty", False),
                                          ("7f0eba8", True), ("HEAD", True)])
def test_source_commit_is_kept_and_a_short_one_is_warned_about(capsys, given, warns):
    assert buildinfo.git_commit(env={"SOURCE_COMMIT": given}) == given
    err = capsys.readouterr().err
    assert ("not a full 40-character commit hash" in err) == warns
    if warns:
        assert repr(given) in err


@pytest.mark.parametrize("version, words", [("2.12.0+rocm6.4", "a ROCm (AMD GPU) build"),
                                            ("2.12.0+ROCm6.4", "a ROCm (AMD GPU) build"),
                                            ("2.13.0+cpu", "a CPU-only build"),
                                            ("2.13.0", "a CPU-only build")])
def test_a_torch_without_cuda_is_named_rocm_or_cpu_only(version, words):
    # one wording for the import guard and the source build
    assert build_info.torch_without_cuda(version) == words


def test_git_commit_is_the_source_trees_own_not_an_enclosing_checkouts(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True,
                       env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                            "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})

    git("init", "-q")
    (tmp_path / "f").write_text("x")
    git("add", "f")
    git("commit", "-q", "-m", "outer")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    assert buildinfo.git_commit(root=tmp_path, env={}) == head
    unpacked = tmp_path / "sageattention-2.2.0"   # an sdist unpacked inside that checkout
    unpacked.mkdir()
    assert buildinfo.git_commit(root=unpacked, env={}) == "unknown"
