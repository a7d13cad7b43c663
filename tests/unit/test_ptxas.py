"""scripts.factory.ptxas: parsing ptxas -v, and --strict as the guard CI runs on the Hopper kernels."""

from __future__ import annotations

import pytest

from scripts.factory import ptxas
from scripts.factory.errors import ToolchainError

A = "_ZN4sage20attn_wgmma_ws_kernelILi128ELb0EEEvNS_10AttnParamsE"
B = "_ZN4sage20attn_wgmma_ws_kernelILi128ELb1EEEvNS_10AttnParamsE"
Q = "_ZN4sage17quant_int8_kernelI6__halfLi2ELb1EEEvNS_15QuantInt8ParamsE"

# The shape of nvcc 13.0's output for a trace build whose printf serialized the wgmmas (the
# performance notes come first and name their function), trimmed to three kernels.
PTXAS_OUTPUT = f"""\
ptxas info    : 873 bytes gmem
ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to wgmma pipeline crossing function boundary at a function call in the function '{B}'
ptxas info    : Compiling entry function '{A}' for 'sm_90a'
ptxas info    : Function properties for {A}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers
ptxas info    : Compile time = 208.527 ms
ptxas info    : Compiling entry function '{B}' for 'sm_90a'
ptxas info    : Function properties for {B}
    400 bytes stack frame, 36 bytes spill stores, 44 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 400 bytes cumulative stack size
ptxas info    : Compiling entry function '{Q}' for 'sm_90a'
ptxas info    : Function properties for {Q}
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 48 registers, used 0 barriers, 32 bytes cumulative stack size
ptxas /tmp/tmpxft_1.ptx, line 12; warning : Unknown option ignored
"""


def test_parse_attaches_each_figure_and_note_to_its_kernel():
    kernels, loose = ptxas.parse_ptxas(PTXAS_OUTPUT, "sm90_fp8", "attn_hd128.cu")
    by_name = {k.name: k for k in kernels}
    assert list(by_name) == [A, B, Q]
    a, b, q = by_name[A], by_name[B], by_name[Q]
    assert (a.registers, a.stack, a.spill_stores, a.spill_loads, a.notes) == (168, 0, 0, 0, [])
    assert a.problems() == [] and a.target == "sm_90a" and a.family == "sm90_fp8"
    assert (b.stack, b.spill_stores, b.spill_loads) == (400, 36, 44)
    assert len(b.notes) == 1 and b.notes[0].startswith("C7510 Potential Performance Loss: wgmma")
    assert b.problems()[:3] == ["36 bytes spill stores", "44 bytes spill loads", "400 bytes stack frame"]
    assert q.problems() == ["32 bytes stack frame", "warning: Unknown option ignored"]
    assert loose == []


def test_a_note_naming_no_compiled_kernel_is_kept_loose():
    text = ("ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are "
            "serialized in the function '_Zmissing'\n")
    kernels, loose = ptxas.parse_ptxas(text, "sm90", "x.cu")
    assert kernels == [] and len(loose) == 1 and "C7510" in loose[0]


def _fake_report(monkeypatch, text):
    kernels, loose = ptxas.parse_ptxas(text, "sm90_fp8", "attn_hd128.cu")
    monkeypatch.setattr(ptxas, "report", lambda *a, **k: (kernels, loose))
    monkeypatch.setattr(ptxas, "short_name", lambda name: name)


def test_strict_fails_on_a_spill_or_a_note_and_passes_a_clean_selection(monkeypatch, capsys):
    _fake_report(monkeypatch, PTXAS_OUTPUT)
    assert ptxas.main(["--family", "sm90_fp8"]) == 0  # without --strict it only reports
    assert ptxas.main(["--family", "sm90_fp8", "--strict"]) == 1
    out = capsys.readouterr().out
    assert "3 kernels, 2 with spills, a stack frame or a performance note (sm90_fp8)" in out
    assert ptxas.main(["--strict", "--kernel", "Lb0EE"]) == 0  # kernel A alone is clean
    assert "1 kernels, 0 with" in capsys.readouterr().out
    assert ptxas.main(["--strict", "--kernel", "no_such_kernel"]) == 2


def test_json_lists_every_kernel(monkeypatch, tmp_path):
    import json

    _fake_report(monkeypatch, PTXAS_OUTPUT)
    assert ptxas.main(["--json", str(tmp_path / "new" / "k.json")]) == 0
    rows = json.loads((tmp_path / "new" / "k.json").read_text())
    assert [r["name"] for r in rows] == [A, B, Q] and rows[1]["spill_stores"] == 36


def test_unknown_family_is_a_clear_error():
    with pytest.raises(ToolchainError, match="unknown family sm99; families: sm75, sm80"):
        ptxas.report(["sm99"])
    assert ptxas.main(["--family", "sm99"]) == 2


def test_an_sm_no_chosen_family_serves_is_a_clear_error(tmp_path):
    # raised before anything is compiled, so no real nvcc is needed
    with pytest.raises(ToolchainError, match="none of sm90_fp8 serves sm75"):
        ptxas.report(["sm90_fp8"], [75], nvcc=tmp_path / "nvcc")


def test_an_unserved_sm_error_says_which_sms_are_served(tmp_path):
    with pytest.raises(ToolchainError, match="none of sm90_fp8 serves sm75; it serves sm90$"):
        ptxas.report(["sm90_fp8"], [75], nvcc=tmp_path / "nvcc")
    with pytest.raises(ToolchainError, match="serves sm99; they serve sm75, sm80, .*sm90$"):
        ptxas.report(None, [99], nvcc=tmp_path / "nvcc")


