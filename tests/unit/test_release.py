"""Release assembly (scripts/factory/release.py) and the PEP 503 index (scripts/factory/index.py).

Driven by the stored fixtures in tests/unit/fixtures/release/ (one passing wheel, one failing, one
whose report's sha256 does not match, one never validated) and by wheels built in tmp_path.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.tags import sys_tags

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "release"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(FIXTURES))

import release_fixtures as fx  # noqa: E402

from scripts.factory import index, release  # noqa: E402


def run_release(tmp_path: Path, *extra: str, wheels=None, reports=None) -> tuple[int, Path]:
    out = tmp_path / "release"
    rc = release.main(
        [
            "--wheels",
            str(wheels or FIXTURES / "wheels"),
            "--reports",
            str(reports or FIXTURES / "release_notes"),
            "--out",
            str(out),
            *extra,
        ]
    )
    return rc, out


def test_stored_fixtures_are_reproducible(tmp_path):
    fx.generate(tmp_path)
    for sub in ("wheels", "release_notes"):
        stored = sorted(p.name for p in (FIXTURES / sub).iterdir())
        assert stored == sorted(p.name for p in (tmp_path / sub).iterdir())
        match, mismatch, errors = filecmp.cmpfiles(
            FIXTURES / sub, tmp_path / sub, stored, shallow=False
        )
        assert not mismatch and not errors, (
            f"regenerate with release_fixtures.py: {mismatch + errors}"
        )


def test_only_the_passing_wheel_is_published(tmp_path, capsys):
    rc, out = run_release(tmp_path)
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == release.EXIT_REFUSED
    # progress on stderr, one line per wheel before it is hashed and judged
    wheels = sorted(p.name for p in (FIXTURES / "wheels").glob("*.whl"))
    assert [line for line in captured.err.splitlines() if "] checking " in line] == [
        f"[{i}/{len(wheels)}] checking {name}" for i, name in enumerate(wheels, 1)]
    stem = fx.PASSING[: -len(".whl")]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            fx.PASSING,
            f"{stem}.md",
            f"{stem}.speedup.svg",   # the chart the note links
            f"{stem}.report.json",
            "manifest.json",
            "SHA256SUMS",
            "RELEASE_BODY.md",
            "simple",
        ]
    )
    assert f"accepted  {fx.PASSING}" in printed
    for name in (fx.FAILING, fx.SHA_MISMATCH, fx.UNVALIDATED):
        assert f"REFUSED   {name}" in printed

    manifest = json.loads((out / "manifest.json").read_text())
    assert [w["filename"] for w in manifest["wheels"]] == [fx.PASSING]
    refused = {r["filename"]: " ".join(r["reasons"]) for r in manifest["refused"]}
    assert "2 check(s) failed (causal, gqa)" in refused[fx.FAILING]
    assert "differs from the report's" in refused[fx.SHA_MISMATCH]
    assert "no validation report" in refused[fx.UNVALIDATED]


def test_manifest_entry_fields(tmp_path):
    _, out = run_release(tmp_path)
    (entry,) = json.loads((out / "manifest.json").read_text())["wheels"]
    wheel = out / fx.PASSING
    assert entry["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert entry["size"] == wheel.stat().st_size
    assert entry["version"] == "2.2.0+sm90.torch2.14cu130"
    assert entry["local_label"] == "sm90.torch2.14cu130"
    assert entry["cell"] == "fixture-sm90.torch2.14cu130-cp311-manylinux_2_28_x86_64"
    assert entry["tags"] == ["cp311-cp311-manylinux_2_28_x86_64"]
    assert entry["torch"] == "2.14.1" and entry["torch_requirement"] == "==2.14.*"
    assert entry["cuda"] == "13.0"
    assert entry["gpu_targets"] == [
        {"name": "sm90", "cc": "9.0", "sass": True, "ptx": False, "arch_specific": False,
         "ptx_serves": None}
    ]
    assert entry["execution"] == "native"
    v = entry["validation"]
    assert (v["checks_passed"], v["checks_failed"], v["checks_skipped"]) == (7, 0, 1)
    assert v["compute_capability"] == "9.0" and v["gpu_name"] == fx.FIXTURE_GPU
    assert (out / entry["note"]).is_file() and (out / entry["report"]).is_file()
    assert (out / entry["index"] / "sageattention" / "index.html").is_file()


def test_sha256sums_cover_every_published_file(tmp_path):
    _, out = run_release(tmp_path)
    lines = (out / "SHA256SUMS").read_text().splitlines()
    listed = {}
    for line in lines:
        digest, name = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line).groups()
        listed[name] = digest
    files = {p.name for p in out.iterdir() if p.is_file()} - {"SHA256SUMS", "RELEASE_BODY.md"}
    assert set(listed) == files
    for name, digest in listed.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest


def test_index_page_links_the_wheel_with_its_hash(tmp_path):
    _, out = run_release(tmp_path)
    variants = sorted(p.name for p in (out / "simple").iterdir() if p.is_dir())
    assert variants == ["sm90.torch2.14cu130"]
    page = (out / "simple" / "sm90.torch2.14cu130" / "sageattention" / "index.html").read_text()
    links = re.findall(r'<a href="([^"]+)"[^>]*>([^<]+)</a>', page)
    digest = hashlib.sha256((out / fx.PASSING).read_bytes()).hexdigest()
    assert links == [
        (
            f"../../../sageattention-2.2.0%2Bsm90.torch2.14cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
            f"#sha256={digest}",
            fx.PASSING,
        )
    ]
    assert 'data-requires-python="&gt;=3.9"' in page
    root_page = (out / "simple" / "sm90.torch2.14cu130" / "index.html").read_text()
    assert '<a href="sageattention/">sageattention</a>' in root_page


def test_release_body_gathers_notes_and_refusals(tmp_path):
    _, out = run_release(tmp_path)
    body = (out / "RELEASE_BODY.md").read_text()
    assert body.startswith("# sageattention 2.2.0\n")
    stem = fx.PASSING[: -len(".whl")]
    note = (FIXTURES / "release_notes" / f"{stem}.md").read_text(encoding="utf-8")
    assert f"## {fx.PASSING}" in body and note.strip() in body
    assert f"<!-- Generated by scripts/factory/notes.py from {stem}.report.json" in body
    assert "## Not published" in body and fx.SHA_MISMATCH in body
    assert f"## {fx.FAILING}" not in body


def test_allow_partial_exits_zero(tmp_path):
    rc, out = run_release(tmp_path, "--allow-partial")
    assert rc == release.EXIT_OK and (out / "manifest.json").is_file()


def test_nothing_accepted_writes_nothing(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shutil.copy(FIXTURES / "wheels" / fx.FAILING, wheels)
    rc, out = run_release(tmp_path, wheels=wheels)
    assert rc == release.EXIT_NOTHING
    assert not out.exists()


def test_refuses_to_overwrite_a_folder_that_is_not_a_release(tmp_path, capsys):
    out = tmp_path / "release"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    rc, _ = run_release(tmp_path)
    assert rc == release.EXIT_USAGE
    assert (out / "precious.txt").read_text() == "keep me"
    assert "holds no previous release" in capsys.readouterr().err


def test_rerun_replaces_previous_release(tmp_path):
    run_release(tmp_path)
    (tmp_path / "release" / "stale.whl").write_text("old")
    rc, out = run_release(tmp_path, "--allow-partial")
    assert rc == 0 and not (out / "stale.whl").exists()


def test_missing_inputs_are_usage_errors(tmp_path, capsys):
    assert (
        release.main(["--wheels", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
        == release.EXIT_USAGE
    )
    assert "wheel folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert (
        release.main(
            [
                "--wheels",
                str(tmp_path / "empty"),
                "--reports",
                str(tmp_path / "empty"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == release.EXIT_USAGE
    )
    assert "no *.whl" in capsys.readouterr().err


# ---------------------------------------------------------------- refusal rules on built wheels


def _validated(
    tmp_path: Path,
    label: str,
    targets: list[str],
    *,
    tag=fx.LINUX_311,
    base_version=fx.BASE_VERSION,
    note=True,
    **report_kw,
) -> Path:
    wheel = fx.build_wheel(
        tmp_path / "wheels", label, tag, sm_targets=targets, base_version=base_version
    )
    fx.write_report(tmp_path / "reports", wheel, fx.make_report(wheel, **report_kw))
    if note:  # the note python -m scripts.factory.notes generates from that report
        fx.write_note(tmp_path / "reports", wheel)
    return wheel


def test_report_from_a_gpu_the_wheel_cannot_run_on_is_refused(tmp_path):
    # notes refuses such a report too (no note can be generated from it): none is written
    wheel = _validated(tmp_path, "sm75.torch2.14cu130", ["sm75+PTX"], execution="native",
                       note=False)
    verdict = release.judge_wheel(wheel, tmp_path / "reports")
    assert isinstance(verdict, release.Refused)
    assert any("report says native on compute capability 9.0" in r and "runs there ptx-jit" in r
               for r in verdict.reasons), verdict.reasons


def test_ptx_jit_validation_is_accepted_and_recorded(tmp_path):
    wheel = _validated(tmp_path, "sm75.torch2.14cu130", ["sm75+PTX"], execution="ptx-jit")
    verdict = release.judge_wheel(wheel, tmp_path / "reports")
    assert isinstance(verdict, release.Accepted), getattr(verdict, "reasons", None)
    assert release.manifest_entry(verdict, "simple")["execution"] == "ptx-jit"


def test_wheel_without_build_info_is_refused(tmp_path):
    wheel = fx.build_wheel(
        tmp_path / "wheels",
        "sm90.torch2.14cu130",
        fx.LINUX_311,
        sm_targets=["sm90"],
        with_build_info=False,
    )
    verdict = release.judge_wheel(wheel, tmp_path / "reports")
    assert isinstance(verdict, release.Refused)
    assert "not built by the factory" in verdict.reasons[0]


def test_report_for_another_wheel_and_bad_schema_are_refused(tmp_path):
    wheel = _validated(tmp_path, "sm90.torch2.14cu130", ["sm90"])
    report_path = tmp_path / "reports" / (wheel.name[:-4] + ".report.json")
    report = json.loads(report_path.read_text())
    report["wheel"]["filename"] = "other.whl"
    report["schema_version"] = 7
    report["checks"] = [{"name": "a", "status": "skip", "backend": None, "reason": "n/a"}]
    report_path.write_text(json.dumps(report))
    reasons = " | ".join(release.judge_wheel(wheel, tmp_path / "reports").reasons)
    assert "the report is for other.whl" in reasons
    assert "schema_version 7 is not supported" in reasons
    assert "no check passed" in reasons


def test_two_versions_in_one_release_is_an_error(tmp_path):
    a = _validated(tmp_path, "sm90.torch2.14cu130", ["sm90"])
    b = _validated(
        tmp_path, "sm80.torch2.14cu130", ["sm80"], base_version="2.3.0", compute_capability="8.0"
    )
    with pytest.raises(ValueError, match="several versions"):
        release.plan_release([a, b], tmp_path / "reports")


def test_two_accepted_wheels_that_share_a_page_and_tag_are_exit_2_not_a_traceback(
        tmp_path, capsys):
    # A rebuild with a build number beside the first build: both validated and accepted, then the
    # index writer's ValueError ended the release in a traceback.
    first = _validated(tmp_path, "sm90.torch2.14cu130", ["sm90"])
    again = first.with_name(first.name.replace("-cp311-", "-1-cp311-", 1))
    shutil.copy(first, again)
    fx.write_report(tmp_path / "reports", again, fx.make_report(again))
    fx.write_note(tmp_path / "reports", again)
    rc, out = run_release(tmp_path, wheels=tmp_path / "wheels", reports=tmp_path / "reports")
    err = capsys.readouterr().err
    assert rc == release.EXIT_USAGE == 2
    # refused before the index is written: two builds of one cell (the index would refuse them too,
    # as they share the tag cp311-cp311-manylinux_2_28_x86_64)
    assert f"{again.name} and {first.name} are builds of one matrix cell" in err, err
    assert "keep only the one to publish" in err and "nothing written" in err
    assert not out.exists()


def test_absolute_wheel_links_and_index_url_in_manifest(tmp_path):
    rc, out = run_release(
        tmp_path,
        "--allow-partial",
        "--index-base-url",
        "https://github.com/o/r/releases/download/v2.2.0",
        "--index-url",
        "https://o.github.io/r/v2.2.0/simple/",
    )
    assert rc == 0
    page = (out / "simple" / "sm90.torch2.14cu130" / "sageattention" / "index.html").read_text()
    assert (
        'href="https://github.com/o/r/releases/download/v2.2.0/sageattention-2.2.0%2Bsm90' in page
    )
    assert (
        json.loads((out / "manifest.json").read_text())["index"]["url"]
        == "https://o.github.io/r/v2.2.0/simple/"
    )


@pytest.mark.parametrize("option", ["--index-base-url", "--index-url"])
@pytest.mark.parametrize("url", ["notaurl", "github.com/o/r/releases/download/v2.2.0", ""])
def test_a_url_without_scheme_is_refused_before_anything_is_written(tmp_path, capsys, option, url):
    with pytest.raises(SystemExit) as exc:
        release.main(["--out", str(tmp_path / "out"), option, url])
    assert exc.value.code == 2
    assert f"argument {option}: not an absolute URL: {url!r}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        index.main(["--manifest", "m.json", "--out", str(tmp_path / "site"),
                    "--wheel-base-url", url])
    assert "argument --wheel-base-url: not an absolute URL" in capsys.readouterr().err


@pytest.mark.parametrize("which", ["wheels", "reports"])
def test_a_folder_argument_that_is_a_file_says_so(tmp_path, capsys, which):
    a_file = tmp_path / "list.txt"
    a_file.write_text("x")
    rc, _ = run_release(tmp_path, **{which: a_file})
    assert rc == release.EXIT_USAGE
    assert f"{which[:-1]} folder {a_file} is a file, not a folder" in capsys.readouterr().err
    rc, _ = run_release(tmp_path, **{which: tmp_path / "absent"})
    assert "absent does not exist" in capsys.readouterr().err


# ---------------------------------------------------------------- index layout


def test_one_page_never_holds_two_wheels_with_the_same_tags(tmp_path):
    a = fx.build_wheel(tmp_path, "sm80.torch2.12cu130", fx.LINUX_311, sm_targets=["sm80"])
    b = fx.build_wheel(tmp_path, "sm89.torch2.12cu130", fx.LINUX_311, sm_targets=["sm89"])
    c = fx.build_wheel(
        tmp_path, "sm80.torch2.12cu130", "cp312-cp312-win_amd64", sm_targets=["sm80"]
    )
    where = index.write_index(
        tmp_path / "simple",
        "sageattention",
        [index.IndexEntry(p.name, "0" * 64) for p in (a, b, c)],
    )
    assert where == {
        a.name: "sm80.torch2.12cu130",
        b.name: "sm89.torch2.12cu130",
        c.name: "sm80.torch2.12cu130",
    }
    page = (
        tmp_path / "simple" / "sm80.torch2.12cu130" / "sageattention" / "index.html"
    ).read_text()
    assert a.name in page and c.name in page and b.name not in page


def test_index_rejects_same_tags_in_one_variant_and_unlabelled_wheels(tmp_path):
    name = fx.wheel_filename("sm80.torch2.12cu130", fx.LINUX_311)
    build_tagged = name.replace("-cp311-", "-1-cp311-", 1)  # same tags, different build number
    with pytest.raises(ValueError, match="share the tag"):
        index.write_index(
            tmp_path,
            "sageattention",
            [index.IndexEntry(name, "0" * 64), index.IndexEntry(build_tagged, "1" * 64)],
        )
    with pytest.raises(ValueError, match="no local version label"):
        index.write_index(
            tmp_path,
            "sageattention",
            [index.IndexEntry("sageattention-2.2.0-cp311-cp311-linux_x86_64.whl", "0" * 64)],
        )


def test_index_cli_rebuilds_from_manifest(tmp_path, capsys):
    _, out = run_release(tmp_path)
    rc = index.main(
        [
            "--manifest",
            str(out / "manifest.json"),
            "--out",
            str(tmp_path / "site"),
            "--wheel-base-url",
            "https://example.invalid/dl/",
        ]
    )
    assert rc == 0
    page = (tmp_path / "site" / "sm90.torch2.14cu130" / "sageattention" / "index.html").read_text()
    assert "https://example.invalid/dl/sageattention-2.2.0%2Bsm90" in page
    (tmp_path / "bad.json").write_text("{}")
    assert index.main(["--manifest", str(tmp_path / "bad.json"), "--out", str(tmp_path / "x")]) == 2
    assert "no 'wheels' list" in capsys.readouterr().err


def test_pip_installs_the_exact_version_from_the_generated_index(tmp_path):
    """pip, offline and isolated from any config, resolves the right wheel from a variant index."""
    here = next(iter(sys_tags()))  # the most specific tag this interpreter installs
    tag = f"{here.interpreter}-{here.abi}-{here.platform}"
    for label, targets in (("sm80.torch2.14cu130", ["sm80"]), ("sm90.torch2.14cu130", ["sm90"])):
        _validated(
            tmp_path, label, targets, tag=tag, compute_capability=f"{targets[0][2]}.{targets[0][3]}"
        )
    # Same variant, another Python: on the same page, pip must skip it.
    _validated(tmp_path, "sm90.torch2.14cu130", ["sm90"], tag="cp39-cp39-win_amd64")
    rc, out = run_release(tmp_path, wheels=tmp_path / "wheels", reports=tmp_path / "reports")
    assert rc == 0

    target = tmp_path / "site-packages"
    index_url = (out / "simple" / "sm90.torch2.14cu130").as_uri() + "/"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--isolated",
            "--disable-pip-version-check",
            "install",
            "--no-deps",
            "--no-cache-dir",
            "--target",
            str(target),
            "--index-url",
            index_url,
            "sageattention==2.2.0+sm90.torch2.14cu130",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (dist_info,) = target.glob("sageattention-*.dist-info")
    assert dist_info.name == "sageattention-2.2.0+sm90.torch2.14cu130.dist-info"
    info = json.loads((target / "sageattention" / "_build_info.json").read_text())
    assert info["sm_targets"] == ["sm90"] and info["python_tag"] == here.interpreter


# ---------------------------------------------------------------- parsers


@pytest.mark.parametrize(
    "text,cc,ptx,arch",
    [
        ("sm75", (7, 5), False, False),
        ("sm75+PTX", (7, 5), True, False),
        ("sm_90a", (9, 0), False, True),
        ("8.9", (8, 9), False, False),
        ("sm100", (10, 0), False, False),
        ("compute_120+ptx", (12, 0), True, False),
    ],
)
def test_parse_gpu_target(text, cc, ptx, arch):
    t = release.parse_gpu_target(text)
    assert (t.cc, t.ptx, t.arch_specific) == (cc, ptx, arch)


@pytest.mark.parametrize("bad", ["", "turing", "sm7", "9"])
def test_parse_gpu_target_rejects(bad):
    with pytest.raises(ValueError, match="unrecognised SM target"):
        release.parse_gpu_target(bad)


def test_target_runs_on_rules():
    sm80, sm75p, sm90a = (release.parse_gpu_target(t) for t in ("sm80", "sm75+PTX", "sm_90a"))
    assert (
        sm80.runs_on((8, 6)) == "native"
        and sm80.runs_on((9, 0)) is None
        and sm80.runs_on((7, 5)) is None
    )
    assert sm75p.runs_on((7, 5)) == "native" and sm75p.runs_on((9, 0)) == "ptx-jit"
    assert sm90a.runs_on((9, 0)) == "native" and sm90a.runs_on((10, 0)) is None
    sm89p = release.replace(release.parse_gpu_target("sm89+PTX"), ptx_serves=((8, 9), (9, 0)))
    assert sm89p.runs_on((9, 0)) == "ptx-jit" and sm89p.runs_on((12, 0)) is None
    # neither SASS nor PTX runs on a GPU older than its target: PTX JIT-compiles forward only
    sm86p = release.parse_gpu_target("sm86+PTX")
    assert sm86p.runs_on((8, 6)) == "native" and sm86p.runs_on((8, 9)) == "native"
    assert sm86p.runs_on((9, 0)) == "ptx-jit"
    assert sm86p.runs_on((8, 0)) is None and sm75p.runs_on((7, 0)) is None
    assert release.parse_gpu_target("sm86").runs_on((8, 0)) is None


@pytest.mark.parametrize(
    "value,expected", [("13.0", "13.0"), ("cu130", "13.0"), ("cu128", "12.8"), ("12.8.1", "12.8")]
)
def test_normalize_cuda(value, expected):
    assert release.normalize_cuda(value) == expected


@pytest.mark.parametrize(
    "value,expected", [("9.0", (9, 0)), ([8, 9], (8, 9)), ("sm_75", (7, 5)), (90, (9, 0))]
)
def test_parse_compute_capability(value, expected):
    assert release.parse_compute_capability(value) == expected


def test_bad_cuda_and_cc_raise_value_error():
    with pytest.raises(ValueError, match="CUDA version"):
        release.normalize_cuda("thirteen")
    with pytest.raises(ValueError, match="compute capability"):
        release.parse_compute_capability(None)


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        release.main(["--help"])
    assert exc.value.code == 0
    assert "exit codes" in capsys.readouterr().out


def test_picker_reads_the_generated_manifest(tmp_path):
    """End to end: release folder -> manifest.json -> the picker names the published wheel."""
    _, out = run_release(tmp_path)
    env = {
        "os": "linux",
        "arch": "x86_64",
        "python": "3.11",
        "glibc": "2.36",
        "torch": "2.14.1+cu130",
        "torch_cuda": "13.0",
        "gpus": [{"name": "NVIDIA H200", "compute_capability": "9.0"}],
    }
    (tmp_path / "env.json").write_text(json.dumps(env))
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "pick_wheel.py"),
            "--manifest",
            str(out / "manifest.json"),
            "--env-json",
            str(tmp_path / "env.json"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    answer = json.loads(res.stdout)
    assert answer["wheel"]["filename"] == fx.PASSING
    assert answer["commands"]["pip"] == f'python -m pip install "{out / fx.PASSING}"'
    assert (out / fx.PASSING).is_file()
    index = (out / "simple" / "sm90.torch2.14cu130").as_uri() + "/"
    assert f"--index-url {index} " in answer["commands"]["pip_index"]


def test_a_familys_embedded_ptx_counts_without_plus_ptx_in_the_target(tmp_path):
    # A plain "sm75" cell (valid in build_matrix.yaml) still embeds compute_75 (the sm75
    # family's embed_ptx; build info "ptx"), which the guard and the suite run on newer GPUs.
    # The release read PTX from "+PTX" alone: its H200 ptx-jit report was refused, and the
    # manifest told the picker the wheel had no PTX.
    wheel = fx.build_wheel(tmp_path / "wheels", "sm75.torch2.14cu130", fx.LINUX_311,
                           sm_targets=["sm75"], build_info_extra={"ptx": ["compute_75"]})
    fx.write_report(tmp_path / "reports", wheel, fx.make_report(wheel, execution="ptx-jit"))
    fx.write_note(tmp_path / "reports", wheel)
    verdict = release.judge_wheel(wheel, tmp_path / "reports")
    assert isinstance(verdict, release.Accepted), getattr(verdict, "reasons", None)
    entry = release.manifest_entry(verdict, "simple")
    assert entry["gpu_targets"] == [{"name": "sm75", "cc": "7.5", "sass": True, "ptx": True,
                                     "arch_specific": False, "ptx_serves": None}]


FAMILIES_FILE = ("sageattention/native/families.json",
                 (ROOT / "sageattention" / "native" / "families.json").read_bytes())


def _accepted_entry(tmp_path, label, sm_targets, families, ptx, execution, cc="9.0"):
    """The manifest entry of a wheel that carries the package's families.json, validated on a GPU
    of ``cc`` the way ``execution`` says (or the refusal)."""
    wheel = fx.build_wheel(tmp_path / "wheels", label, fx.LINUX_311, sm_targets=sm_targets,
                           build_info_extra={"families": families, "ptx": ptx},
                           extra_files=[FAMILIES_FILE])
    report = fx.make_report(wheel, execution=execution, compute_capability=cc)
    fx.write_report(tmp_path / "reports", wheel, report)
    fx.write_note(tmp_path / "reports", wheel)
    verdict = release.judge_wheel(wheel, tmp_path / "reports")
    if isinstance(verdict, release.Refused):
        return verdict
    return release.manifest_entry(verdict, "simple")


def test_a_plus_ptx_targets_ptx_reaches_only_the_gpus_its_families_serve(tmp_path):
    # The dispatcher runs the sm80 and sm89 families only on the SMs they serve (up to sm90), so
    # an sm89+PTX wheel's compute_89 runs on an H200, not on a Blackwell GPU; the manifest says
    # so, for the picker. The sm75 family's own compute_75 (its embed_ptx) reaches every newer GPU.
    entry = _accepted_entry(tmp_path, "sm89.torch2.14cu130", ["sm89+PTX"], ["sm80", "sm89"],
                            ["compute_89"], "ptx-jit")
    assert entry["gpu_targets"] == [{"name": "sm89+PTX", "cc": "8.9", "sass": True, "ptx": True,
                                     "arch_specific": False, "ptx_serves": ["8.9", "9.0"]}]
    entry = _accepted_entry(tmp_path, "sm75.torch2.14cu130", ["sm75+PTX"], ["sm75"],
                            ["compute_75"], "ptx-jit")
    assert entry["gpu_targets"][0]["ptx_serves"] is None


def test_a_ptx_jit_report_from_a_gpu_the_ptx_does_not_serve_is_refused(tmp_path):
    refused = _accepted_entry(tmp_path, "sm89.torch2.14cu130", ["sm89+PTX"], ["sm80", "sm89"],
                              ["compute_89"], "ptx-jit", cc="12.0")
    assert isinstance(refused, release.Refused)
    assert any("runs there not at all" in r for r in refused.reasons), refused.reasons


def test_build_info_families_missing_from_the_wheels_table_are_a_refusal_reason(tmp_path):
    refused = _accepted_entry(tmp_path, "sm89.torch2.14cu130", ["sm89+PTX"], ["sm89", "sm99x"],
                              ["compute_89"], "ptx-jit")
    assert isinstance(refused, release.Refused)
    assert any("families ['sm99x'] are not in the wheel's sageattention/native/families.json" in r
               for r in refused.reasons), refused.reasons


def test_a_malformed_ptx_list_in_build_info_is_a_refusal_reason(tmp_path):
    wheel = fx.build_wheel(tmp_path / "wheels", "sm75.torch2.14cu130", fx.LINUX_311,
                           sm_targets=["sm75"], build_info_extra={"ptx": "compute_75"})
    verdict = release.judge_wheel(wheel, tmp_path / "reports")
    assert isinstance(verdict, release.Refused)
    assert "build info ptx must be a list like ['compute_75'], got 'compute_75'" in \
        verdict.reasons


def test_index_writes_no_page_when_a_later_variant_is_refused(tmp_path):
    first = fx.wheel_filename("sm75.torch2.12cu130", fx.LINUX_311)
    name = fx.wheel_filename("sm80.torch2.12cu130", fx.LINUX_311)
    build_tagged = name.replace("-cp311-", "-1-cp311-", 1)  # same tags as `name`
    with pytest.raises(ValueError, match="share the tag"):
        index.write_index(tmp_path / "simple", "sageattention",
                          [index.IndexEntry(n, "0" * 64) for n in (first, name, build_tagged)])
    assert not (tmp_path / "simple").exists()  # the sm75 page was written before the refusal


@pytest.mark.parametrize("manifest, out, words", [
    ("folder", "site", "cannot read --manifest {tmp}/folder (it is a folder); name the "
                       "release's manifest.json"),
    ("missing.json", "site", "cannot read --manifest {tmp}/missing.json (No such file or "
                             "directory)"),
    ("broken.json", "site", "cannot read --manifest {tmp}/broken.json (not JSON: "),
    ("ok.json", "afile", "--out {tmp}/afile is a file; name a folder"),
    ("ok.json", "afile/x", "--out {tmp}/afile/x lies under the file {tmp}/afile"),
])
def test_index_cli_names_the_bad_argument(tmp_path, capsys, manifest, out, words):
    (tmp_path / "folder").mkdir()
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "ok.json").write_text('{"wheels": []}')
    (tmp_path / "afile").write_text("")
    assert index.main(["--manifest", str(tmp_path / manifest), "--out", str(tmp_path / out)]) == 2
    assert words.format(tmp=tmp_path) in capsys.readouterr().err


@pytest.mark.parametrize("label, build, words", [
    ("sm80.torch2.12cu130", {"torch": "2.14.1", "torch_requirement": "torch==2.12.*"},
     "says label sm80.torch2.14cu130, the file name says sm80.torch2.12cu130"),
    ("sm80.torch2.14cu130", {"cuda": "12.8"},
     "says label sm80.torch2.14cu128, the file name says sm80.torch2.14cu130"),
    ("sm80.torch2.14cu130", {"sm_targets": ["sm90"]},
     "says label sm90.torch2.14cu130, the file name says sm80.torch2.14cu130"),
    ("sm80.torch2.14cu130", {"torch_requirement": "torch==2.12.*"},
     "METADATA requires torch==2.12.*, but the label says torch==2.14.*"),
    ("sm80.torch2.14cu130", {"torch_requirement": None},
     "METADATA requires torch (any), but the label says torch==2.14.*"),
])
def test_a_wheel_whose_label_disagrees_with_its_contents_is_refused(tmp_path, label, build,
                                                                   words):
    # The manifest takes torch, CUDA and targets from build info and the pin from METADATA:
    # such a wheel was published, and the picker offered it to the wrong machines.
    build = {"sm_targets": ["sm80+PTX"], **build}
    wheel = fx.build_wheel(tmp_path / "wheels", label, fx.LINUX_311, **build)
    fx.write_report(tmp_path / "reports", wheel, fx.make_report(wheel, execution="ptx-jit"))
    fx.write_note(tmp_path / "reports", wheel)
    verdict = release.judge_wheel(wheel, tmp_path / "reports")
    assert isinstance(verdict, release.Refused)
    assert any(words in r for r in verdict.reasons), verdict.reasons


@pytest.mark.parametrize("layout", ["inside", "equal"])
def test_an_out_that_holds_or_is_an_input_folder_is_refused_before_any_work(tmp_path, capsys,
                                                                            layout):
    # --out held a previous release and the wheels/reports folders: replacing the release
    # deleted the inputs (rmtree of --out after copying only the accepted wheels).
    out = tmp_path / "release"
    run_release(tmp_path, "--allow-partial")
    if layout == "inside":
        wheels, reports = out / "wheels", out / "release_notes"
        shutil.copytree(FIXTURES / "wheels", wheels)
        shutil.copytree(FIXTURES / "release_notes", reports)
    else:  # a previous release folder used as the inputs of the next one
        wheels = reports = out
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    rc = release.main(["--wheels", str(wheels), "--reports", str(reports), "--out", str(out)])
    assert rc == release.EXIT_USAGE
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    # release's per-wheel progress lines ("[1/4] checking <wheel>") aside, one error line
    err = "\n".join(line for line in capsys.readouterr().err.splitlines() if "] checking " not in line)
    where = "holds" if layout == "inside" else "is"
    assert f"--out {out} {where} the wheel folder {wheels}; replacing the release" in err, err
    assert "choose another --out" in err and len(err.strip().splitlines()) == 1


def test_index_cli_refuses_a_manifest_that_lists_no_wheels(tmp_path, capsys):
    # It wrote an index of no wheels and exited 0; a release manifest lists at least one wheel
    # (release.py writes nothing when none is accepted).
    (tmp_path / "empty.json").write_text('{"project": "sageattention", "wheels": []}')
    site = tmp_path / "site"
    assert index.main(["--manifest", str(tmp_path / "empty.json"), "--out", str(site)]) == 2
    err = capsys.readouterr().err
    assert "error: manifest lists no wheels: nothing to index" in err
    assert len(err.strip().splitlines()) == 1
    assert not site.exists()


@pytest.mark.parametrize("project", [None, "", 5])
def test_index_cli_names_the_project_field_it_cannot_use(tmp_path, capsys, project):
    # "project": null was written as str(None): "wheel '...' is not a 'None' wheel".
    name = fx.wheel_filename("sm90.torch2.14cu130", fx.LINUX_311)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"project": project,
                                    "wheels": [{"filename": name, "sha256": "a" * 64}]}))
    site = tmp_path / "site"
    assert index.main(["--manifest", str(manifest), "--out", str(site)]) == 2
    err = capsys.readouterr().err
    assert (f"error: manifest 'project' must be the project name, a string such as "
            f"'sageattention' (or absent: sageattention), got {project!r}") in err, err
    assert len(err.strip().splitlines()) == 1 and not site.exists()


def test_a_folder_named_like_a_wheel_is_refused_with_its_reason(tmp_path, capsys):
    # It was an IsADirectoryError traceback from zipfile.
    wheels = tmp_path / "wheels"
    (wheels / fx.PASSING).mkdir(parents=True)
    rc, out = run_release(tmp_path, wheels=wheels)
    assert rc == release.EXIT_NOTHING and not out.exists()
    captured = capsys.readouterr()
    assert f"REFUSED   {fx.PASSING}" in captured.out
    assert "- cannot read the wheel: Is a directory" in captured.out


# ---------------------------------------------------------------- a pass proves only what ran


def _with_checks(tmp_path: Path, edit) -> release.Accepted | release.Refused:
    wheel = _validated(tmp_path, "sm90.torch2.14cu130", ["sm90"])
    path = tmp_path / "reports" / (wheel.name[:-4] + ".report.json")
    report = json.loads(path.read_text())
    edit(report["checks"])
    path.write_text(json.dumps(report))
    fx.write_note(tmp_path / "reports", wheel)  # the note of the edited report
    return release.judge_wheel(wheel, tmp_path / "reports")


def _set(checks, backend, *, native=None, only=None):
    for c in checks:
        if c["status"] == "pass" and (only is None or c["name"] in only):
            c["backend"], c["backends"] = backend, [backend] if backend else []
            if native is not None:
                c["native"] = native


@pytest.mark.parametrize("edit,words", [
    # every pass ran the SDPA fallback (or a Triton kernel): nothing about the wheel's kernels
    (lambda cs: _set(cs, "sdpa"), "no passed check ran a CUDA kernel of this wheel (only sdpa)"),
    (lambda cs: _set(cs, "triton-fp16"),
     "no passed check ran a CUDA kernel of this wheel (only triton-fp16)"),
    # a check the suite runs forced on the native kernels, passed on a fallback
    (lambda cs: _set(cs, "sdpa", native=True, only={"causal"}),
     "native check(s) passed on a backend other than the wheel's CUDA kernels: causal (sdpa)"),
    # a pass that does not say which backend ran
    (lambda cs: _set(cs, None, only={"gqa"}),
     "passed check(s) that do not say which backend ran: gqa"),
])
def test_a_pass_that_did_not_run_the_wheels_kernels_does_not_validate_it(tmp_path, edit, words):
    # All four were published: the release read only the statuses, never which backend ran.
    assert isinstance(_with_checks(tmp_path, lambda cs: None), release.Accepted)
    verdict = _with_checks(tmp_path, edit)
    assert isinstance(verdict, release.Refused)
    assert any(words in r for r in verdict.reasons), verdict.reasons


def test_mask_checks_on_fallbacks_beside_native_passes_are_accepted(tmp_path):
    # The real suite's mask checks (native: false) run Triton or SDPA by design.
    verdict = _with_checks(tmp_path, lambda cs: _set(cs, "sdpa", native=False, only={"causal"}))
    assert isinstance(verdict, release.Accepted), getattr(verdict, "reasons", None)


def test_manifest_lists_each_backend_that_ran_once(tmp_path):
    # A check that ran two backends ("triton-fp16, cuda-sm80-fp16") was listed as one backend of
    # that name in the manifest's validation.backends.
    def two(cs):
        cs[0]["backend"] = "triton-fp16, cuda-sm80-fp16"
        cs[0]["backends"] = ["triton-fp16", "cuda-sm80-fp16"]
    verdict = _with_checks(tmp_path, two)
    assert release.validation_summary(verdict.report)["backends"] == ["cuda-sm80-fp16",
                                                                     "triton-fp16"]


# ---------------------------------------------------------------- notes are generated, not written


def _stored_copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The stored passing wheel, its report and its generated note, copied into tmp_path."""
    wheels, reports = tmp_path / "wheels", tmp_path / "reports"
    wheels.mkdir()
    shutil.copytree(FIXTURES / "release_notes", reports)
    shutil.copy(FIXTURES / "wheels" / fx.PASSING, wheels)
    return wheels / fx.PASSING, reports, reports / (fx.PASSING[: -len(".whl")] + ".md")


