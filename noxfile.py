"""nox sessions, registered from build_matrix.yaml. Logic lives in scripts/factory.

    nox -l                      list sessions (build-<sm> and validate-<sm> per matrix SM)
    nox -s build-sm80           build every sm80 cell this host can build
    nox -s tests                the README's test command
"""

# /// script
# dependencies = [
#   "nox>=2025.2.9", "pyyaml>=6", "packaging>=23",
#   "auditwheel; sys_platform == 'linux'", "delvewheel; sys_platform == 'win32'",
# ]
# ///

from __future__ import annotations

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from scripts.factory import cli, matrix  # noqa: E402
from scripts.factory.errors import FactoryError  # noqa: E402

nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests"]
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
try:
    MATRIX = matrix.load_matrix()
except FactoryError as _exc:  # a broken matrix stops here, its problems listed, no traceback
    sys.exit(f"noxfile.py cannot register sessions: {_exc}")


def _call(session: nox.Session, main, argv: list[str]) -> None:
    """Run a factory main(argv) in-process; a non-zero exit fails the session."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's --help or usage error: this session's result, not nox's
        code = exc.code
    if code:
        session.error(f"exit status {code}")


@nox.session(name="matrix", venv_backend="none")
def matrix_session(session: nox.Session) -> None:
    """Validate build_matrix.yaml (-- --check FILE) or print its cells (-- --json)."""
    _call(session, matrix.main, session.posargs)


def _build_session(sm: int):
    def build(session: nox.Session) -> None:
        # the session is the --sm selection: argparse would blame an --sm the user never typed
        chosen = [a for a in session.posargs if a.split("=")[0] in ("--sm", "--cell")]
        if chosen:
            session.error(f"build-sm{sm} builds every sm{sm} cell this host can build; {chosen[0]} "
                          "is not one of its options (--no-repair, --jobs N, --out DIR): for one "
                          "cell run python -m scripts.factory build --cell ID, for another SM "
                          "nox -s build-smXY")
        _call(session, cli.main, ["build", "--sm", f"sm{sm}", *session.posargs])

    build.__doc__ = (f"Build every sm{sm} cell this host can build; prints the plan and why "
                     "other cells skip (-- --no-repair, --jobs N, --out DIR).")
    return build


def _validate_session(sm: int):
    def validate(session: nox.Session) -> None:
        from scripts.factory import validate as validate_module  # validation half
        from scripts.factory.labels import parse_wheel_name

        args = list(session.posargs)
        if not any(a.endswith(".whl") or a in ("-h", "--help") for a in args):
            found = []
            for p in sorted((ROOT / "wheelhouse").glob("sageattention-*.whl")):
                try:
                    sms = parse_wheel_name(p.name).label.sms
                except ValueError as exc:  # not a factory wheel: no SM to match
                    session.warn(f"skipping {exc}")
                    continue
                if sm in sms:
                    found.append(str(p))
            args = found + args
            if not any(a.endswith(".whl") for a in args):
                session.error(f"no sm{sm} wheel in wheelhouse/: run nox -s build-sm{sm} "
                              "first, or pass wheels after --")
        _call(session, validate_module.main, args)

    validate.__doc__ = (f"Validate sm{sm} wheels on this machine's GPU (default: the sm{sm} "
                        "wheels in wheelhouse/); writes release_notes/<wheel>.report.json.")
    return validate


for _sm in MATRIX.sms():
    nox.session(name=f"build-sm{_sm}", venv_backend="none", tags=["build"])(_build_session(_sm))
    nox.session(name=f"validate-sm{_sm}", venv_backend="none", tags=["validate"])(
        _validate_session(_sm))


@nox.session(venv_backend="none")
def notes(session: nox.Session) -> None:
    """Write release_notes/<wheel>.md and .speedup.svg from each report (args go to notes.main)."""
    from scripts.factory import notes as notes_module

    _call(session, notes_module.main, session.posargs)


@nox.session(venv_backend="none")
def release(session: nox.Session) -> None:
    """Assemble the release from validated wheels only (args go to release.main)."""
    from scripts.factory import release as release_module

    _call(session, release_module.main, session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The README's test command (python -m pytest tests/unit -q); -- --wheel FILE adds tests/wheel.

    Runs in a fresh venv with the pyproject 'test' dependency group.
    """
    args = list(session.posargs)
    wheel = None
    for at, arg in enumerate(args):
        if arg == "--wheel" or arg.startswith("--wheel="):
            given = arg.partition("=")[2] if "=" in arg else (args[at + 1:] or [""])[0]
            if not given or given.startswith("-"):
                session.error("--wheel needs a wheel file: nox -s tests -- --wheel FILE")
            wheel = given
            del args[at:at + (1 if "=" in arg else 2)]
            break
    session.install(*nox.project.dependency_groups(PYPROJECT, "test"))
    session.run("python", "-m", "pytest", "tests/unit", "-q", *args)
    if wheel:
        session.run("python", "-m", "pytest", "tests/wheel", "-q", "--wheel", wheel)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (rules in pyproject.toml) on the whole tree."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".", *session.posargs)
