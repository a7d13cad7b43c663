"""Build planning, gencode flags, source-build resolution and the kernel object cache."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.factory import arch, kernels, plan, source_build
from scripts.factory.errors import BuildError, ToolchainError
from scripts.factory.host import Host, Interpreter
from scripts.factory.model import Cell, Target

ROOT = Path(__file__).resolve().parents[2]

FAMILIES = arch.load_families()
PY311 = Interpreter("/usr/bin/python3.11", "3.11", "2.14.1+cu130", "13.0")


def cell(**kw) -> Cell:
    fields = dict(os="linux", python="3.11", torch="2.14.1", cuda="13.0", targets=(Target(80),),
                  build_runner=("ubuntu-24.04",))
    fields.update(kw)
    return Cell(**fields)


def host(**kw) -> Host:
    fields = dict(os="linux", interpreters={"3.11": (PY311,)}, nvcc="13.0.88",
                  has_repair_tool=True)
    fields.update(kw)
    return Host(**fields)


def test_buildable_cell_reuses_a_fitting_interpreter_and_lists_steps():
    p = plan.plan_cell(cell(), host())
    assert p.build and p.venv is None and p.interpreter is PY311
    text = "\n".join(p.steps)
    assert "-gencode=arch=compute_80,code=sm_80" in text
    assert "2.2.0+sm80.torch2.14cu130" in text and "torch==2.14.*" in text
    assert "auditwheel" in text


def test_skip_reasons_say_why():
    other_os = plan.plan_cell(cell(os="windows", build_runner=("windows-2022",)), host())
    assert not other_os.build and "windows" in other_os.reason and "windows-2022" in other_os.reason
    no_python = plan.plan_cell(cell(python="3.12"), host())
    assert not no_python.build and "no Python 3.12 interpreter" in no_python.reason
    no_nvcc = plan.plan_cell(cell(), host(nvcc=None))
    assert "nvcc not found" in no_nvcc.reason and "CUDA_HOME" in no_nvcc.reason
    old_nvcc = plan.plan_cell(cell(), host(nvcc="12.8.1"))
    assert not old_nvcc.build and "the major versions must agree" in old_nvcc.reason
    assert old_nvcc.reason.count("CUDA_HOME") == 1 and "CUDA 13.0 toolkit" in old_nvcc.reason
    no_tool = plan.plan_cell(cell(), host(has_repair_tool=False))
    assert "auditwheel is not installed" in no_tool.reason
    assert plan.plan_cell(cell(), host(has_repair_tool=False), repair_wheels=False).build


def test_other_torch_gets_its_own_venv():
    p = plan.plan_cell(cell(torch="2.12.0"), host())
    assert p.build and p.venv is not None and p.venv.name == "linux-cp311-torch2.12-cu130-sm80"
    assert "pip install torch==2.12.0" in p.steps[0]


def test_plan_names_the_folder_the_build_writes_to():
    # `build --out dist/wheels` printed "-> wheelhouse/" and then wrote to dist/wheels
    repaired = plan.plan_cell(cell(), host(), out_dir=Path("dist/wheels"))
    assert repaired.steps[-2].endswith("-> dist/wheels/")
    copied = plan.plan_cell(cell(), host(), repair_wheels=False, out_dir=Path("dist/wheels"))
    assert copied.steps[-2] == "no repair (--no-repair): copy to dist/wheels/"
    assert plan.plan_cell(cell(), host()).steps[-2].endswith("-> wheelhouse/")


def test_build_finds_the_repaired_wheel_when_out_is_relative_and_cwd_is_elsewhere(
        tmp_path, monkeypatch):
    # The repair tool runs in the repository root; a relative --out used to name one folder
    # there and another in this process's cwd, where no fresh wheel was found (max() of nothing)
    from scripts.factory import build, wheelcheck

    repo, elsewhere = tmp_path / "repo", tmp_path / "elsewhere"
    repo.mkdir(), elsewhere.mkdir()
    monkeypatch.setattr(build, "REPO_ROOT", repo)
    monkeypatch.chdir(elsewhere)
    the_cell = cell()
    name = f"sageattention-{the_cell.version()}-cp311-cp311-linux_x86_64.whl"

    def fake_run(command, what, env=None, log=print):
        command = [str(c) for c in command]
        target = Path(command[command.index("-w") + 1])
        target = target if target.is_absolute() else repo / target  # the tool's cwd
        target.mkdir(parents=True, exist_ok=True)
        (target / name.replace("linux_x86_64", "manylinux_2_28_x86_64"
                               if "repair" in command else "linux_x86_64")).write_bytes(b"w")

    monkeypatch.setattr(build, "_run", fake_run)
    monkeypatch.setattr(build, "prepare_python", lambda p, log=print: Path(sys.executable))
    monkeypatch.setattr(build.repair, "repair_prefix", lambda os_name: ["auditwheel"])
    monkeypatch.setattr(wheelcheck, "check_wheel", lambda wheel, matrix=None: None)
    planned = plan.plan_cell(the_cell, host())
    final = build.build_cell(planned, jobs=1, out_dir=Path("wheelhouse"), log=lambda s: None)
    repaired = name.replace("linux_x86_64", "manylinux_2_28_x86_64")
    assert final == (elsewhere / "wheelhouse" / repaired).resolve() and final.is_file()
    assert not (repo / "wheelhouse").exists()


def test_format_plan_counts_and_lists_every_cell():
    plans = plan.plan_cells([cell(), cell(python="3.12")], host())
    text = plan.format_plan(plans, "sm80")
    assert text.splitlines()[0] == "plan: sm80: 1 to build, 1 skipped"
    assert "BUILD linux-cp311-torch2.14-cu130-sm80" in text
    assert "SKIP  linux-cp312-torch2.14-cu130-sm80: no Python 3.12" in text


def test_family_gencode_follows_families_json():
    (sm75,) = arch.family_builds([(75, True)], FAMILIES)
    assert sm75.family.name == "sm75"
    assert sm75.gencode_flags() == ["-gencode=arch=compute_75,code=sm_75",
                                    "-gencode=arch=compute_75,code=compute_75"]
    builds = {b.family.name: b for b in arch.family_builds([(90, False)], FAMILIES)}
    assert list(builds) == ["sm80", "sm89", "sm90", "sm90_fp8"]  # families.json order
    assert builds["sm80"].gencode_flags() == ["-gencode=arch=compute_90,code=sm_90"]  # not 90a
    assert builds["sm89"].gencode_flags() == ["-gencode=arch=compute_90,code=sm_90"]
    assert builds["sm90"].gencode_flags() == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert builds["sm90_fp8"].gencode_flags() == ["-gencode=arch=compute_90a,code=sm_90a"]
    multi = {b.family.name: b for b in arch.family_builds([(80, False), (89, True)], FAMILIES)}
    assert multi["sm80"].sass == (80, 89) and multi["sm80"].ptx == (89,)
    assert multi["sm89"].sass == (89,)
    assert "sm90" not in multi and "sm90_fp8" not in multi


@pytest.mark.parametrize("targets", [[(90, False)], [(90, True)], [(80, False), (90, True)],
                                     [(75, True), (80, False), (86, False), (89, False), (90, True)]])
def test_sm90_families_compile_sm_90a_only_never_plain_sm_90_or_ptx(targets):
    wgmma = ("sm90", "sm90_fp8")
    assert [f.name for f in FAMILIES.values() if f.arch_specific] == list(wgmma)
    builds = {b.family.name: b for b in arch.family_builds(targets, FAMILIES)}
    for name in wgmma:
        assert FAMILIES[name].serves == (90,)
        assert (builds[name].sass, builds[name].ptx) == ((90,), ())
        assert builds[name].gencode_flags() == ["-gencode=arch=compute_90a,code=sm_90a"]
    # the other families keep compiling plain sm_90 (and PTX where asked)
    for name in ("sm80", "sm89"):
        flags = builds[name].gencode_flags()
        assert "-gencode=arch=compute_90,code=sm_90" in flags and not [f for f in flags if "90a" in f]
        assert ("-gencode=arch=compute_90,code=compute_90" in flags) == ((90, True) in targets)


def test_unchanged_flags_of_the_other_families():
    builds = {b.family.name: b.gencode_flags() for b in arch.family_builds(
        [(75, True), (80, False), (86, False), (89, False)], FAMILIES)}
    assert builds == {
        "sm75": ["-gencode=arch=compute_75,code=sm_75", "-gencode=arch=compute_75,code=compute_75"],
        "sm80": ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_86,code=sm_86",
                 "-gencode=arch=compute_89,code=sm_89"],
        "sm89": ["-gencode=arch=compute_89,code=sm_89"],
    }


def test_families_json_arch_specific_field_is_checked(tmp_path):
    def table(**sm90):
        spec = {"extension": "x._k", "sources": "csrc/x", "serves": ["sm90"], "min_nvcc": "12.4",
                "embed_ptx": None, **sm90}
        path = tmp_path / "families.json"
        path.write_text(json.dumps({"families": {"x": spec}}))
        return path

    assert not arch.load_families(table())["x"].arch_specific  # absent: false
    assert arch.load_families(table(arch_specific=True))["x"].arch_specific
    with pytest.raises(ValueError, match="family x: arch_specific must be true or false, got 'yes'"):
        arch.load_families(table(arch_specific="yes"))
    with pytest.raises(ValueError, match="family x: an arch_specific family embeds no PTX"):
        arch.load_families(table(arch_specific=True, embed_ptx="compute_90"))


def test_toolchain_check_names_the_problem():
    builds = arch.family_builds([(89, False)], FAMILIES)
    with pytest.raises(ToolchainError, match="does not match the cell's CUDA 13.0"):
        arch.check_toolchain(arch.Version("12.8"), "13.0", builds)
    with pytest.raises(ToolchainError, match="family sm89 needs nvcc >= 12.8"):
        arch.check_toolchain(arch.Version("12.1"), "12.1", builds)
    arch.check_toolchain(arch.Version("13.0.88"), "13.0", builds)
    hopper = arch.family_builds([(90, False)], FAMILIES)
    with pytest.raises(ToolchainError, match="family sm89 needs nvcc >= 12.8"):
        arch.check_toolchain(arch.Version("12.1"), "12.1", hopper)
    arch.check_toolchain(arch.Version("12.8"), "12.8", hopper)
    fam = dataclasses.replace(FAMILIES["sm90"], min_nvcc="11.0")
    with pytest.raises(ToolchainError, match="family sm90 needs nvcc >= 12.0 for sm_90a, found 11.8"):
        arch.check_toolchain(arch.Version("11.8"), "11.8", [arch.FamilyBuild(fam, (90,), ())])
    with pytest.raises(ToolchainError, match="sm_80a is not a known arch-specific target"):
        arch.check_toolchain(arch.Version("13.0"), "13.0", [arch.FamilyBuild(fam, (80,), ())])


def test_cxx_standard_is_a_property_of_the_torch_version():
    assert cell(torch="2.14.1").cxx_std == "c++20"
    assert cell(torch="2.13.0").cxx_std == "c++20"
    assert cell(torch="2.11.0").cxx_std == "c++17"


def _facts(version="2.14.1+cu130", cuda="13.0", caps=()):
    return lambda need_gpus: source_build.TorchFacts(version, cuda, caps)


def _resolve(env, **kw):
    return source_build.resolve(env, torch_facts=kw.get("facts", _facts()),
                                find_nvcc=lambda e: kw.get("nvcc", Path("/fake/nvcc")),
                                nvcc_identity=lambda p: "release 13.0, V13.0.88")


def test_source_build_targets_from_env_and_gpu(monkeypatch):
    monkeypatch.setattr(arch, "nvcc_version", lambda p: arch.Version("13.0.88"))
    cfg = _resolve({"SAGEATTENTION_SM_TARGETS": "sm90;sm80"})
    assert cfg.version == "2.2.0+sm80.sm90.torch2.14cu130"
    assert cfg.torch_requirement == "torch==2.14.*" and cfg.cxx_std == "c++20"
    assert [b.family.name for b in cfg.builds] == ["sm80", "sm89", "sm90", "sm90_fp8"]
    assert "-gencode=arch=compute_90a,code=sm_90a" in cfg.describe()
    assert _resolve({"TORCH_CUDA_ARCH_LIST": "7.5+PTX"}).targets == (Target(75, True),)
    hopper = _resolve({"TORCH_CUDA_ARCH_LIST": "9.0a"})  # as set on the H200 runner
    assert hopper.targets == (Target(90),) and "9.0a built as sm90" in hopper.targets_from
    with pytest.raises(ToolchainError, match="TORCH_CUDA_ARCH_LIST item 'Ampere'"):
        _resolve({"TORCH_CUDA_ARCH_LIST": "Ampere"})
    gpu = _resolve({}, facts=_facts(caps=((8, 6),)))
    assert gpu.targets == (Target(86),) and gpu.targets_from == "the visible GPU(s)"


def test_source_build_failures_say_what_to_set(monkeypatch):
    monkeypatch.setattr(arch, "nvcc_version", lambda p: arch.Version("13.0.88"))
    with pytest.raises(ToolchainError, match="SAGEATTENTION_SM_TARGETS is not set"):
        _resolve({})
    with pytest.raises(ToolchainError, match="CPU-only build"):
        _resolve({"SAGEATTENTION_SM_TARGETS": "sm80"}, facts=_facts("2.13.0+cpu", None))
    with pytest.raises(ToolchainError, match="nvcc not found.*CUDA_HOME"):
        _resolve({"SAGEATTENTION_SM_TARGETS": "sm80"}, nvcc=None)
    with pytest.raises(ToolchainError, match="no kernel family serves sm100"):
        _resolve({"SAGEATTENTION_SM_TARGETS": "sm100"})
    with pytest.raises(ToolchainError, match="SAGEATTENTION_CELL=linux-cp312"):
        _resolve({"SAGEATTENTION_SM_TARGETS": "sm80",
                  "SAGEATTENTION_CELL": "linux-cp312-torch2.11-cu130-sm80"})
    here = f"linux-cp{sys.version_info.major}{sys.version_info.minor}-torch2.14-cu130-sm80"
    assert _resolve({"SAGEATTENTION_SM_TARGETS": "sm80",
                     "SAGEATTENTION_CELL": here}).cell_id == here


def test_source_build_refuses_what_it_used_to_take_or_crash_on(monkeypatch, tmp_path):
    monkeypatch.setattr(arch, "nvcc_version", lambda p: arch.Version("13.0.88"))
    # one SM twice through torch's variable was a ValueError traceback out of setup.py
    with pytest.raises(ToolchainError, match="TORCH_CUDA_ARCH_LIST='8.0;8.0\\+PTX': .* names an SM twice"):
        _resolve({"TORCH_CUDA_ARCH_LIST": "8.0;8.0+PTX"})
    # set but empty built for whatever GPU was visible, as if unset
    with pytest.raises(ToolchainError, match="SAGEATTENTION_SM_TARGETS is set but empty"):
        _resolve({"SAGEATTENTION_SM_TARGETS": " "}, facts=_facts(caps=((8, 6),)))
    # a CUDA_HOME without nvcc: the nvcc on PATH compiled, torch took CUDA_HOME's headers
    with pytest.raises(ToolchainError, match="CUDA_HOME=/nonexistent has no bin/nvcc"):
        _resolve({"SAGEATTENTION_SM_TARGETS": "sm80", "CUDA_HOME": "/nonexistent"})
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / ("nvcc.exe" if sys.platform == "win32" else "nvcc")).write_text("")
    assert _resolve({"SAGEATTENTION_SM_TARGETS": "sm80", "CUDA_HOME": str(tmp_path)}).targets
    # a GPU newer than every family is pointed at the sm75 family's PTX
    with pytest.raises(ToolchainError, match="for an sm120 GPU build sm75 \\(SAGEATTENTION_SM_TARGETS='sm75'\\)"):
        _resolve({}, facts=_facts(caps=((12, 0),)))
    with pytest.raises(ToolchainError, match="is a ROCm \\(AMD GPU\\) build"):
        _resolve({"SAGEATTENTION_SM_TARGETS": "sm80"}, facts=_facts("2.13.0+rocm6.4", None))
    # a SOURCE_DATE_EPOCH that is no whole number was a ValueError traceback mid-build
    for epoch in ("2025-12-02", "1764633600.5", "9" * 30):
        with pytest.raises(ToolchainError, match=f"SOURCE_DATE_EPOCH={epoch!r} is not a time"):
            _resolve({"SAGEATTENTION_SM_TARGETS": "sm80", "SOURCE_DATE_EPOCH": epoch})
    assert _resolve({"SAGEATTENTION_SM_TARGETS": "sm80", "SOURCE_DATE_EPOCH": "1764633600"})


def test_setup_py_refuses_sdist_and_a_wheel_in_one_process():
    # `setup.py sdist bdist_wheel` made a kernel-less, unlabelled wheel without a word
    res = subprocess.run([sys.executable, "setup.py", "sdist", "bdist_wheel"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0
    assert "build the sdist and the wheel in two commands" in res.stderr


def test_torch_version_is_read_without_importing_torch():
    pytest.importorskip("torch", reason="needs torch installed")
    import torch

    assert source_build.torch_version_facts() == (torch.__version__, torch.version.cuda)


def test_jobs_setting():
    assert kernels.jobs_from_env({"MAX_JOBS": "3"}) == 3
    assert kernels.jobs_from_env({}) >= 1
    with pytest.raises(BuildError, match="MAX_JOBS must be a positive integer, got 'many'"):
        kernels.jobs_from_env({"MAX_JOBS": "many"})
    with pytest.raises(BuildError, match="MAX_JOBS must be a positive integer, got '0'"):
        kernels.jobs_from_env({"MAX_JOBS": "0"})


@pytest.mark.parametrize("jobs", ["0", "-2", "two"])
def test_build_refuses_a_jobs_count_that_is_not_positive(capsys, jobs):
    from scripts.factory import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["build", "--sm", "sm75", "--jobs", jobs])
    assert exc.value.code == 2
    assert f"argument --jobs: must be a positive integer, got '{jobs}'" in capsys.readouterr().err


@pytest.mark.skipif(sys.platform == "win32", reason="the fake nvcc is a shell script")
def test_kernel_objects_are_cached_and_invalidated(tmp_path):
    root = tmp_path / "src"
    (root / "csrc" / "common").mkdir(parents=True)
    (root / "csrc" / "fam").mkdir()
    (root / "csrc" / "common" / "x.cuh").write_text("// v1\n")
    (root / "csrc" / "fam" / "a.cu").write_text("// a\n")
    (root / "csrc" / "fam" / "b.cu").write_text("// b\n")
    calls = tmp_path / "calls"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                    'while [ "$1" != "-o" ]; do shift; done; echo obj > "$2"\n')
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    fam = arch.Family("fam", "pkg._fam", "csrc/fam", (80,), "11.0", None)
    build = arch.FamilyBuild(fam, (80,), ())
    logs: list[str] = []

    def run(b=build):
        return kernels.compile_family(b, nvcc=nvcc, nvcc_id="nvcc 13.0", jobs=2,
                                      cache_dir=tmp_path / "cache", root=root, log=logs.append)

    first = run()
    assert [o.cached for o in first] == [False, False] and all(o.path.is_file() for o in first)
    assert calls.read_text().count("-gencode=arch=compute_80,code=sm_80") == 2
    assert [o.cached for o in run()] == [True, True]            # warm: nothing compiled
    (root / "csrc" / "common" / "x.cuh").write_text("// v2\n")   # a shared header changed
    assert [o.cached for o in run()] == [False, False]
    other = arch.FamilyBuild(fam, (80, 90), ())                 # other gencode, other objects
    assert [o.cached for o in run(other)] == [False, False]
    assert [o.cached for o in run(arch.FamilyBuild(fam, (90,), ()))] == [False, False]
    # sm_90a instead of sm_90: the flags are in the key, so never the plain objects
    specific = arch.FamilyBuild(dataclasses.replace(fam, arch_specific=True), (90,), ())
    assert [o.cached for o in run(specific)] == [False, False]
    assert calls.read_text().count("-gencode=arch=compute_90a,code=sm_90a") == 2
    assert [o.cached for o in run(specific)] == [True, True]
    assert any("2/2" in line and "elapsed" in line for line in logs)
    assert not list((tmp_path / "cache").rglob("*.tmp"))
    # another nvcc build (its --version text differs): other objects, and the header line's
    # toolchain fingerprint says so
    logs.clear()
    again = kernels.compile_family(build, nvcc=nvcc, nvcc_id="nvcc 13.0, another build", jobs=2,
                                   cache_dir=tmp_path / "cache", root=root, log=logs.append)
    assert [o.cached for o in again] == [False, False]
    run()
    prints = [re.search(r"toolchain ([0-9a-f]{8}), cache ", line) for line in logs if "objects," in line]
    assert len(prints) == 2 and all(prints) and prints[0].group(1) != prints[1].group(1)


def _two_families(tmp_path, nvcc_body: str):
    root = tmp_path / "src"
    (root / "csrc" / "common").mkdir(parents=True)
    for name in ("one", "two"):
        (root / "csrc" / name).mkdir()
        (root / "csrc" / name / f"{name}.cu").write_text(f"// {name}\n")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\n" + nvcc_body)
    nvcc.chmod(0o755)
    builds = [arch.FamilyBuild(arch.Family(n, f"pkg._{n}", f"csrc/{n}", (80,), "11.0", None), (80,), ())
              for n in ("one", "two")]
    return root, nvcc, builds


@pytest.mark.skipif(sys.platform == "win32", reason="the fake nvcc is a shell script")
def test_families_compile_through_one_pool(tmp_path):
    # Each compile notes when it starts and ends and takes 0.4 s: with two jobs the second
    # family's object starts before the first family's ends (one family at a time would not).
    times = tmp_path / "times"
    root, nvcc, builds = _two_families(tmp_path, (
        f'src="$2"; echo "start $src $(date +%s.%N)" >> {times}; sleep 0.4\n'
        f'echo "end $src $(date +%s.%N)" >> {times}\n'
        'while [ "$1" != "-o" ]; do shift; done; echo obj > "$2"\n'))
    per_family = kernels.compile_families(builds, nvcc=nvcc, nvcc_id="x", jobs=2,
                                          cache_dir=tmp_path / "cache", root=root,
                                          log=lambda s: None)
    assert [[o.source.name for o in objs] for objs in per_family] == [["one.cu"], ["two.cu"]]
    stamps = {(w, Path(src).name): float(t) for w, src, t in
              (line.split() for line in times.read_text().splitlines())}
    assert stamps[("start", "two.cu")] < stamps[("end", "one.cu")]


@pytest.mark.skipif(sys.platform == "win32", reason="the fake nvcc is a shell script")
def test_first_failure_stops_the_other_families(tmp_path):
    calls = tmp_path / "calls"
    root, nvcc, builds = _two_families(tmp_path, (
        f'echo "$2" >> {calls}\n'
        'case "$2" in *one.cu) echo "one.cu(1): error: boom" >&2; exit 2;; esac\n'
        'while [ "$1" != "-o" ]; do shift; done; echo obj > "$2"\n'))
    with pytest.raises(BuildError, match=r"nvcc failed on csrc/one/one.cu"):
        kernels.compile_families(builds, nvcc=nvcc, nvcc_id="x", jobs=1,
                                 cache_dir=tmp_path / "cache", root=root, log=lambda s: None)
    assert [Path(line).name for line in calls.read_text().splitlines()] == ["one.cu"]


def test_failed_compile_names_the_source(tmp_path):
    root = tmp_path
    (root / "csrc" / "common").mkdir(parents=True)
    (root / "csrc" / "fam").mkdir()
    (root / "csrc" / "fam" / "bad.cu").write_text("x\n")
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'bad.cu(1): error: boom' >&2\nexit 2\n")
    nvcc.chmod(0o755)
    fam = arch.Family("fam", "pkg._fam", "csrc/fam", (80,), "11.0", None)
    with pytest.raises(BuildError, match=r"nvcc failed on csrc/fam/bad.cu \(exit 2\)"):
        kernels.compile_family(arch.FamilyBuild(fam, (80,), ()), nvcc=nvcc, nvcc_id="x",
                               jobs=1, cache_dir=tmp_path / "c", root=root, log=lambda s: None)
    assert os.listdir(tmp_path / "c" / "fam") == []


@pytest.mark.skipif(sys.platform == "win32", reason="the fake nvcc is a shell script")
def test_cuda_home_found_through_a_wrapper_script(tmp_path):
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    real = toolkit / "bin" / "nvcc"
    real.write_text(f"#!/bin/sh\necho '#$ _HERE_={toolkit / 'bin'}'\n")
    real.chmod(0o755)
    wrapper = tmp_path / "usr-local-bin-nvcc"
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    assert kernels.cuda_home_of(wrapper) == toolkit


def test_repair_commands_exclude_torch_and_cuda_libraries(tmp_path):
    from scripts.factory import repair

    linux = repair.repair_command("linux", tmp_path / "w.whl", tmp_path / "out",
                                  prefix=["auditwheel"])
    assert linux[:2] == ["auditwheel", "repair"] and linux[-1].endswith("w.whl")
    for pattern in ("libtorch*.so*", "libc10*.so*", "libcudart.so*", "libcudnn*.so*"):
        assert f"--exclude={pattern}" in linux
    windows = repair.repair_command("windows", tmp_path / "w.whl", tmp_path / "out",
                                    torch_lib=tmp_path / "torch" / "lib", prefix=["delvewheel"])
    excluded = windows[windows.index("--exclude") + 1].split(";")
    assert {"torch_cuda.dll", "c10.dll", "cudart64_13.dll"} <= set(excluded)
    assert windows[windows.index("--add-path") + 1] == str(tmp_path / "torch" / "lib")
    with pytest.raises(ValueError, match="accepted: linux, windows"):
        repair.repair_command("macos", tmp_path / "w.whl", tmp_path)


def _sm90_wheel(tmp_path, families, modules):
    import zipfile

    name = "sageattention-2.2.0+sm90.torch2.14cu130-cp311-cp311-linux_x86_64.whl"
    info = {"version": "2.2.0+sm90.torch2.14cu130", "local_label": "sm90.torch2.14cu130",
            "sm_targets": ["sm90"], "torch": "2.14.1", "cuda": "13.0", "python_tag": "cp311",
            "families": families}
    wheel = tmp_path / name
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sageattention/_build_info.json", json.dumps(info))
        zf.writestr("sageattention-2.2.0+sm90.torch2.14cu130.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: sageattention\nVersion: 2.2.0+sm90.torch2.14cu130\n"
                    "Requires-Dist: torch==2.14.*\n")
        for m in modules:
            zf.writestr(f"sageattention/_kernels_{m}.cpython-311-x86_64-linux-gnu.so", b"")
    return wheel


def test_an_sm90_wheel_must_hold_the_sm80_sm89_sm90_and_sm90_fp8_families(tmp_path):
    from scripts.factory import wheelcheck

    families = ["sm80", "sm89", "sm90", "sm90_fp8"]
    good = _sm90_wheel(tmp_path, families, families)
    assert wheelcheck.agreement_problems(good) == []
    expected = wheelcheck.expected_files(good)
    assert {f"sageattention/_kernels_{m}.cpython-311-x86_64-linux-gnu.so" for m in families} <= expected
    good.unlink()
    old = _sm90_wheel(tmp_path, families[:3], families[:3])  # built before the sm90_fp8 family
    problems = wheelcheck.agreement_problems(old)
    assert "build info families ['sm80', 'sm89', 'sm90'] != ['sm80', 'sm89', 'sm90', 'sm90_fp8'] " \
           "(what families.json says the SMs need)" in problems
    assert "extension sageattention._kernels_sm90_fp8 (family sm90_fp8) missing" in problems


@pytest.mark.parametrize("name, content, words", [
    ("sageattention-2.2.0-cp312-cp312-linux_x86_64.whl", b"PK\x05\x06" + bytes(18),
     "has no local label"),
])
def test_check_refuses_what_is_not_a_factory_wheel_without_a_traceback(tmp_path, capsys, name,
                                                                        content, words):
    from scripts.factory import cli
    from scripts.factory.errors import WheelCheckError

    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert cli.main(["check", str(path)]) == WheelCheckError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err


@pytest.mark.parametrize("name, content, words", [
    ("notes.txt", b"x", "'notes.txt' is not a wheel file name"),
    ("sageattention-2.2.0+sm75.torch2.12cu130-cp312-cp312-linux_x86_64.whl", b"not a zip",
     "{path}: not a wheel (a wheel is a zip archive; this file is not one)"),
], ids=["no-wheel-name", "not-a-zip"])
def test_check_calls_a_file_that_is_no_wheel_a_usage_error(tmp_path, capsys, name, content,
                                                          words):
    # It exited 6, which says a built wheel's name, metadata and build info disagree: a file that
    # is no wheel at all is a bad argument (exit 2), as a missing one is.
    from scripts.factory import cli

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        cli.main(["check", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument WHEEL: {words.format(path=path)}" in err and "e.g. wheelhouse/*.whl" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("given, words", [
    ("sageattention-2.2.0+sm75.torch2.12cu130-cp312-cp312-linux_x86_64.whl", "no such wheel file: "),
    ("wheelhouse/*.whl", "no such wheel file: "),   # a shell glob that matched nothing
    (".", "no such wheel file: . (it is a folder)"),
])
def test_check_calls_a_path_that_is_no_file_a_usage_error(tmp_path, monkeypatch, capsys, given,
                                                         words):
    # Exit 6 says a built wheel's name, metadata and build info disagree; a missing file is a bad
    # argument (exit 2), as in scripts.factory.validate, and the message says what to name.
    from scripts.factory import cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        cli.main(["check", given])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument WHEEL: {words}" in err and "e.g. wheelhouse/*.whl" in err
    assert "Traceback" not in err


def test_check_help_describes_the_command_and_each_argument(capsys):
    from scripts.factory import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["check", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "the file name, METADATA and build info must agree" in text
    assert "positional arguments: WHEEL built .whl files, e.g. wheelhouse/*.whl" in text
    assert "--matrix MATRIX matrix file the wheels' cells come from (default: build_matrix.yaml)" \
        in text


@pytest.mark.parametrize("argv", [
    ["plan", "--sm", "sm75", "--sm", "sm90"],
    ["build", "--sm", "sm75", "--sm", "sm90"],   # what `nox -s build-sm75 -- --sm sm90` passes
    ["plan", "--cell", "a", "--cell", "b"],
])
def test_a_second_sm_or_cell_is_refused_not_silently_taken_instead(capsys, argv):
    from scripts.factory import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert f"argument {argv[1]}: given twice ({argv[2]!r}, then {argv[4]!r})" in \
        capsys.readouterr().err


_GOOD_INFO = {"version": "2.2.0+sm90.torch2.14cu130", "local_label": "sm90.torch2.14cu130",
              "sm_targets": ["sm90"], "torch": "2.14.1", "cuda": "13.0", "python_tag": "cp311",
              "families": ["sm80", "sm89", "sm90", "sm90_fp8"]}
_GOOD_METADATA = ("Metadata-Version: 2.1\nName: sageattention\nVersion: 2.2.0+sm90.torch2.14cu130\n"
                  "Requires-Dist: torch==2.14.*\n")


@pytest.mark.parametrize("name, info, metadata, words", [
    ("sageattention-2.2.0+sm90.torch2.14cu130-cp311-cp311-macosx_14_0_arm64.whl", _GOOD_INFO,
     _GOOD_METADATA, "platform tags ['macosx_14_0_arm64'] are neither Linux nor Windows"),
    (None, [1, 2], _GOOD_METADATA, "_build_info.json must hold a JSON object, got list"),
    (None, _GOOD_INFO, "Metadata-Version: 2.1\nName: sageattention\nRequires-Dist: torch==2.14.*\n",
     "METADATA Version None is not a valid version"),
    (None, _GOOD_INFO, _GOOD_METADATA.replace("Version: 2.2.0+sm90", "Version: 2.2.0+sm90!!"),
     "METADATA Version '2.2.0+sm90!!.torch2.14cu130' is not a valid version"),
    (None, _GOOD_INFO, _GOOD_METADATA.replace("torch==2.14.*", "torch==2.14.* ; ;"),
     "METADATA Requires-Dist 'torch==2.14.* ; ;' is not a requirement"),
    (None, {**_GOOD_INFO, "sm_targets": [90]}, _GOOD_METADATA,
     "build info: not an SM target: 90"),
    (None, {**_GOOD_INFO, "sm_targets": "sm90"}, _GOOD_METADATA,
     "build info: sm_targets must be a list"),
    (None, {**_GOOD_INFO, "torch": "banana"}, _GOOD_METADATA,
     "build info: torch version must look like"),
    (None, {**_GOOD_INFO, "families": ["nope"]}, _GOOD_METADATA,
     "build info families ['nope'] != ['sm80', 'sm89', 'sm90', 'sm90_fp8']"),
])
def test_check_names_a_malformed_build_info_or_metadata_without_a_traceback(
        tmp_path, capsys, name, info, metadata, words):
    import zipfile

    from scripts.factory import cli
    from scripts.factory.errors import WheelCheckError

    wheel = tmp_path / (name or "sageattention-2.2.0+sm90.torch2.14cu130-cp311-cp311-"
                                "linux_x86_64.whl")
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sageattention/_build_info.json", json.dumps(info))
        zf.writestr("sageattention-2.2.0+sm90.torch2.14cu130.dist-info/METADATA", metadata)
        for m in _GOOD_INFO["families"]:
            zf.writestr(f"sageattention/_kernels_{m}.cpython-311-x86_64-linux-gnu.so", b"")
    assert cli.main(["check", str(wheel)]) == WheelCheckError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err


@pytest.mark.parametrize("argv, codes", [
    ([], [0, 2, 3, 4, 5, 6]), (["plan"], [0, 2, 3, 4]), (["build"], [0, 2, 3, 4, 5, 6]),
    (["check"], [0, 2, 6]), (["matrix"], [0, 2]),
])
def test_factory_help_states_its_exit_codes(capsys, argv, codes):
    # The statuses of errors.py (3 plan, 4 toolchain, 5 build, 6 check) were documented nowhere.
    from scripts.factory import cli

    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    listed = re.search(r"exit codes: (.*)", text)
    assert listed, text
    assert [int(c) for c in re.findall(r"(?:^|; )(\d) ", listed.group(1))] == codes


@pytest.mark.parametrize("sm, words", [
    ("sm80+PTX", "'sm80+PTX': --sm selects every cell of an SM; whether a cell embeds PTX is set "
                 "in build_matrix.yaml (write 'sm80')"),
    ("sm_80", "not an SM: 'sm_80'; write e.g. 'sm80'"),
    ("80", "not an SM: '80'"),
])
def test_plan_and_build_refuse_an_sm_they_cannot_select_by(capsys, sm, words):
    # 'sm80+PTX' planned every sm80 cell, the +PTX dropped silently; a malformed SM was exit 3
    from scripts.factory import cli

    for command in ("plan", "build"):
        with pytest.raises(SystemExit) as exc:
            cli.main([command, "--sm", sm])
        assert exc.value.code == 2
        assert f"argument --sm: {words}" in capsys.readouterr().err


def test_plan_help_states_what_plan_and_build_do_when_every_cell_is_skipped(tmp_path, capsys):
    # plan's --help listed "3 ... nothing buildable", but a plan that skips every cell exits 0;
    # only build exits 3 for it.
    from scripts.factory import cli

    other_os = "linux" if sys.platform == "win32" else "windows"  # a cell this host skips
    matrix = tmp_path / "m.yaml"
    matrix.write_text(f'version: 1\nrunners:\n  build: {{{other_os}: [elsewhere]}}\n'
                      f'cells:\n  - name: w\n    os: {other_os}\n    python: "3.12"\n'
                      '    torch: "2.12.0"\n    cuda: "13.0"\n    sm: [sm75]\n')
    cell = f"{other_os}-cp312-torch2.12-cu130-sm75"
    assert cli.main(["plan", "--cell", cell, "--matrix", str(matrix)]) == 0
    assert f"SKIP  {cell}: cell is for {other_os}" in capsys.readouterr().out
    assert cli.main(["build", "--cell", cell, "--matrix", str(matrix), "--out",
                     str(tmp_path / "w")]) == 3
    assert "nothing to build on this host" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "3 the request cannot be planned (unknown SM or cell);" in text
    assert "A plan that skips every cell is printed and exits 0 (build then exits 3)" in text


def test_factory_help_names_the_commands_of_the_other_halves(capsys):
    # `python -m scripts.factory validate` is an invalid choice: the help says where it lives.
    import importlib

    from scripts.factory import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in ("validate", "notes", "chart", "release", "index"):
        assert f"python -m scripts.factory.{name}" in text
        assert callable(importlib.import_module(f"scripts.factory.{name}").main)