def test_the_generated_note_is_accepted_and_published_as_is(tmp_path):
    from scripts.factory import notes

    wheel, reports, note = _stored_copy(tmp_path)
    report_path = reports / (wheel.name[: -len(".whl")] + ".report.json")
    assert note.read_text(encoding="utf-8") == notes.generate(report_path)[2]
    verdict = release.judge_wheel(wheel, reports)
    assert isinstance(verdict, release.Accepted), getattr(verdict, "reasons", None)
    rc, out = run_release(tmp_path, wheels=wheel.parent, reports=reports)
    assert rc == release.EXIT_OK
    assert (out / note.name).read_bytes() == note.read_bytes()


@pytest.mark.parametrize("edit", [
    # a note written by hand in place of the generated one
    lambda text: "# SageAttention for Tesla T4\n\n1.95x faster on Tesla T4! All verified.\n",
    # the generated note with one claim added
    lambda text: text.replace("## Performance\n", "## Performance\n\n1.95x faster on Tesla T4! "
                              "All verified.\n", 1),
    # the generated note, its header kept, a figure changed
    lambda text: text.replace("1.00x", "1.95x"),
    # only the final newline dropped: not what the notes step writes either
    lambda text: text.rstrip("\n"),
])
def test_a_note_that_is_not_the_generated_one_is_refused(tmp_path, capsys, edit):
    # Any file named <stem>.md was published as the wheel's note, a hand-written
    # "1.95x faster on Tesla T4! All verified." included.
    wheel, reports, note = _stored_copy(tmp_path)
    text = note.read_text(encoding="utf-8")
    edited = edit(text)
    assert edited != text
    note.write_text(edited, encoding="utf-8")
    verdict = release.judge_wheel(wheel, reports)
    assert isinstance(verdict, release.Refused)
    stem = wheel.name[: -len(".whl")]
    assert verdict.reasons == (
        f"release notes {stem}.md differ from what python -m scripts.factory.notes generates "
        f"from {stem}.report.json: notes are generated from the report, never written or edited "
        f"by hand; run the notes step (nox -s notes, or python -m scripts.factory.notes "
        f"{stem}.report.json) and publish what it writes",
    )
    rc, out = run_release(tmp_path, wheels=wheel.parent, reports=reports)
    assert rc == release.EXIT_NOTHING and not out.exists()
    printed = capsys.readouterr().out
    assert f"REFUSED   {fx.PASSING}" in printed and "run the notes step" in printed


