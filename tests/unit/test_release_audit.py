"""Audit of the publish path: a wheel is published only on its own validation run, and its note
claims only what that run shows (scripts/factory/release.py, report.py, notes.py, index.py,
wheelcheck.py). Synthetic wheels and reports only (tests/unit/fixtures/release/release_fixtures.py).
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "unit" / "fixtures" / "release"))

import release_fixtures as fx  # noqa: E402

from scripts.factory import index, notes, release, wheelcheck  # noqa: E402
from scripts.factory import report as reports  # noqa: E402

LABEL = "sm90.torch2.14cu130"
STEM75 = "sageattention-2.2.0+sm75.torch2.11cu130-cp312-cp312-linux_x86_64"
REPORT_FIXTURES = ROOT / "tests" / "unit" / "fixtures" / "reports"


def without_progress(err: str) -> str:
    """stderr without release's per-wheel progress lines ("[1/3] checking <wheel>")."""
    return "\n".join(line for line in err.splitlines() if "] checking " not in line)


def _judge(tmp_path: Path, mutate=None, *, tag=fx.LINUX_311, label=LABEL, targets=("sm90",),
           note=True, report_kw=None, **build):
    """Build a wheel, write its report (``mutate``d), note and chart; return the verdict."""
    wheel = fx.build_wheel(tmp_path / "wheels", label, tag, sm_targets=list(targets), **build)
    doc = fx.make_report(wheel, **(report_kw or {}))
    if mutate:
        mutate(doc)
    fx.write_report(tmp_path / "reports", wheel, doc)
    if note:
        fx.write_note(tmp_path / "reports", wheel)
    return release.judge_wheel(wheel, tmp_path / "reports")


def _reasons(verdict) -> str:
    assert isinstance(verdict, release.Refused), "accepted, but should have been refused"
    return " | ".join(verdict.reasons)


def test_the_unchanged_fixture_run_is_accepted(tmp_path):
    # the baseline every refusal below departs from by one field
    assert isinstance(_judge(tmp_path), release.Accepted)


# -- the report must be this wheel's own run ------------------------------------------------------

def test_a_report_whose_build_info_is_another_builds_is_refused(tmp_path):
    # The run imported another build (same version, another commit and targets): its report
    # carried that build's info, and the note stated it as this wheel's.
    def other_build(doc):
        doc["build_info"].update(git_commit="1" * 40, cell_id="another-cell")
    why = _reasons(_judge(tmp_path, other_build))
    assert "the report's build_info is not this wheel's" in why
    assert "git_commit '1111111111111111111111111111111111111111' (the wheel's: '0000" in why
    assert "cell_id 'another-cell'" in why


def test_a_report_without_build_info_is_refused(tmp_path):
    why = _reasons(_judge(tmp_path, lambda d: d.update(build_info=None)))
    assert "the report has no build_info" in why


@pytest.mark.parametrize("field,value,words", [
    ("version", "2.2.1+sm90.torch2.14cu130", "wheel.version '2.2.1+sm90.torch2.14cu130' is not "
                                             "the version of"),
    ("tags", ["cp312-cp312-manylinux_2_28_x86_64"], "wheel.tags ['cp312-cp312-manylinux_2_28_"
                                                     "x86_64'] are not the tags of"),
    ("name", "sageattention-fork", "wheel.name 'sageattention-fork' is not the project of"),
])
def test_a_report_whose_wheel_fields_name_another_wheel_is_refused(tmp_path, field, value, words):
    # A report of another wheel (another version or Python), renamed and given this wheel's file
    # name and hash, was accepted: only filename and sha256 were compared.
    why = _reasons(_judge(tmp_path, lambda d: d["wheel"].update({field: value}), note=False))
    assert words in why


