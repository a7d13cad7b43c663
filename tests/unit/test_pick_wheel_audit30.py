"""scripts/pick_wheel.py, audited as a user meets it: which wheel of several that fit it names,
what it says of a machine with several GPUs, manifests an edited or foreign tool could write,
wheel names pip would refuse, and the interpreter (not the hardware) deciding the platform."""

from __future__ import annotations

import copy
import json

import pytest
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from picker_module import pick_wheel as pw
from test_picker_audit import RELEASE, SM80, SM89, SM90, env, gpus, pick, target, wheel


def _sm90(tag: str, **extra) -> dict:
    return wheel("sm90.torch2.11cu130", [target("sm90", "9.0", False)], tag=tag, **extra)


# ---------------------------------------------------------------- which of several fitting wheels


def test_two_gpus_caution_names_the_wheel_that_is_best_for_the_other_gpu():
    # 7.5 + 8.9: the sm75 wheel serves both (8.9 as PTX). The caution named the sm80 wheel (first
    # by file name) as the one that runs natively on the 8.9 GPU, but the sm89 wheel has that
    # GPU's own SASS and is what the picker chooses with CUDA_VISIBLE_DEVICES=1.
    verdict = pick(RELEASE, gpus=gpus("7.5", "8.9"))
    alone = pick(RELEASE, gpus=gpus("8.9"))
    assert alone.wheel is SM89
    [caution] = [c for c in verdict.cautions if "CUDA_VISIBLE_DEVICES=1" in c]
    assert SM89["filename"] in caution and SM80["filename"] not in caution


def test_two_gpus_no_one_wheel_serves_are_told_which_gpu_each_wheel_serves():
    # 6.1 + 9.0: it said "your GPU ... 6.1; ... 9.0 is not supported by any wheel", while listing
    # 9.0 as supported, and its advice spoke only of the 6.1 GPU
    verdict = pick(RELEASE, gpus=gpus("6.1", "9.0"))
    assert verdict.wheel is None
    assert "is not supported" not in verdict.reason
    assert "one wheel must serve every GPU" in verdict.reason
    assert "GPU 0 GPU cc6.1 (compute capability 6.1): no wheel serves it" in verdict.reason
    assert (f"GPU 1 GPU cc9.0 (compute capability 9.0): {SM90['filename']} serves it"
            in verdict.reason)
    assert verdict.todo[0] == ("to use only GPU 1 (GPU cc9.0), run this again with "
                               "CUDA_VISIBLE_DEVICES=1")
    assert verdict.todo[1].startswith("no wheel of this release runs on compute capability 6.1")
    assert pick(RELEASE, gpus=gpus("9.0")).wheel is SM90  # what that advice leads to


@pytest.mark.parametrize("glibc, tags, expected", [
    # an auditwheel-repaired manylinux wheel before the unrepaired linux_* one (pip's order)
    ("2.35", ["cp312-cp312-linux_x86_64", "cp312-cp312-manylinux_2_28_x86_64"],
     "cp312-cp312-manylinux_2_28_x86_64"),
    # the newest manylinux the host's glibc runs, as pip prefers it
    ("2.35", ["cp312-cp312-manylinux_2_17_x86_64", "cp312-cp312-manylinux_2_28_x86_64"],
     "cp312-cp312-manylinux_2_28_x86_64"),
    ("2.27", ["cp312-cp312-manylinux_2_17_x86_64", "cp312-cp312-manylinux_2_28_x86_64"],
     "cp312-cp312-manylinux_2_17_x86_64"),
    ("2.35", ["cp312-cp312-manylinux_2_5_x86_64", "cp312-cp312-manylinux2014_x86_64"],
     "cp312-cp312-manylinux2014_x86_64"),
    # the interpreter's own ABI before abi3
    ("2.35", ["cp312-abi3-manylinux_2_28_x86_64", "cp312-cp312-manylinux_2_28_x86_64"],
     "cp312-cp312-manylinux_2_28_x86_64"),
])
def test_of_wheels_that_differ_only_by_tag_the_one_pip_prefers_is_named(glibc, tags, expected):
    for order in (tags, tags[::-1]):
        wheels = [_sm90(t) for t in order]
        assert pick({**RELEASE, "wheels": wheels}, glibc=glibc).wheel["tags"] == [expected]