def test_a_report_notes_refuses_is_a_refusal_reason_not_a_traceback(tmp_path):
    # A report valid for the release but one the notes step refuses (it would have to state a
    # driver the run did not record): no note can be generated, so none can be published.
    wheel, reports, note = _stored_copy(tmp_path)
    report_path = reports / (wheel.name[: -len(".whl")] + ".report.json")
    report = json.loads(report_path.read_text())
    del report["environment"]["driver"]
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    verdict = release.judge_wheel(wheel, reports)
    assert isinstance(verdict, release.Refused)
    (reason,) = verdict.reasons
    assert reason.startswith(f"release notes cannot be generated from {report_path.name} "
                             "(python -m scripts.factory.notes refuses it: ")
    assert "environment lacks driver" in reason and "\n" not in reason


def test_a_report_notes_cannot_render_is_a_refusal_reason(tmp_path, monkeypatch):
    from scripts.factory import notes

    def broken(report, source_name):
        raise KeyError("gpu_name")

    monkeypatch.setattr(notes, "render", broken)
    wheel, reports, _ = _stored_copy(tmp_path)
    verdict = release.judge_wheel(wheel, reports)
    assert isinstance(verdict, release.Refused)
    (reason,) = verdict.reasons
    assert "release notes cannot be generated from" in reason and "'gpu_name'" in reason