@pytest.mark.parametrize("given", ["90", "sm90"])
def test_sm_takes_the_number_or_the_sm_spelling_of_plan_and_build(monkeypatch, given):
    seen = {}

    def fake_report(families, sms, defines, jobs, host=False):
        seen["sms"] = sms
        return [], []

    monkeypatch.setattr(ptxas, "report", fake_report)
    assert ptxas.main(["--sm", given]) == 0
    assert seen["sms"] == [90]


def test_a_malformed_sm_says_what_is_accepted(capsys):
    with pytest.raises(SystemExit) as exc:
        ptxas.main(["--sm", "hopper"])
    assert exc.value.code == 2
    assert "argument --sm: not an SM: 'hopper'; write e.g. 90 or sm90" in capsys.readouterr().err


def test_it_is_a_factory_subcommand(capsys):
    from scripts.factory import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["ptxas", "--help"])
    assert exc.value.code == 0
    assert "--strict" in capsys.readouterr().out


@pytest.mark.parametrize("argv, expected", [
    (["--kernel", "attn_(wgmma"], "argument --kernel: not a regular expression"),
    (["--jobs", "0"], "argument --jobs: must be a positive integer, got '0'"),
    (["--jobs", "-2"], "argument --jobs: must be a positive integer, got '-2'"),
    (["--json", "."], "argument --json: '.' is a folder; name the file to write"),
    (["--json", f"{__file__}/k.json"], f"lies under the file {__file__}"),
    (["-D", "1BAD"], "argument -D: not NAME[=VALUE] with NAME a C identifier: '1BAD'"),
    (["-D", "=1"], "argument -D: not NAME[=VALUE]"),
    (["--family", "sm75", "sm75"], "argument --family: sm75 given twice"),
    (["--sm", "90", "90"], "argument --sm: 90 given twice"),
])
def test_bad_arguments_are_usage_errors_before_anything_compiles(monkeypatch, capsys, argv, expected):
    monkeypatch.setattr(ptxas, "report", lambda *a, **k: pytest.fail("compiled despite a bad argument"))
    with pytest.raises(SystemExit) as exc:
        ptxas.main(argv)
    assert exc.value.code == 2 and expected in capsys.readouterr().err


def test_a_bad_max_jobs_is_a_clear_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MAX_JOBS", "many")
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setattr(ptxas, "find_nvcc", lambda: fake_nvcc)
    assert ptxas.main(["--family", "sm75"]) == 2
    assert "MAX_JOBS must be a positive integer, got 'many'" in capsys.readouterr().err


@pytest.mark.parametrize("host, flag, output", [(False, "-cubin", ".cubin"), (True, "-c", ".o")])
def test_host_compiles_objects_so_launchers_are_compiled_too(monkeypatch, tmp_path, host, flag, output):
    # a fake nvcc that records its arguments and prints ptxas -v's lines for one clean kernel
    log = tmp_path / "args"
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n"
                         f"echo \"ptxas info    : Compiling entry function '{A}' for 'sm_90a'\"\n"
                         f"echo 'ptxas info    : Function properties for {A}'\n"
                         "echo '    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads'\n"
                         "echo 'ptxas info    : Used 168 registers, used 1 barriers'\n")
    fake_nvcc.chmod(0o755)
    kernels, _ = ptxas.report(["sm90"], [90], nvcc=fake_nvcc, jobs=1, host=host)
    calls = log.read_text().splitlines()
    assert calls and kernels and all(k.name == A for k in kernels)
    for call in calls:
        args = call.split()
        assert flag in args and "-Xptxas=-v" in args
        assert ("-cubin" in args) != host and args[args.index("-o") + 1].endswith(output)


def test_progress_is_one_line_per_file_on_stderr(monkeypatch, tmp_path, capsys):
    fake_nvcc = tmp_path / "nvcc"
    fake_nvcc.write_text(f"#!/bin/sh\necho \"ptxas info    : Compiling entry function '{A}' for 'sm_90a'\"\n"
                         "echo 'ptxas info    : Used 168 registers, used 1 barriers'\n")
    fake_nvcc.chmod(0o755)
    lines = []
    kernels, _ = ptxas.report(["sm90"], [90], nvcc=fake_nvcc, jobs=2, log=lines.append)
    files = len(lines) - 1
    assert files >= 1 and lines[0] == f"[kernels ptxas] {files} files of sm90, 2 job(s)"
    assert sorted(int(line.split()[2].split("/")[0]) for line in lines[1:]) == list(range(1, files + 1))
    assert all(f"/{files} sm90/" in line and ": 1 kernels (elapsed " in line for line in lines[1:])
    monkeypatch.setattr(ptxas, "find_nvcc", lambda: fake_nvcc)
    assert ptxas.main(["--family", "sm90", "--sm", "90"]) == 0
    captured = capsys.readouterr()
    assert "[kernels ptxas]" in captured.err and "[kernels ptxas]" not in captured.out


def test_a_second_family_or_sm_option_adds_to_the_first(monkeypatch):
    # `--family sm90 --family sm90_fp8` compiled sm90_fp8 alone: the second replaced the first
    seen = []
    monkeypatch.setattr(ptxas, "report", lambda families, sms, *a, **k: seen.append(
        (families, sms)) or ([], []))
    assert ptxas.main(["--family", "sm90", "--family", "sm90_fp8", "--sm", "90", "--sm", "89"]) == 0
    assert seen == [(["sm90", "sm90_fp8"], [90, 89])]