def test_wheel_fields_that_agree_with_the_filename_are_valid():
    doc = reports.load_report(REPORT_FIXTURES / f"{STEM75}.report.json")
    doc["wheel"].update(version="2.2.0+sm75.torch2.11cu130", name="SageAttention",
                        tags=["cp312-cp312-linux_x86_64"])
    assert reports.validate_report(doc) == []


@pytest.mark.parametrize("torch,words", [
    ("2.14.0+cu128", "the run's torch 2.14.0+cu128 is a build for CUDA 12.8"),
    ("2.14.0+cpu", "the run's torch 2.14.0+cpu is a CPU-only build"),
])
def test_a_run_whose_torch_is_for_another_cuda_is_refused(tmp_path, torch, words):
    # environment.torch said cu128 while cuda_runtime said 13.0: the note stated both.
    why = _reasons(_judge(tmp_path, lambda d: d["environment"].update(torch=torch), note=False))
    assert words in why


def test_a_passed_check_that_lists_failures_contradicts_itself():
    doc = reports.load_report(REPORT_FIXTURES / f"{STEM75}.report.json")
    doc["checks"][0].update(failures=["FP16: cosine 0.2"])
    assert any("checks[0] (Native runtime) is pass, but it lists 1 failure(s) (FP16: cosine 0.2)"
               in p for p in reports.validate_report(doc))
    doc["checks"][0].update(failures=[], cases=[{"label": "n=77", "ok": False}])
    assert any("is pass, but its case(s) n=77 did not pass" in p
               for p in reports.validate_report(doc))


# -- which backend ran -----------------------------------------------------------------------------

def test_passes_on_a_cuda_kernel_that_is_not_the_wheels_do_not_validate_it(tmp_path):
    # An sm75 (compute_75 PTX) wheel's report whose passes ran cuda-sm90-fp16, a kernel this wheel
    # does not carry (another installation's), was published: any "cuda-" backend counted.
    def elsewhere(doc):
        for check in doc["checks"]:
            if check["status"] == "pass":
                check["backend"] = "cuda-sm90-fp16"
        doc["expectation"]["native_backends"][0]["name"] = "cuda-sm75-fp16"
    verdict = _judge(tmp_path, elsewhere, label="sm75.torch2.14cu130", targets=("sm75+PTX",),
                     report_kw={"execution": "ptx-jit"})
    why = _reasons(verdict)
    assert len(verdict.reasons) == 1, why  # a valid report, and a note generated from it
    assert ("no passed check ran a CUDA kernel of this wheel (only cuda-sm90-fp16)" in why
            and "(this wheel's on that GPU: cuda-sm75-fp16)" in why)


def test_the_note_of_such_a_run_says_it_validated_nothing(tmp_path):
    wheel = fx.build_wheel(tmp_path, LABEL, fx.LINUX_311, sm_targets=["sm90"])
    doc = fx.make_report(wheel)
    doc["expectation"]["native_backends"][0]["name"] = "cuda-sm90-fp16"  # not what ran
    text = notes.render(doc, "r.report.json")
    assert "**Execution: none of the wheel's CUDA kernels ran.**" in text
    assert "**Not validated: no passed check ran a CUDA kernel of this wheel" in text
    assert "Treat this Linux wheel as verified only for" not in text


def test_a_report_that_does_not_name_the_wheels_kernels_is_refused(tmp_path):
    why = _reasons(_judge(tmp_path, lambda d: d.update(expectation=None)))
    assert "does not name the wheel's CUDA kernels the run had to run" in why


# -- what a PTX-JIT note claims --------------------------------------------------------------------