def test_a_missing_note_says_to_run_the_notes_step(tmp_path):
    wheel, reports, note = _stored_copy(tmp_path)
    note.unlink()
    verdict = release.judge_wheel(wheel, reports)
    assert isinstance(verdict, release.Refused)
    assert verdict.reasons == (f"no release notes ({note.name} missing): run the notes step "
                               "(nox -s notes)",)


@pytest.mark.parametrize("change", ["missing", "edited"])
def test_a_missing_or_edited_speedup_chart_is_refused(tmp_path, change):
    # The published note links <stem>.speedup.svg: without it (or with another picture) the release
    # would show a broken or unmeasured chart.
    root = tmp_path / "fx"
    fx.generate(root)
    chart = root / "release_notes" / f"{fx.PASSING[: -len('.whl')]}.speedup.svg"
    if change == "missing":
        chart.unlink()
    else:
        chart.write_text(chart.read_text(encoding="utf-8").replace("</svg>", "<text>2x</text></svg>"),
                         encoding="utf-8")
    verdict = release.judge_wheel(root / "wheels" / fx.PASSING, root / "release_notes")
    assert isinstance(verdict, release.Refused)
    assert any("speed-up chart" in r and ("missing" if change == "missing" else "not what the notes step")
               in r for r in verdict.reasons), verdict.reasons