def test_tags_are_matched_in_any_case_as_packaging_reads_them():
    # the manifest's check lowercases a wheel's tags, the matching did not: a wheel whose name
    # says LINUX_X86_64 (pip installs it) was "no wheel for linux x86_64"
    name = "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-LINUX_X86_64.whl"
    assert {str(t) for t in parse_wheel_filename(name)[3]} == {"cp312-cp312-linux_x86_64"}
    entry = {**_sm90("cp312-cp312-linux_x86_64"), "filename": name, "url": name,
             "tags": ["cp312-cp312-LINUX_X86_64"]}
    assert pick({**RELEASE, "wheels": [entry]}).wheel is entry


# ---------------------------------------------------------------- manifests: exit 2, no traceback


def _main(tmp_path, manifest: dict, capsys, **changes) -> tuple[int, str]:
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "env.json").write_text(json.dumps(env(**changes)))
    rc = pw.main(["--manifest", str(tmp_path / "manifest.json"),
                  "--env-json", str(tmp_path / "env.json")])
    return rc, capsys.readouterr().err


def _edit(change) -> dict:
    manifest = copy.deepcopy(RELEASE)
    change(manifest)
    return manifest


@pytest.mark.parametrize("change, words", [
    (lambda m: m.update(refused=5), "'refused' must be a list"),
    (lambda m: m.update(refused=[{"filename": ["a.whl"]}]), "'refused' must be a list"),
    (lambda m: m.update(refused={"filename": "a.whl"}), "'refused' must be a list"),
    (lambda m: m.update(index={"url": 5}), "index.url must be a URL"),
    (lambda m: m["wheels"][3].update(index=5), "wheels[3].index must be a path"),
])
def test_a_manifest_field_of_the_wrong_type_is_bad_input_not_a_traceback(
        tmp_path, capsys, change, words):
    rc, err = _main(tmp_path, _edit(change), capsys)
    assert rc == pw.EXIT_BAD_INPUT and words in err


def test_a_wheel_listed_twice_with_two_stories_is_refused(tmp_path, capsys):
    # the same file twice, once yanked: the picker offered it anyway (the other entry)
    manifest = _edit(lambda m: m["wheels"].append({**m["wheels"][3], "yanked": "broken"}))
    rc, err = _main(tmp_path, manifest, capsys)
    assert rc == pw.EXIT_BAD_INPUT
    assert "wheels[3] and wheels[4] are both" in err and RELEASE["wheels"][3]["filename"] in err
    # the same entry twice is only redundant
    twice = _edit(lambda m: m["wheels"].append(copy.deepcopy(m["wheels"][3])))
    assert _main(tmp_path, twice, capsys)[0] == pw.EXIT_FOUND