def test_a_ptx_note_names_only_the_code_path_whose_ptx_ran():
    # An sm75+sm80 wheel on an sm_90 GPU runs only compute_75 (the sm80 family has no PTX that
    # reaches sm_90 here); its note said it checked "the Turing and Ampere code paths".
    doc = reports.load_report(REPORT_FIXTURES / f"{STEM75}.report.json")
    doc["build_info"]["sm_targets"] = ["sm75+PTX", "sm80"]
    text = notes.render(doc, f"{STEM75}.report.json")
    assert ("by running the compute_75 PTX through the driver's JIT; this checks the Turing code "
            "path, not Turing hardware.") in text
    assert "The wheel's Ampere code did not run in this validation and is not verified." in text
    assert "Turing and Ampere code paths" not in text
    assert ("- the SM75/Turing code path as PTX JIT-compiled on the FIXTURE GPU sm_90 (synthetic, "
            "not a real run) (sm_90); NOT verified on SM75/Turing hardware") in text
    assert "- NOT verified at all: the SM80/Ampere code (it did not run)" in text


def test_a_single_sm_ptx_note_says_exactly_what_ran():
    text = notes.render(reports.load_report(REPORT_FIXTURES / f"{STEM75}.report.json"),
                        f"{STEM75}.report.json")
    assert ("this checks the Turing code path, not Turing hardware. No result below was measured "
            "on an SM75 GPU.") in text
    assert "did not run" not in text and "NOT verified at all" not in text


# -- one release: one version, one wheel per cell ---------------------------------------------------

def _validated(tmp_path, tag, *, base_version=fx.BASE_VERSION, cell="linux-cp311-sm90"):
    wheel = fx.build_wheel(tmp_path / "wheels", LABEL, tag, sm_targets=["sm90"],
                           base_version=base_version, build_info_extra={"cell_id": cell})
    fx.write_report(tmp_path / "reports", wheel, fx.make_report(wheel))
    fx.write_note(tmp_path / "reports", wheel)
    return wheel


def _release(tmp_path):
    out = tmp_path / "out"
    return release.main(["--wheels", str(tmp_path / "wheels"), "--reports",
                         str(tmp_path / "reports"), "--out", str(out)]), out


def test_two_validated_wheels_of_one_cell_are_refused_before_anything_is_written(tmp_path,
                                                                                capsys):
    # The pre-repair linux_x86_64 wheel left beside its repaired manylinux one: both were
    # published, and the picker offered two wheels for one machine.
    raw = _validated(tmp_path, "cp311-cp311-linux_x86_64")
    repaired = _validated(tmp_path, fx.LINUX_311)
    rc, out = _release(tmp_path)
    err = capsys.readouterr().err
    assert rc == release.EXIT_USAGE
    assert (f"{raw.name} and {repaired.name} are builds of one matrix cell "
            "(cell 'linux-cp311-sm90')") in err
    assert "keep only the one to publish (the repaired wheel)" in err and "nothing written" in err
    assert not out.exists()


def test_one_cell_is_also_recognised_by_label_python_and_os(tmp_path, capsys):
    _validated(tmp_path, "cp311-cp311-linux_x86_64", cell="a")
    _validated(tmp_path, fx.LINUX_311, cell="b")
    _validated(tmp_path, "cp312-cp312-manylinux_2_28_x86_64", cell="c")  # another cell: fine
    rc, _ = _release(tmp_path)
    err = without_progress(capsys.readouterr().err)
    assert rc == release.EXIT_USAGE
    assert f"(label {LABEL}, cp311-cp311, linux)" in err and "cp312" not in err


def test_several_versions_name_their_wheels(tmp_path, capsys):
    a = _validated(tmp_path, fx.LINUX_311)
    b = _validated(tmp_path, "cp312-cp312-manylinux_2_28_x86_64", base_version="2.3.0", cell="x")
    rc, out = _release(tmp_path)
    err = capsys.readouterr().err
    assert rc == release.EXIT_USAGE and not out.exists()
    assert f"2.2.0: {a.name}; 2.3.0: {b.name}" in err and "move the others out" in err


# -- the wheel must agree with itself ---------------------------------------------------------------