# ---------------------------------------------------------------- index entries pip cannot use


def _index_manifest(tmp_path: Path, *wheels: dict) -> Path:
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"project": "sageattention", "wheels": list(wheels)}))
    return path


def test_index_cli_refuses_one_file_name_listed_with_two_hashes(tmp_path, capsys):
    # It wrote two links to one file with different #sha256= on one page and exited 0.
    name = fx.wheel_filename("sm90.torch2.14cu130", fx.LINUX_311)
    manifest = _index_manifest(tmp_path, {"filename": name, "sha256": "a" * 64},
                               {"filename": name, "sha256": "b" * 64})
    site = tmp_path / "site"
    assert index.main(["--manifest", str(manifest), "--out", str(site)]) == 2
    err = capsys.readouterr().err
    assert f"wheel {name!r} is listed twice, with sha256 {'a' * 64} and {'b' * 64}" in err, err
    assert not site.exists()


def test_index_writes_one_link_for_an_entry_listed_twice_identically(tmp_path):
    name = fx.wheel_filename("sm90.torch2.14cu130", fx.LINUX_311)
    entry = index.IndexEntry(name, "c" * 64, ">=3.9")
    index.write_index(tmp_path / "simple", "sageattention", [entry, entry])
    page = (tmp_path / "simple" / "sm90.torch2.14cu130" / "sageattention" / "index.html")
    assert page.read_text().count("<a href=") == 1


