"""An audit of python -m sageattention.benchmark and python -m sageattention.calibrate as a user meets
them: the command a benchmark JSON records, outputs written whole, and --help's examples."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import torch

from sageattention import benchmark, calibrate, dispatch


def test_the_benchmark_json_records_a_command_that_runs(monkeypatch):
    # under `python -m sageattention.benchmark` sys.argv[0] is the module's file, and the JSON said
    # `python .../sageattention/benchmark.py --json x.json`, which fails (relative imports)
    assert benchmark.command_line(["--seq-len", "1024", "--json", "a b.json"]) == shlex.join(
        [sys.executable, "-m", "sageattention.benchmark", "--seq-len", "1024", "--json", "a b.json"])


def _fake_gpu_run(monkeypatch):
    """main() as far as writing its JSON, on a faked GPU; the environment captured as on a CPU."""
    from sageattention.validation.api import Api

    monkeypatch.setattr(dispatch, "environment_problems", lambda *a, **k: [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(Api, "from_package", classmethod(lambda cls: None))
    monkeypatch.setattr(benchmark, "run", lambda cases, **k: {
        "method": "synthetic", "rounds": 1, "cases": [], "geomean_speedup_vs_sdpa": None,
        "geomean_speedup_vs_sdpa_by_backend": {}, "complete": True})
    real = benchmark.document
    monkeypatch.setattr(benchmark, "document", lambda result, device: real(result, torch.device("cpu")))


def test_main_records_its_own_arguments_not_the_interpreters(tmp_path, monkeypatch):
    _fake_gpu_run(monkeypatch)
    out = tmp_path / "bench.json"
    # called with argv (a script, a test), the JSON named sys.argv: here pytest's command line
    assert benchmark.main(["--seq-len", "1024", "--also", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["environment"]["command"] == shlex.join(
        [sys.executable, "-m", "sageattention.benchmark", "--seq-len", "1024", "--also", "--json", str(out)])
    assert doc["method"] == "synthetic" and doc["environment"]["torch"] == torch.__version__
    # and from the command line, with sys.argv[0] the module's file
    monkeypatch.setattr(sys, "argv", [benchmark.__file__, "--seq-len", "2048", "--also", "--json", str(out)])
    assert benchmark.main() == 0
    assert json.loads(out.read_text())["environment"]["command"] == shlex.join(
        [sys.executable, "-m", "sageattention.benchmark", "--seq-len", "2048", "--also", "--json", str(out)])


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, OSError])
def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, interrupt):
    # the temporary beside the output (bench.json.tmp), half written, stayed behind
    out = tmp_path / "bench.json"
    out.write_text('{"old": true}')
    real = Path.write_text

    def half(self, text, *a, **k):
        real(self, text[: len(text) // 2], *a, **k)
        raise interrupt("interrupted")

    monkeypatch.setattr(Path, "write_text", half)
    with pytest.raises(interrupt):
        benchmark.write_output(out, json.dumps({"new": list(range(100))}))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]
    assert json.loads(out.read_text()) == {"old": True}


def _examples(parser) -> list[list[str]]:
    text = parser.format_help()
    assert "Examples:" in text
    block = text.split("Examples:\n", 1)[1].split("\n\n", 1)[0]
    return [shlex.split(line, comments=True) for line in block.splitlines()]


@pytest.mark.parametrize("module", [benchmark, calibrate])
def test_help_gives_examples_that_parse(module, capsys):
    # --help had none; each example is printed on its own line and is accepted as written
    parser = module.build_parser()
    examples = _examples(parser)
    assert len(examples) >= 3
    for words in examples:
        assert words[:3] == ["python", "-m", f"sageattention.{module.__name__.rsplit('.', 1)[1]}"]
        parser.parse_args(words[3:])


def test_help_states_the_defaults_a_user_asks_about():
    text = " ".join(benchmark.build_parser().format_help().split())
    assert "the 20 cases of design.md (default)" in text      # --cases
    assert "--also with no name: none" in text                # `--also` alone times no other backend
    assert "command that made it" in text and "Exit status: 0" in text
