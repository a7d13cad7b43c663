"""Validate wheels on this machine's GPU and write one report per wheel.

    python -m scripts.factory.validate --wheel dist/sageattention-...whl --system
    nox -s validate-sm90 -- --wheel dist/sageattention-...whl

Two ways to install a wheel:

* default: ``<python> -m pip install WHEEL``, then a forced reinstall of this exact file without
  dependencies, into the environment of ``--python`` (default: the interpreter running this,
  e.g. the one running nox);
* ``--system``: no venv, no network: reuse the torch already installed for ``--python``,
  ``pip install --no-deps --no-index --target <tmp> WHEEL`` and run the suite with that directory
  first on PYTHONPATH (GPU runners are often offline).

The suite runs in a subprocess started in an empty directory, so a source checkout never shadows
the wheel; the report is refused if the suite imported sageattention from anywhere else. Without
a GPU nothing is installed and the command refuses. Exit status: 0 every check passed or was
skipped, 1 a check failed (the report is still written), 2 refused, 3 install or suite crashed,
4 the wheel is for another Python, OS or (--system) torch than the interpreter (nothing installed);
with several wheels, the worst of them (4 only where the others passed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from packaging.version import Version

from scripts.factory import report as reports
from scripts.factory.labels import LocalLabel
from scripts.factory.release import os_of_platform_tag

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "release_notes"

EXIT_OK, EXIT_CHECK_FAILED, EXIT_REFUSED, EXIT_CRASHED = 0, 1, 2, 3
# The wheel is for another Python, OS or (with --system) torch than the interpreter here: not a
# fault of the wheel nor of this machine, so CI can tell it from a refusal (wheels.yml).
EXIT_NOT_HERE = 4
INSTALL_TIMEOUT_S = 900.0

# Runs in the target interpreter; prints what the refusal message needs.
PROBE = ("import json, sys\n"
         "here = {'python': '%d.%d' % sys.version_info[:2], 'platform': sys.platform}\n"
         "try:\n"
         "    import torch\n"
         "except Exception as exc:\n"
         "    print(json.dumps({**here, 'torch': None, 'error': repr(exc)})); sys.exit(0)\n"
         "import importlib.util\n"
         "ok = torch.cuda.is_available()\n"
         "print(json.dumps({**here, 'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
         "                  'cuda_available': ok,\n"
         "                  'pip': importlib.util.find_spec('pip') is not None,\n"
         "                  'devices': torch.cuda.device_count() if ok else 0}))\n")


class Refused(Exception):
    """Validation cannot run here; the message says why and what to do."""


class NotHere(Refused):
    """The wheel is for another interpreter, OS or torch than the one that would run it."""


def interpreter_problem(wheel: Path, info: dict, *, system: bool) -> str | None:
    """Why ``wheel`` cannot be installed into the interpreter ``info`` describes (probe()), or
    None: its CPython tag, its OS and, with --system (the torch there is reused), its torch
    major.minor must be that interpreter's."""
    _name, version, _build, tags = reports.parse_wheel_name(wheel.name)
    wants, have = [], []
    pythons = {t.interpreter for t in tags}
    here_py = info.get("python")
    major_minor = Version(here_py).release[:2] if here_py else None
    if major_minor and f"cp{major_minor[0]}{major_minor[1]}" not in pythons:
        wants.append(f"CPython {', '.join(sorted(pythons))}")
        have.append(f"Python {here_py}")
    oses = {os_of_platform_tag(t.platform) for t in tags}
    here_os = {"win32": "windows", "linux": "linux"}.get(info.get("platform"), info.get("platform"))
    if here_os and here_os not in oses:
        wants.append(" or ".join(sorted(oses)))
        have.append(here_os)
    if system and info.get("torch") and version.local:
        try:
            built = LocalLabel.parse(version.local).torch
        except ValueError:
            built = None  # not a factory label: the suite's own checks say so
        torch_here = Version(info["torch"]).release[:2]
        if built is not None and tuple(built) != torch_here:
            wants.append(f"torch {built[0]}.{built[1]}")
            have.append(f"torch {info['torch']}")
    if not wants:
        return None
    return (f"{wheel.name} is for {', '.join(wants)}; the interpreter here has "
            f"{', '.join(have)}: nothing was installed. Validate it with an interpreter that "
            "matches (--python)" + (", or without --system so that pip installs its torch"
                                    if system and any(w.startswith("torch") for w in wants)
                                    else ""))