VERSIONS = ["2.2.0", "2.2.0+sm75.torch2.12cu130", "v2.2", "2.2.0rc1", "2.2.0.post1.dev2",
            "1!2.2+local", "2.2.0_1", "2.2.0+", "foo", "2.2.0+sm75_x", "2.2.0+a..b", "2.2.0.",
            "2.2.0RC1", "2.2.0.r1", "2.2.0dev", "2.2.0+SM75", "2.2.0++x", "２.2.0"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_wheel_name_whose_version_packaging_refuses_is_bad_input(version):
    # the picker read any text between the dashes as the version, so it offered wheels pip refuses
    # to install (Invalid wheel filename) and printed pins such as sageattention==2.2.0+
    name = f"sageattention-{version}-cp312-cp312-linux_x86_64.whl"
    try:
        Version(version)
        parse_wheel_filename(name)
    except (InvalidVersion, InvalidWheelFilename):
        with pytest.raises(pw.BadInput, match="is not a version"):
            pw.parse_wheel_name(name)
    else:
        assert pw.parse_wheel_name(name).version == version


# ---------------------------------------------------------------- the interpreter, not the hardware


@pytest.mark.parametrize("sysconfig_platform, machine, arch, fits", [
    ("win32", "AMD64", "x86", None),  # 32-bit Python on 64-bit Windows
    ("win-amd64", "ARM64", "x86_64", "win_amd64"),  # x64 Python emulated on Windows on Arm
    ("win-arm64", "ARM64", "aarch64", "win_arm64"),
    ("win-amd64", "AMD64", "x86_64", "win_amd64"),
])
def test_windows_wheels_follow_the_interpreters_build(
        monkeypatch, sysconfig_platform, machine, arch, fits):
    monkeypatch.setattr(pw.sys, "platform", "win32")
    monkeypatch.setattr(pw.platform, "machine", lambda: machine)
    monkeypatch.setattr(pw.sysconfig, "get_platform", lambda: sysconfig_platform)
    m = pw.detect_machine(use_torch=False)
    assert m.arch == arch
    fitting = [p for p in ("win_amd64", "win_arm64", "win32") if pw.platform_fits(p, m)]
    assert fitting == ([fits] if fits else ["win32"])


def test_a_windows_arch_without_a_wheel_tag_fits_nothing_instead_of_a_traceback():
    m = pw.Machine(os="windows", arch="", python=(3, 12))  # platform.machine() may say ''
    assert not pw.platform_fits("win_amd64", m)
    verdict = pw.choose({**RELEASE, "wheels": [_sm90("cp312-cp312-win_amd64")]}, m)
    assert verdict.wheel is None and "no wheel for windows" in verdict.reason


def test_a_32_bit_python_on_a_64_bit_linux_gets_no_64_bit_wheel(monkeypatch):
    monkeypatch.setattr(pw.sys, "platform", "linux")
    monkeypatch.setattr(pw.sys, "maxsize", 2**31 - 1)
    monkeypatch.setattr(pw.platform, "machine", lambda: "x86_64")
    m = pw.detect_machine(use_torch=False)
    assert not pw.platform_fits("manylinux_2_28_x86_64", m)
    assert not pw.platform_fits("linux_x86_64", m)


# ---------------------------------------------------------------- --manifest: what a user passes


def test_a_release_folder_as_manifest_names_the_file_to_give(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text(json.dumps(RELEASE))
    rc = pw.main(["--manifest", str(tmp_path), "--env-json", str(tmp_path / "manifest.json")])
    err = capsys.readouterr().err
    assert rc == pw.EXIT_BAD_INPUT
    assert "is a folder" in err and str(tmp_path / "manifest.json") in err


def test_a_web_page_as_manifest_is_said_to_be_one(tmp_path, capsys):
    # the release page or a PEP 503 index, passed instead of the manifest.json asset
    page = tmp_path / "index.html"
    page.write_text("<!DOCTYPE html>\n<html><body><a href='x.whl'>x.whl</a></body></html>\n")
    (tmp_path / "env.json").write_text(json.dumps(env()))
    rc = pw.main(["--manifest", str(page), "--env-json", str(tmp_path / "env.json")])
    err = capsys.readouterr().err
    assert rc == pw.EXIT_BAD_INPUT
    assert "is a web page (HTML), not a release's manifest.json" in err


@pytest.mark.parametrize("base, expected", [
    ("file:///srv/rel/manifest.json", "/srv/rel/"),
    ("file://localhost/srv/rel/manifest.json", "/srv/rel/"),
    # a manifest on a Windows share (Path.as_uri of \\\\server\\share\\rel\\manifest.json): the
    # wheel's path lost the server and named /share/rel/... on this machine
    ("file://server/share/rel/manifest.json", "//server/share/rel/"),
])
def test_a_local_wheel_path_keeps_the_manifests_host(base, expected):
    from urllib.request import url2pathname

    name = "sageattention-2.2.0+sm90.torch2.11cu130-cp312-cp312-linux_x86_64.whl"
    assert pw._resolve(base, name) == url2pathname(expected + name)