def test_index_refuses_one_file_name_with_two_requires_python(tmp_path):
    name = fx.wheel_filename("sm90.torch2.14cu130", fx.LINUX_311)
    with pytest.raises(ValueError, match="listed twice.*requires_python '>=3.9' and '>=3.10'"):
        index.write_index(tmp_path, "sageattention", [index.IndexEntry(name, "c" * 64, ">=3.9"),
                                                      index.IndexEntry(name, "c" * 64, ">=3.10")])


@pytest.mark.parametrize("sha256", ["00", "A" * 64, "g" * 64, "a" * 65, 123, None])
def test_index_cli_refuses_a_sha256_that_is_not_64_lowercase_hex(tmp_path, capsys, sha256):
    # "00" was written as #sha256=00: every install from the page then failed on the hash.
    name = fx.wheel_filename("sm90.torch2.14cu130", fx.LINUX_311)
    manifest = _index_manifest(tmp_path, {"filename": name, "sha256": sha256})
    site = tmp_path / "site"
    assert index.main(["--manifest", str(manifest), "--out", str(site)]) == 2
    err = capsys.readouterr().err
    assert f"manifest wheels[0]: {name}: 'sha256' must be 64 lowercase hex digits, got " \
        f"{sha256!r}" in err, err
    assert not site.exists()