@dataclass
class Step:
    what: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # added to the inherited environment
    cwd: str | None = None


def _seconds(text: str) -> float:
    """argparse type of --timeout: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _interpreter(text: str) -> str:
    """argparse type of --python: an executable, as a path or a name on PATH."""
    found = shutil.which(text)
    if found is None or not Path(found).is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not an executable interpreter; give its "
                                         "path or a name on PATH, e.g. python3.12")
    return found


def wheel_problem(wheel: Path) -> str | None:
    """Why ``wheel`` cannot be validated at all (checked for every wheel before any work), or
    None: it must be an existing sageattention wheel file."""
    try:
        name = reports.parse_wheel_name(wheel.name)[0]
    except reports.ReportError as exc:
        return str(exc)
    if name != "sageattention":
        return (f"{wheel.name} is a {name} wheel, not a sageattention one; nothing of it is "
                "installed")
    if not wheel.is_file():
        return f"no such wheel file: {wheel}" + (" (it is a folder)" if wheel.is_dir() else "")
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m scripts.factory.validate",
        description="Install a sageattention wheel, run the GPU validation suite against it and "
                    "write release_notes/<wheel stem>.report.json (bound to the wheel's sha256). "
                    "Refuses without a GPU.",
        epilog=f"exit codes: {EXIT_OK} every check passed or was skipped; {EXIT_CHECK_FAILED} a "
               f"check failed (the report is still written); {EXIT_REFUSED} refused (bad "
               f"arguments, no GPU, not a sageattention wheel, a suite result that makes no valid "
               f"report, a report it could not write; "
               f"nothing installed); "
               f"{EXIT_CRASHED} the install or the suite crashed or ran past --timeout; "
               f"{EXIT_NOT_HERE} the wheel is for another Python, OS or (--system) torch than "
               "--python's (nothing installed). With several wheels, the worst of them.")
    p.add_argument("wheels", nargs="*", type=Path, metavar="WHEEL",
                   help="wheel files to validate (same as --wheel)")
    p.add_argument("--wheel", action="append", type=Path, help="a wheel file to validate "
                   "(repeatable)")
    p.add_argument("--system", action="store_true",
                   help="reuse the preinstalled torch: no venv, no network (pip --no-deps "
                        "--no-index --target into a temporary directory)")
    p.add_argument("--python", type=_interpreter, default=sys.executable,
                   help="interpreter to install into and run the suite with (default: this one)")
    p.add_argument("--out-dir", type=reports.output_dir, default=DEFAULT_OUT,
                   help=f"where the report goes (default: {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true", help="pass --quick to the suite")
    p.add_argument("--timeout", type=_seconds, default=1800.0, metavar="SECONDS",
                   help="stop a suite run that takes longer than this (default: 1800)")
    p.add_argument("--no-performance", action="store_true", help="leave out the benchmark")
    p.add_argument("--only", nargs="+", action="extend", metavar="ID",
                   help="run only these checks")
    p.add_argument("--skip", nargs="+", action="extend", metavar="ID",
                   help="leave these checks out")
    return p


def suite_args(args, suite_json: str) -> list[str]:
    extra = ["--json", suite_json]
    if args.quick:
        extra.append("--quick")
    if args.no_performance:
        extra.append("--no-performance")
    if args.only:
        extra += ["--only", *args.only]
    if args.skip:
        extra += ["--skip", *args.skip]
    return extra


def plan(args, wheel: Path, workdir: Path, *, has_pip: bool = True) -> list[Step]:
    """The commands that install ``wheel`` and run the suite (pure: nothing runs here).

    ``--system`` without pip (a bare runner) unpacks the wheel with the stdlib's zipfile: a
    wheel is a zip whose root is the import root, so that is enough to import it.
    """
    py, wheel = args.python, str(Path(wheel).resolve())
    run_dir = workdir / "run"  # empty: `python -m` puts the cwd first on sys.path
    suite = [py, "-m", "sageattention.validation",
             *suite_args(args, str(workdir / "suite.json"))]
    isolate = {"PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1"}
    if args.system:
        target = workdir / "site"
        install = (Step("install (no deps, no index)",
                        [py, "-m", "pip", "install", "--no-deps", "--no-index",
                         "--disable-pip-version-check", "--target", str(target), wheel])
                   if has_pip else
                   Step("unpack (no pip here)", [py, "-m", "zipfile", "-e", wheel, str(target)]))
        return [
            install,
            Step("suite", suite, {**isolate, "PYTHONPATH": str(target)}, str(run_dir)),
        ]
    return [
        Step("install", [py, "-m", "pip", "install", "--disable-pip-version-check", wheel]),
        Step("reinstall this exact file", [py, "-m", "pip", "install", "--force-reinstall",
                                           "--no-deps", "--disable-pip-version-check", wheel]),
        Step("suite", suite, isolate, str(run_dir)),
    ]


def probe(python: str, runner: Callable = subprocess.run) -> dict:
    """torch version and GPU count as seen by ``python``."""
    res = runner([python, "-c", PROBE], capture_output=True, text=True, timeout=300)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"torch": None, "error": (res.stderr or res.stdout).strip()[-500:]}


def gpu_listed(runner: Callable = subprocess.run) -> bool:
    """Whether nvidia-smi lists an NVIDIA GPU: what can be asked before torch is installed."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        res = runner([exe, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return res.returncode == 0 and "GPU" in (res.stdout or "")


