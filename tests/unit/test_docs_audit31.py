"""Documentation audit 31: the factory's command lines as README.md and docs/release.md give them.

Each test failed before its fix: `plan --sm 75` answered "write e.g. 'sm80'" alone; `nox -s build-sm75
-- --cell ID` blamed an `--sm` the user never typed; `python -m scripts.factory.release` printed
its usage as `nox -s release --`, a command the GPU runner (no nox there) cannot run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from noxfile_module import FakeSession, load_noxfile
from scripts.factory import cli, release

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("spelling", ["75", "sm_75", "7.5", "compute_75"])
def test_plan_sm_in_another_spelling_names_the_one_it_accepts(spelling, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", "--sm", spelling])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"not an SM: {spelling!r}; write e.g. 'sm80'; did you mean 'sm75'?" in err


def test_plan_sm_that_is_no_sm_in_any_spelling_still_shows_the_form(capsys):
    with pytest.raises(SystemExit):
        cli.main(["plan", "--sm", "turing"])
    assert "not an SM: 'turing'; write e.g. 'sm80'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--cell", "linux-cp311-torch2.14-cu130-sm75"],
                                  ["--no-repair", "--sm=sm90"]])
def test_build_session_says_it_is_the_sm_selection(argv, capsys):
    session = FakeSession(*argv)
    with pytest.raises(SystemExit):
        load_noxfile()._build_session(75)(session)
    assert len(session.errors) == 1
    message = session.errors[0]
    assert message.startswith("build-sm75 builds every sm75 cell")
    assert "python -m scripts.factory build --cell ID" in message
    assert "not allowed with argument --sm" not in capsys.readouterr().err


def test_release_usage_names_the_command_that_runs_without_nox():
    parser = release.build_parser()
    assert parser.prog == "python -m scripts.factory.release"
    assert parser.format_usage().startswith("usage: python -m scripts.factory.release ")