@pytest.mark.parametrize("requires_python, words", [
    (5, "'requires_python' must be a string such as '>=3.9' or null, got 5"),
    ([">=3.9"], "'requires_python' must be a string such as '>=3.9' or null, got ['>=3.9']"),
    ("3.9+", "'requires_python' '3.9+' is not a version specifier"),
])
def test_index_cli_refuses_a_requires_python_that_is_not_a_specifier(tmp_path, capsys,
                                                                      requires_python, words):
    # requires_python: 5 was an AttributeError traceback (exit 1; documented as 2).
    name = fx.wheel_filename("sm90.torch2.14cu130", fx.LINUX_311)
    manifest = _index_manifest(tmp_path, {"filename": name, "sha256": "a" * 64,
                                          "requires_python": requires_python})
    assert index.main(["--manifest", str(manifest), "--out", str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err
    assert f"manifest wheels[0]: {name}: {words}" in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_wheel_changed_after_its_checks_is_not_published(tmp_path, capsys, monkeypatch):
    # judge_wheel hashes the wheel; write_release copies it later: a file rewritten in between
    # was published under the hash of the file that was judged
    wheels = tmp_path / "wheels"
    shutil.copytree(FIXTURES / "wheels", wheels)
    judge = release.judge_wheel

    def judge_then_change(path, reports_dir):
        verdict = judge(path, reports_dir)
        with open(path, "ab") as fh:
            fh.write(b"\0")
        return verdict

    monkeypatch.setattr(release, "judge_wheel", judge_then_change)
    rc, out = run_release(tmp_path, "--allow-partial", wheels=wheels)
    assert rc == release.EXIT_NOTHING and not out.exists()
    assert f"{fx.PASSING} changed after it was checked" in capsys.readouterr().err
    assert not list(tmp_path.glob(".release.*"))   # the staging folder is removed