def require_gpu(info: dict, python: str, *, installed: bool) -> None:
    """Refuse unless ``python`` imports torch and sees a GPU (``installed``: after the install)."""
    if info.get("torch") is None:
        if installed:
            raise Refused(f"{python} cannot import torch after installing the wheel "
                          f"({info.get('error')})")
        raise Refused(f"--system reuses a preinstalled torch, but {python} cannot import "
                      f"torch ({info.get('error')}); install torch there or drop --system")
    if not info.get("cuda_available") or not info.get("devices"):
        raise Refused(f"no CUDA GPU is visible to {python} (torch {info['torch']}, "
                      f"torch.cuda.is_available() is False): validation runs the wheel's kernels "
                      f"and needs a GPU; run it on a GPU runner")


def _execute(step: Step, runner: Callable, timeout: float | None = None) -> int:
    env = {**os.environ, **step.env}
    if "PYTHONPATH" in step.env and os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = step.env["PYTHONPATH"] + os.pathsep + os.environ["PYTHONPATH"]
    print(f"== {step.what}: {shlex.join(step.argv)}", flush=True)
    try:
        return runner(step.argv, env=env, cwd=step.cwd, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        # A hung kernel cannot be stopped from inside the suite's process; this one ends it.
        print(f"error: {step.what} did not finish within {timeout:.0f} s", file=sys.stderr)
        return EXIT_CRASHED


def _imported_from_wheel(suite: dict, args, workdir: Path) -> str | None:
    """Why the suite did not test the wheel's own code, or None when it did."""
    path = (suite.get("package") or {}).get("path")
    if not path:
        return "the suite did not say where it imported sageattention from"
    where = Path(path).resolve()
    if args.system and not where.is_relative_to((workdir / "site").resolve()):
        return f"the suite imported sageattention from {where}, not from the wheel's directory"
    if where.is_relative_to(REPO.resolve()) and not where.is_relative_to(workdir.resolve()):
        return f"the suite imported the source checkout ({where}) instead of the wheel"
    return None


def read_suite(path: Path) -> dict:
    """The suite's result document; ReportError (no report can be made) unless it is a JSON
    object."""
    try:
        suite = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise reports.ReportError(f"the suite's result (--json) is not valid JSON ({exc}): no "
                                  "report can be made from it") from None
    if not isinstance(suite, dict):
        raise reports.ReportError(f"the suite's result (--json) is a JSON "
                                  f"{type(suite).__name__}, not an object: no report can be "
                                  "made from it")
    return suite


def validate_wheel(wheel: Path, args, command: str, runner: Callable) -> int:
    """Install one wheel, run the suite against it, write its report; return the exit status."""
    try:
        problem = wheel_problem(wheel)
        if problem:
            raise Refused(problem)
        # Nothing gets installed on a machine that cannot validate. (Without --system, torch
        # may only arrive with the wheel; then the GPU is probed after the install.)
        first = probe(args.python, runner)
        torch_later = not args.system and first.get("torch") is None
        if not torch_later:
            require_gpu(first, args.python, installed=False)
        elif not gpu_listed(runner):
            raise Refused(f"{args.python} has no torch yet and nvidia-smi lists no NVIDIA GPU: "
                          "validation runs the wheel's kernels and needs a GPU; run it on a GPU "
                          "runner (nothing was installed)")
        # a GPU machine, but maybe not this wheel's interpreter (CI sends every cell to it)
        mismatch = interpreter_problem(wheel, first, system=args.system)
        if mismatch:
            raise NotHere(mismatch)
        with tempfile.TemporaryDirectory(prefix="sageattention-validate-") as tmp:
            workdir = Path(tmp)
            (workdir / "run").mkdir()
            rc = None
            for step in plan(args, wheel, workdir, has_pip=first.get("pip", True)):
                if step.what == "suite" and torch_later:
                    require_gpu(probe(args.python, runner), args.python, installed=True)
                rc = _execute(step, runner,
                              args.timeout if step.what == "suite" else INSTALL_TIMEOUT_S)
                if step.what != "suite" and rc != 0:
                    print(f"error: {step.what} failed (exit {rc})", file=sys.stderr)
                    return EXIT_CRASHED
            if rc == EXIT_REFUSED:
                print("refused: the suite declined to run (see above)", file=sys.stderr)
                return EXIT_REFUSED
            suite_path = workdir / "suite.json"
            if rc not in (0, 1) or not suite_path.exists():
                print(f"error: the suite crashed or timed out (exit {rc}) without a result",
                      file=sys.stderr)
                return EXIT_CRASHED
            suite = read_suite(suite_path)
            shadow = _imported_from_wheel(suite, args, workdir)
            if shadow:
                raise Refused(shadow)
            doc = reports.build_report(suite, wheel=reports.wheel_identity(wheel),
                                       command=command,
                                       mode="system" if args.system else "install")
    except NotHere as exc:
        print(f"not validated here: {exc}", file=sys.stderr)
        return EXIT_NOT_HERE
    except (Refused, reports.ReportError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    try:
        path = reports.write_report(doc, args.out_dir)
    except OSError as exc:  # a read-only or full --out-dir: not "a check failed" (1)
        print(f"refused: cannot write the report into {args.out_dir} "
              f"({exc.strerror or exc}); the run's results are lost: validate again with a "
              "writable --out-dir", file=sys.stderr)
        return EXIT_REFUSED
    s = doc["summary"] or {}
    print(f"wrote {path}: execution {doc['execution']}, {s.get('pass')} passed, "
          f"{s.get('fail')} failed, {s.get('skip')} skipped")
    return EXIT_OK if s.get("all_passed") else EXIT_CHECK_FAILED


def main(argv: list[str] | None = None, runner: Callable = subprocess.run) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    wheels = [*args.wheels, *(args.wheel or [])]
    taken = [i for i in (args.only or []) + (args.skip or []) if i.endswith(".whl")]
    if taken:  # `--only fp16 W.whl`: nargs="+" reads the wheel as a check id
        parser.error(f"--only/--skip take check ids, not wheels ({', '.join(taken)}); name "
                     "wheels with --wheel PATH or before --only/--skip")
    if not wheels:
        parser.error("name at least one wheel (--wheel PATH or PATH)")
    # Every wheel is checked before the first one is installed: a typo in the last name must
    # not cost the others' runs first.
    seen, writes = set(), {}
    for wheel in map(Path, wheels):
        problem = wheel_problem(wheel) or (f"{wheel} is named twice" if wheel.resolve() in seen
                                           else None)
        target = None if problem else args.out_dir / reports.report_filename(wheel.name)
        if target in writes:  # the second report would replace the first
            problem = (f"{wheel} and {writes[target]} would both write {target}; validate them "
                       "with different --out-dir")
        elif target is not None:
            try:
                reports.refuse_folder_targets([target])
            except reports.ReportError as exc:
                problem = str(exc)
        if problem:
            print(f"refused: {problem}", file=sys.stderr)
            return EXIT_REFUSED
        seen.add(wheel.resolve())
        writes[target] = wheel
    command = shlex.join(["python", "-m", "scripts.factory.validate",
                          *(sys.argv[1:] if argv is None else argv)])
    # The worst outcome wins: crashed > refused > a check failed > all passed; a wheel for
    # another interpreter (4) only where every other one passed.
    results = [validate_wheel(Path(w), args, command, runner) for w in wheels]
    worst = max((r for r in results if r != EXIT_NOT_HERE), default=EXIT_OK)
    return EXIT_NOT_HERE if EXIT_NOT_HERE in results and worst == EXIT_OK else worst


if __name__ == "__main__":
    sys.exit(main())