def _rewrite(wheel: Path, member: str, edit) -> None:
    """Rewrite one member of a (fixture) wheel; the report must then be written afresh."""
    with zipfile.ZipFile(wheel) as zf:
        items = [(i, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(wheel, "w") as zf:
        for info, data in items:
            zf.writestr(info, edit(data) if info.filename == member else data)


@pytest.mark.parametrize("old,new,words", [
    ("Version: 2.2.0+sm90.torch2.14cu130", "Version: 2.2.1+sm90.torch2.14cu130",
     "says sageattention 2.2.1+sm90.torch2.14cu130, but the file name says sageattention "
     "2.2.0+sm90.torch2.14cu130: pip refuses such a wheel"),
    ("Name: sageattention", "Name: sageattention-fork", "says sageattention-fork"),
])
def test_a_wheel_whose_metadata_names_another_version_is_refused(tmp_path, old, new, words):
    wheel = fx.build_wheel(tmp_path / "wheels", LABEL, fx.LINUX_311, sm_targets=["sm90"])
    _rewrite(wheel, f"sageattention-2.2.0+{LABEL}.dist-info/METADATA",
             lambda data: data.replace(old.encode(), new.encode()))
    fx.write_report(tmp_path / "reports", wheel, fx.make_report(wheel))
    fx.write_note(tmp_path / "reports", wheel)
    assert words in _reasons(release.judge_wheel(wheel, tmp_path / "reports"))


def test_a_wheel_whose_build_info_version_is_another_is_refused(tmp_path):
    why = _reasons(_judge(tmp_path, build_info_extra={"version": "2.2.1+" + LABEL}))
    assert f"build info version '2.2.1+{LABEL}' is not the file name's 2.2.0+{LABEL}" in why


def test_wheelcheck_compares_versions_and_names_not_strings(tmp_path):
    wheel = fx.build_wheel(tmp_path, LABEL, fx.LINUX_311, sm_targets=["sm90"],
                           build_info_extra={"version": "2.2+" + LABEL})  # == 2.2.0+...
    assert not [p for p in wheelcheck.agreement_problems(wheel) if "build info version" in p]
    _rewrite(wheel, f"sageattention-2.2.0+{LABEL}.dist-info/METADATA",
             lambda data: data.replace(b"Name: sageattention", b"Name: other"))
    assert "METADATA Name 'other' != file name project sageattention" in \
        wheelcheck.agreement_problems(wheel)


# -- index: what manifest it reads ------------------------------------------------------------------

def test_index_and_release_agree_on_the_manifest_schema():
    assert index.MANIFEST_SCHEMA_VERSION == release.MANIFEST_SCHEMA_VERSION


@pytest.mark.parametrize("edit,words", [
    (lambda m: m.update(schema_version=2), "manifest schema_version 2 is not supported: this index "
                                           "reads schema_version 1"),
    (lambda m: m.update(schema_version=True), "manifest schema_version True is not supported"),
    (lambda m: m["wheels"][0].update(filename="notawheel.whl"),
     "manifest wheels[0]: 'filename' 'notawheel.whl' is not a wheel file name"),
])
def test_index_cli_refuses_a_manifest_it_cannot_read(tmp_path, capsys, edit, words):
    name = fx.wheel_filename(LABEL, fx.LINUX_311)
    manifest = {"schema_version": 1, "project": "sageattention",
                "wheels": [{"filename": name, "sha256": "a" * 64}]}
    edit(manifest)
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    site = tmp_path / "site"
    assert index.main(["--manifest", str(tmp_path / "m.json"), "--out", str(site)]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert not site.exists()


def test_a_report_of_another_schema_version_is_named_as_such_alone(tmp_path):
    # A schema_version 2 report was refused with eight problems, seven of them about fields of
    # this format that another format need not have.
    path = tmp_path / "r.report.json"
    path.write_text('{"schema_version": 2}')
    with pytest.raises(reports.ReportError) as exc:
        reports.load_report(path)
    assert str(exc.value) == (f"{path} is not a valid report: schema_version 2 is not supported "
                              "(this code reads schema_version 1; write the report again with "
                              "this checkout's validate step)")
