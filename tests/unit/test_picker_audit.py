"""scripts/pick_wheel.py as a demanding user meets it: the release's real wheel set, torch and CUDA
versions judged by the runtime guard's rule, GPU execution judged by the release's rule, build
tags, wheels that must never be offered, malformed manifests, and what to do when none fits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[2]
from picker_module import PICKER  # noqa: E402
from picker_module import pick_wheel as pw  # noqa: E402


def target(name: str, cc: str, ptx: bool, serves=None, arch_specific=False) -> dict:
    return {"name": name, "cc": cc, "sass": True, "ptx": ptx, "arch_specific": arch_specific,
            "ptx_serves": serves}


def wheel(label: str, targets: list[dict], tag: str = "cp312-cp312-linux_x86_64",
          cuda: str = "13.0", torch: str = "2.11.0+cu130", build: str | None = None,
          **extra) -> dict:
    filename = f"sageattention-2.2.0+{label}-{build + '-' if build else ''}{tag}.whl"
    entry = {
        "filename": filename, "url": filename, "sha256": "a" * 64, "version": f"2.2.0+{label}",
        "local_label": label, "tags": [tag], "torch": torch, "cuda": cuda,
        "gpu_targets": targets, "index": f"simple/{label}/",
        "validation": {"status": "passed", "gpu_name": "NVIDIA H200",
                       "compute_capability": "9.0", "execution": "ptx-jit", "checks_passed": 20},
    }
    entry.update(extra)
    return entry


# The four wheels of release_notes/ (torch 2.11.0+cu130, cp312, linux_x86_64), their targets as
# release.py writes them from their build info (ptx_serves from the families they carry).
SM75 = wheel("sm75.torch2.11cu130", [target("sm75+PTX", "7.5", True)])
SM80 = wheel("sm80.torch2.11cu130",
             [target("sm80+PTX", "8.0", True, ["8.0", "8.6", "8.7", "8.9", "9.0"])])
SM89 = wheel("sm89.torch2.11cu130", [target("sm89+PTX", "8.9", True, ["8.9", "9.0"])])
SM90 = wheel("sm90.torch2.11cu130", [target("sm90", "9.0", False)])
RELEASE = {"schema_version": 1, "project": "sageattention", "version": "2.2.0",
           "index": {}, "wheels": [SM75, SM80, SM89, SM90], "refused": []}


def env(**changes) -> dict:
    data = {"os": "linux", "arch": "x86_64", "python": "3.12", "glibc": "2.35",
            "torch": "2.11.0+cu130", "torch_cuda": "13.0",
            "gpus": [{"name": "NVIDIA H100", "compute_capability": "9.0"}]}
    data.update(changes)
    return {k: v for k, v in data.items() if v is not ...}


def gpus(*ccs: str) -> list[dict]:
    return [{"name": f"GPU cc{cc}", "compute_capability": cc} for cc in ccs]


def pick(manifest: dict, **changes) -> pw.Verdict:
    pw.validate_manifest(manifest)
    return pw.choose(manifest, pw.machine_from_json(env(**changes)))


# ---------------------------------------------------------------- GPUs against the real release


@pytest.mark.parametrize("cc, expected, runs", [
    ("7.5", SM75, "native sm75+PTX"),
    ("8.0", SM80, "native sm80+PTX"),
    ("8.6", SM80, "native sm80+PTX"),  # the sm80 family serves 8.x: sm_80 SASS runs on 8.6
    ("8.7", SM80, "native sm80+PTX"),
    ("8.9", SM89, "native sm89+PTX"),  # its own SASS beats sm_80's
    ("9.0", SM90, "native sm90"),
    ("10.0", SM75, "sm75+PTX PTX"),  # only compute_75 reaches Blackwell (sm80/sm89: up to 9.0)
    ("12.0", SM75, "sm75+PTX PTX"),
])
def test_each_gpu_gets_its_family_from_the_real_release(cc, expected, runs):
    verdict = pick(RELEASE, gpus=gpus(cc))
    assert verdict.wheel["filename"] == expected["filename"], verdict.reason
    assert runs in verdict.execution


def test_a_gpu_older_than_every_target_is_told_no_build_helps():
    verdict = pick(RELEASE, gpus=gpus("7.0"))
    assert verdict.wheel is None
    assert "GPU cc7.0 (compute capability 7.0) is not supported" in verdict.reason
    assert verdict.todo[0] == ("no wheel of this release runs on compute capability 7.0: its "
                               "oldest target is 7.5")
    assert verdict.todo[1].startswith("or build from source against your torch: ")
    assert verdict.todo[1].endswith("use PyTorch's scaled_dot_product_attention")


def test_a_gpu_no_wheel_serves_gets_the_source_build_command():
    # Without the sm75 wheel nothing reaches Blackwell: compute_80 runs only where the sm80
    # family serves (up to 9.0).
    without_turing = {**RELEASE, "wheels": [SM80, SM89, SM90]}
    verdict = pick(without_turing, gpus=gpus("12.0"))
    assert verdict.wheel is None and verdict.nearest == [SM80, SM89, SM90]
    assert verdict.todo == [
        "build from source against your torch: python -m pip install --no-build-isolation "
        "sageattention-2.2.0.tar.gz (the sdist; it compiles for the GPUs it sees, and stops "
        "naming what is missing; README.md, 'Installing from source')"]


def test_two_gpus_get_the_wheel_that_serves_both_and_are_told_the_tradeoff():
    verdict = pick(RELEASE, gpus=gpus("7.5", "9.0"))
    assert verdict.wheel is SM75
    assert verdict.execution == ("GPU 0: native sm75+PTX code; GPU 1: sm75+PTX PTX compiled by "
                                 "the driver (JIT) on first use")
    (caution,) = verdict.cautions
    assert caution.startswith("GPU 1 (GPU cc9.0) runs this wheel as PTX, because one wheel must "
                              f"serve every GPU; {SM90['filename']} runs natively there")
    assert "CUDA_VISIBLE_DEVICES=1" in caution
    # Both served natively by one wheel: nothing to say.
    assert pick(RELEASE, gpus=gpus("8.6", "8.0")).cautions == []


def test_two_gpus_no_one_wheel_serves_say_so():
    verdict = pick({**RELEASE, "wheels": [SM90, SM89]}, gpus=gpus("7.5", "9.0"))
    assert verdict.wheel is None
    assert "one wheel must serve every GPU" in verdict.reason


def test_gpu_execution_agrees_with_the_release_rule():
    """The picker's copy of the SASS/PTX rule answers as release.GpuTarget.runs_on (the rule the
    release, guard and validation suite share) for every target kind and GPU."""
    from scripts.factory.release import GpuTarget

    targets = [
        GpuTarget("sm75+PTX", (7, 5), True, False, None),
        GpuTarget("sm80+PTX", (8, 0), True, False, ((8, 0), (8, 6), (8, 7), (8, 9), (9, 0))),
        GpuTarget("sm86", (8, 6), False, False),
        GpuTarget("sm89+PTX", (8, 9), True, False, ((8, 9), (9, 0))),
        GpuTarget("sm90", (9, 0), False, False),
        GpuTarget("sm_90a", (9, 0), False, True),
        GpuTarget("sm100", (10, 0), False, False),
    ]
    ccs = [(6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (9, 1), (10, 0),
           (10, 3), (12, 0), (12, 1)]
    for t in targets:
        entry = {"gpu_targets": [t.as_json()]}
        for cc in ccs:
            ours = pw.gpu_execution(entry, cc)
            kind = None if ours is None else "native" if ours[1].startswith("native") else "ptx-jit"
            assert kind == t.runs_on(cc), (t.name, cc)


# ---------------------------------------------------------------- torch and CUDA: the guard's rule


@pytest.mark.parametrize("torch, torch_cuda", [
    ("2.11.0+cu130", "13.0"), ("2.11.1", "13.0"), ("2.11.1+cu130", "13.0"),
    ("2.11.0a0+gitabc", "13.0"), ("2.11.0+cu131", "13.1"), ("2.11.0+cu128", "12.8"),
    ("2.11.0+cu129", "12.9"), ("2.12.0+cu130", "13.0"), ("2.10.2+cu130", "13.0"),
    ("2.11.0+cpu", None), ("2.11.0+rocm6.2", None),
])
@pytest.mark.parametrize("wheel_cuda", ["13.0", "12.8"])
def test_torch_and_cuda_fit_exactly_where_the_runtime_guard_lets_the_wheel_load(
        torch, torch_cuda, wheel_cuda):
    # It required torch's CUDA major.minor to equal the wheel's, while the guard (and CUDA's
    # minor-version compatibility) loads a cu130 wheel under a cu131 torch: no wheel was offered.
    from sageattention import guard

    cu = wheel_cuda.replace(".", "")
    entry = wheel(f"sm90.torch2.11cu{cu}", [target("sm90", "9.0", False)], cuda=wheel_cuda,
                  torch=f"2.11.0+cu{cu}")
    info = {"version": entry["version"], "local_label": entry["local_label"],
            "sm_targets": ["sm90"], "ptx": [], "families": ["sm90"], "torch": entry["torch"],
            "cuda": wheel_cuda, "platform": "linux_x86_64"}
    loads = guard.import_problem(info, torch, torch_cuda) is None
    verdict = pick({**RELEASE, "wheels": [entry]}, torch=torch, torch_cuda=torch_cuda)
    assert (verdict.wheel is entry) == loads, (verdict.reason, loads)


def test_the_exact_cuda_wins_and_a_minor_mismatch_is_said():
    cu131 = wheel("sm90.torch2.11cu131", [target("sm90", "9.0", False)], cuda="13.1",
                  torch="2.11.0+cu131")
    both = {**RELEASE, "wheels": [SM90, cu131]}
    assert pick(both, torch="2.11.0+cu131", torch_cuda="13.1").wheel is cu131
    exact = pick(both)
    assert exact.wheel is SM90 and exact.cautions == []
    only_130 = pick(RELEASE, torch="2.11.0+cu131", torch_cuda="13.1")
    assert only_130.wheel is SM90
    (caution,) = only_130.cautions
    assert caution.startswith("this wheel is built with CUDA 13.0 and your torch with CUDA 13.1: "
                              "the same major version")


def test_cuda_of_another_major_says_what_to_install():
    verdict = pick(RELEASE, torch="2.11.0+cu128", torch_cuda="12.8")
    assert verdict.wheel is None
    assert ("your torch is built with CUDA 12.8; the wheels for it need a torch built with CUDA "
            "13.0 (the same CUDA major version)") in verdict.reason
    assert verdict.todo[0] == ("install a CUDA build of torch that these wheels are for: "
                               'python -m pip install "torch==2.11.*" --index-url '
                               "https://download.pytorch.org/whl/cu130")
    assert "with a CUDA toolkit of your torch's major version, 12.x" in verdict.todo[1]
    cpu = pick(RELEASE, torch="2.11.0+cpu", torch_cuda=None)
    assert "CPU-only build" in cpu.reason and len(cpu.todo) == 1
    assert "download.pytorch.org/whl/cu130" in cpu.todo[0]


def test_another_torch_and_no_torch_say_what_to_do():
    other = pick(RELEASE, torch="2.12.0+cu130")
    assert other.reason == "your torch is 2.12; wheels for linux/cp312 exist for torch 2.11"
    assert other.nearest[0] is SM90  # the one for this GPU first (it was file-name order)
    assert other.todo[0].endswith('python -m pip install "torch==2.11.*" --index-url '
                                  "https://download.pytorch.org/whl/cu130")
    assert other.todo[1].startswith("or build from source against your torch: ")
    missing = pick(RELEASE, torch=None, torch_cuda=None)
    assert missing.todo == ['install torch, for example: python -m pip install "torch==2.11.*" '
                            "--index-url https://download.pytorch.org/whl/cu130; then run this "
                            "again"]


# ---------------------------------------------------------------- Python and platform


def test_a_free_threaded_python_is_named_as_such():
    # It said "no wheel for CPython 3.12 on linux; wheels exist for cp312": a contradiction.
    verdict = pick(RELEASE, python="3.12", free_threaded=True)
    assert verdict.reason == ("no wheel for CPython 3.12t (free-threaded) on linux; wheels exist "
                              "for cp312")
    ft = wheel("sm90.torch2.11cu130", [target("sm90", "9.0", False)],
               tag="cp313-cp313t-linux_x86_64")
    verdict = pick({**RELEASE, "wheels": [ft]}, python="3.13")
    assert verdict.reason == "no wheel for CPython 3.13 on linux; wheels exist for cp313t"
    assert pick({**RELEASE, "wheels": [ft]}, python="3.13t").wheel is ft
    assert pick({**RELEASE, "wheels": [ft]}, python="3.14t").wheel is None


def test_a_manylinux_wheel_newer_than_the_hosts_glibc_is_never_picked():
    new = wheel("sm90.torch2.11cu130", [target("sm90", "9.0", False)],
                tag="cp312-cp312-manylinux_2_39_x86_64")
    manifest = {**RELEASE, "wheels": [new]}
    old = pick(manifest, glibc="2.35")
    assert old.wheel is None
    assert old.reason == ("no wheel for linux x86_64 (glibc 2.35); wheels exist for: "
                          "manylinux_2_39_x86_64")
    assert pick(manifest, glibc="2.39").wheel is new
    unknown = pick(manifest, glibc=...)  # the C library could not be told
    assert unknown.wheel is new
    assert unknown.cautions == ["this machine's C library is unknown; this wheel needs glibc 2.39 "
                                "or newer (ldd --version shows yours)"]


def test_macos_is_told_no_build_helps():
    verdict = pick(RELEASE, os="macos", arch="arm64", glibc=...)
    assert verdict.wheel is None
    assert verdict.todo == ["sageattention's kernels need an NVIDIA GPU under Linux or Windows"]


# ---------------------------------------------------------------- what may be offered


@pytest.mark.parametrize("change, why", [
    ({"validation": {"status": "failed"}}, "validation status 'failed', not 'passed'"),
    ({"validation": None}, "not validated (no validation record)"),
    ({"validation": {"gpu_name": "H200"}}, "not validated (no validation record)"),
    ({"yanked": True}, "yanked"),
    ({"yanked": "wrong results on sm90"}, "yanked (wrong results on sm90)"),
])
def test_an_unvalidated_or_yanked_wheel_is_never_offered(change, why):
    # They were offered like any other: the picker never looked at validation.
    bad = {**SM90, **change}
    verdict = pick({**RELEASE, "wheels": [bad]})
    assert verdict.wheel is None
    assert f"{SM90['filename']} would fit, but is not offered: {why}" in verdict.reason
    # Beside others, the next best published wheel is picked and the held-back one named.
    verdict = pick({**RELEASE, "wheels": [SM75, SM80, SM89, bad]})
    assert verdict.wheel is SM89
    assert f"{SM90['filename']} would also fit, but is not offered: {why}" in verdict.cautions


def test_a_wheel_listed_as_refused_is_never_offered():
    manifest = {**RELEASE, "refused": [{"filename": SM90["filename"], "reasons": ["failed"]}]}
    verdict = pick(manifest)
    assert verdict.wheel is SM89
    assert any("listed under 'refused'" in c for c in verdict.cautions)


def test_the_highest_build_tag_wins():
    # The file name broke the tie, so build 1 beat build 2, and no build tag beat both.
    builds = [wheel("sm90.torch2.11cu130", [target("sm90", "9.0", False)], build=b)
              for b in (None, "1", "2", "10")]
    for b in builds:
        b["tags"] = ["cp312-cp312-linux_x86_64"]
    verdict = pick({**RELEASE, "wheels": builds})
    assert verdict.wheel is builds[3]


def test_an_empty_manifest_says_so(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({**RELEASE, "wheels": []}))
    (tmp_path / "env.json").write_text(json.dumps(env()))
    res = subprocess.run([sys.executable, str(PICKER), "--manifest", str(path), "--env-json",
                          str(tmp_path / "env.json")], capture_output=True, text=True, timeout=60)
    assert res.returncode == pw.EXIT_NONE_FITS
    assert "No wheel fits: the manifest lists no wheels" in res.stdout


# ---------------------------------------------------------------- malformed manifests


@pytest.mark.parametrize("change, words", [
    ({"tags": ["a-b-c"]}, "wheels[0] says tags ['a-b-c'], but its file name"),
    ({"tags": ["cp311-cp311-linux_x86_64"]}, "says ['cp312-cp312-linux_x86_64']"),
    ({"tags": ["cp312-cp312-linux_x86_64.manylinux_2_28_x86_64"]}, "expanded 'python-abi-platform'"),
    ({"tags": []}, "expanded 'python-abi-platform'"),
    ({"filename": "foo.whl"}, "'foo.whl' is not a wheel file name"),
    ({"filename": "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.zip"},
     "is not a wheel file name (no .whl)"),
    ({"filename": "other-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.whl",
      "url": "other.whl"}, "says project 'sageattention', but its file name"),
    ({"filename": "sageattention-2.2.0+sm90.torch2.11cu130-x1-cp312-cp312-linux_x86_64.whl"},
     "build tag 'x1' must start with a digit"),
    ({"version": "2.2.0+sm90.torch2.12cu130"}, "says version '2.2.0+sm90.torch2.12cu130'"),
    ({"local_label": "sm89.torch2.11cu130"}, "says local_label 'sm89.torch2.11cu130'"),
    ({"sha256": "xyz"}, "sha256 must be 64 lowercase hex digits"),
    ({"url": ""}, "wheels[0].url must be a non-empty string"),  # it resolved to manifest.json
    ({"gpu_targets": []}, "gpu_targets must be a non-empty list"),
    ({"torch": None}, "wheels[0].torch must be a version such as '2.11.0+cu130', got None"),
    ({"cuda": "cu130"}, "wheels[0].cuda must be a version such as '13.0', got 'cu130'"),
    ({"yanked": 1}, "yanked must be true, false or a reason"),
])
def test_a_malformed_entry_is_refused_naming_the_field(change, words):
    with pytest.raises(pw.BadInput, match=None) as caught:
        pw.validate_manifest({**RELEASE, "wheels": [{**SM90, **change}]})
    assert words in str(caught.value)


def test_a_manifest_of_several_versions_is_refused():
    later = {**SM75, "filename": SM75["filename"].replace("2.2.0", "2.3.0"),
             "version": SM75["version"].replace("2.2.0", "2.3.0")}
    with pytest.raises(pw.BadInput, match=r"wheels of several versions \['2.2.0', '2.3.0'\]"):
        pw.validate_manifest({**RELEASE, "wheels": [SM90, later]})


NAMES = [
    "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.whl",
    "sageattention-2.2.0+sm80.sm90.torch2.14cu130-1-cp311-cp311-manylinux_2_28_x86_64.whl",
    "sageattention-2.2.0+sm75.torch2.12cu130-12abc-cp312-cp312-win_amd64.whl",
    "sageattention-2.2.0-cp312.cp313-abi3-manylinux_2_28_x86_64.manylinux2014_x86_64.whl",
    "SageAttention-2.2.0-cp313-cp313t-musllinux_1_2_aarch64.whl",
    "sage_attention-2.2.0-py3-none-any.whl",
    "sageattention-2.2.0-cp312-cp312-linux_x86_64.zip",
    "sageattention-2.2.0-x1-cp312-cp312-linux_x86_64.whl",
    "sageattention-2.2.0-cp312-cp312.whl",
    "sageattention-2.2.0-1-2-cp312-cp312-linux_x86_64.whl",
    "-2.2.0-cp312-cp312-linux_x86_64.whl",
]


@pytest.mark.parametrize("name", NAMES)
def test_wheel_names_are_read_as_packaging_reads_them(name):
    """The picker is standard-library only, so it carries its own wheel-name reader; packaging is
    the rule, and this holds the two together."""
    try:
        project, version, build, tags = parse_wheel_filename(name)
    except InvalidWheelFilename:
        with pytest.raises(pw.BadInput):
            pw.parse_wheel_name(name)
        return
    ours = pw.parse_wheel_name(name)
    assert ours.project == project
    assert ours.version == name.split("-")[1] and str(version) == str(
        __import__("packaging.version").version.Version(ours.version))
    assert ours.build == tuple(build)
    assert ours.tags == frozenset(str(t) for t in tags)


# ---------------------------------------------------------------- CLI: the advice is printed


def test_cli_prints_what_to_do_in_text_and_json(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(RELEASE))
    (tmp_path / "env.json").write_text(json.dumps(env(torch="2.12.0+cu130")))
    argv = [sys.executable, str(PICKER), "--manifest", str(tmp_path / "manifest.json"),
            "--env-json", str(tmp_path / "env.json")]
    text = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert text.returncode == pw.EXIT_NONE_FITS
    assert "\nWhat to do:\n  install a torch these wheels are for" in text.stdout
    answer = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True,
                                       timeout=60).stdout)
    assert answer["what_to_do"][1].startswith("or build from source against your torch")
