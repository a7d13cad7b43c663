"""Validation reports: the versioned JSON that binds a wheel (file name and sha256) to one run.

A report is ``release_notes/<wheel file name without .whl>.report.json``. It is built from the
suite's result document (``python -m sageattention.validation --json``) plus the wheel's identity,
checked, and written atomically. The fields other code relies on (docs/architecture.md):
``schema_version``, ``wheel.filename``, ``wheel.sha256``, ``environment.gpu_name``,
``environment.compute_capability``, ``execution``, ``expectation.native_backends[]`` (``name``,
``ptx_arch``), ``build_info``, ``checks[]`` (``name``, ``status``, ``backend``),
``performance.cases[]`` (``speedup_vs_sdpa``), ``performance.geomean_speedup_vs_sdpa``.
The other fields a note or chart states are type-checked here too (``_check_stated_fields``), so a
report that loads always renders.
Stdlib and ``packaging`` only: it runs on offline GPU runners.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from packaging.tags import parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from scripts.factory.labels import LocalLabel, expectation

SCHEMA_VERSION = 1
REPORT_SUFFIX = ".report.json"
EXECUTIONS = ("native", "ptx-jit")
STATUSES = ("pass", "fail", "skip")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CAPABILITY = re.compile(r"^\d+\.\d+$")
# platform tag prefix -> platform.system() of a run that may validate such a wheel
_PLATFORM_OS = (("win", "Windows"), ("manylinux", "Linux"), ("musllinux", "Linux"),
                ("linux", "Linux"), ("macosx", "Darwin"))


class ReportError(ValueError):
    """A report (or the wheel it names) is not what it must be; the message lists why."""


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def parse_wheel_name(filename: str):
    """``packaging``'s parse of a wheel file name, with an error that says what is accepted."""
    try:
        return parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise ReportError(f"{filename!r} is not a wheel file name ({exc}); expected "
                          f"'<name>-<version>-<python tag>-<abi tag>-<platform tag>.whl'") from None


def report_filename(wheel_filename: str) -> str:
    """``sageattention-2.2.0+sm75...-linux_x86_64.whl`` -> ``<same without .whl>.report.json``."""
    parse_wheel_name(wheel_filename)
    return Path(wheel_filename).stem + REPORT_SUFFIX


def check_report_name(report_path: Path, doc: dict) -> None:
    """A report must be named after the wheel it validated (notes and charts are named from it,
    and the release pairs them by name): ReportError otherwise."""
    expected = report_filename(doc["wheel"]["filename"])
    if Path(report_path).name != expected:
        raise ReportError(f"{report_path}: a report for {doc['wheel']['filename']} must be named "
                          f"{expected}")


def wheel_stem(wheel_filename: str) -> str:
    parse_wheel_name(wheel_filename)
    return Path(wheel_filename).stem


def wheel_os(wheel_filename: str) -> str | None:
    """The OS (as platform.system() names it) a wheel's platform tags are for; None if any."""
    _, _, _, tags = parse_wheel_name(wheel_filename)
    systems = {system for tag in tags for prefix, system in _PLATFORM_OS
               if tag.platform.startswith(prefix)}
    return systems.pop() if len(systems) == 1 else None


def wheel_identity(path: str | os.PathLike) -> dict:
    path = Path(path)
    name, version, build, tags = parse_wheel_name(path.name)
    return {
        "filename": path.name,
        "sha256": sha256_file(path),
        "size": path.stat().st_size,
        "name": str(name),
        "version": str(version),
        "tags": sorted(str(t) for t in tags),
    }


def build_report(suite: dict, *, wheel: dict, command: str, mode: str) -> dict:
    """The report for ``wheel`` (from :func:`wheel_identity`) from the suite's result document."""
    build_info = suite.get("build_info")
    _same_version(wheel, build_info, suite.get("package"))
    report = {
        "schema_version": SCHEMA_VERSION,
        "wheel": wheel,
        "run": {
            "command": command,
            "mode": mode,
            "suite_command": suite.get("environment", {}).get("command"),
            "suite_version": suite.get("suite_version"),
            "profile": suite.get("profile"),
            "duration_s": suite.get("duration_s"),
            "written": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        },
        "environment": suite.get("environment", {}),
        "execution": suite.get("execution"),
        "expectation": suite.get("expectation"),
        "build_info": build_info,
        "package": suite.get("package"),
        "families": suite.get("families"),
        "backends_table": suite.get("backends_table"),
        "checks": suite.get("checks", []),
        "summary": suite.get("summary"),
        "accuracy": suite.get("accuracy"),
        "performance": suite.get("performance") or {"cases": [], "geomean_speedup_vs_sdpa": None},
    }
    problems = validate_report(report)
    if problems:
        raise ReportError("the suite's result does not make a valid report:\n  "
                          + "\n  ".join(problems))
    return report


def _same_version(wheel: dict, build_info: dict | None, package: Any) -> None:
    if build_info is None:  # every wheel carries its build info; a source tree has none
        where = package.get("path") if isinstance(package, dict) else None
        raise ReportError(f"the suite ran a sageattention without build info (a source tree, "
                          f"at {where or 'an unreported path'}), not the wheel "
                          f"{wheel['filename']}: another installation shadowed the wheel")
    try:
        inside = Version(str(build_info.get("version")))
    except InvalidVersion:
        raise ReportError(f"the installed package's build info has no valid version: "
                          f"{build_info.get('version')!r}") from None
    if inside != Version(wheel["version"]):
        raise ReportError(f"the suite ran sageattention {inside}, but the wheel is "
                          f"{wheel['filename']} ({wheel['version']}): another installation "
                          f"shadowed the wheel")


def validate_report(doc: Any) -> list[str]:
    """Everything wrong with a report, as sentences; an empty list means it is valid."""
    if not isinstance(doc, dict):
        return [f"a report is a JSON object, got {type(doc).__name__}"]
    problems: list[str] = []
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        problems.append("schema_version must be an integer")
    elif version != SCHEMA_VERSION:
        # another format: its other fields are not this one's to judge, so they are not listed
        return [f"schema_version {version} is not supported (this code reads schema_version "
                f"{SCHEMA_VERSION}; write the report again with this checkout's validate step)"]
    wheel = doc.get("wheel")
    filename = None
    if not isinstance(wheel, dict):
        problems.append("wheel must be an object with filename and sha256")
    else:
        filename = wheel.get("filename")
        try:
            parsed = parse_wheel_name(str(filename))
        except ReportError as exc:
            problems.append(f"wheel.filename: {exc}")
            filename = None
        else:
            problems += _wheel_fields_agree(wheel, parsed)
        if not isinstance(wheel.get("sha256"), str) or not _SHA256.match(wheel["sha256"]):
            problems.append("wheel.sha256 must be 64 lower-case hex digits")
    env = doc.get("environment")
    if not isinstance(env, dict):
        problems.append("environment must be an object")
        env = {}
    if not isinstance(env.get("gpu_name"), str) or not env.get("gpu_name"):
        problems.append("environment.gpu_name must be a non-empty string")
    cap = env.get("compute_capability")
    if not isinstance(cap, str) or not _CAPABILITY.match(cap):
        problems.append(f"environment.compute_capability must look like '9.0', got {cap!r}")
    if doc.get("execution") not in EXECUTIONS:
        problems.append(f"execution must be one of {EXECUTIONS}, got {doc.get('execution')!r}")
    problems += _check_checks(doc.get("checks"))
    problems += _check_summary(doc.get("summary"), doc.get("checks"))
    problems += _check_performance(doc.get("performance"))
    problems += _check_stated_fields(doc, env)
    if filename is not None:
        problems += _run_fits_wheel(doc, filename, env)
    return problems


def _wheel_fields_agree(wheel: dict, parsed) -> list[str]:
    """The other fields wheel_identity writes (name, version, tags) name the file wheel.filename
    names: a report whose version or tags are another wheel's was made for another file (a copy
    renamed, or a stale report), whatever its filename says. Absent fields, or empty tags, were not
    recorded and say nothing."""
    name, version, _build, tags = parsed
    filename = wheel["filename"]
    problems = []
    if "name" in wheel and not (isinstance(wheel["name"], str)
                                and canonicalize_name(wheel["name"]) == name):
        problems.append(f"wheel.name {wheel['name']!r} is not the project of {filename} "
                        f"({name}): the report contradicts itself")
    if "version" in wheel:
        try:
            same = Version(str(wheel["version"])) == version
        except InvalidVersion:
            same = False
        if not same:
            problems.append(f"wheel.version {wheel['version']!r} is not the version of {filename} "
                            f"({version}): the report was made for another wheel")
    stated = wheel.get("tags")
    if stated:
        try:
            stated_tags = {t for text in stated for t in parse_tag(text)}
        except (TypeError, ValueError, AttributeError):
            stated_tags = None
        if stated_tags is None:
            problems.append(f"wheel.tags must be a list of tags such as "
                            f"'cp312-cp312-linux_x86_64', got {stated!r}")
        elif stated_tags != set(tags):
            problems.append(f"wheel.tags {sorted(map(str, stated_tags))} are not the tags of "
                            f"{filename} ({', '.join(sorted(map(str, tags)))}): the report was "
                            "made for another wheel")
    return problems


def _torch_cuda_problem(filename: str, env: dict, wanted: tuple[int, int]) -> list[str]:
    """environment.torch's local label says which CUDA that torch was built for (+cu130), or that
    it has none (+cpu): it must be the wheel's CUDA, or the note would state two CUDA versions."""
    try:
        local = Version(env["torch"]).local if isinstance(env.get("torch"), str) else None
    except InvalidVersion:
        return []  # said by _check_stated_fields
    match = re.fullmatch(r"cu(\d+)(\d)", local or "")
    if match and (int(match[1]), int(match[2])) != wanted:
        return [f"the wheel {filename} is for CUDA {wanted[0]}.{wanted[1]}, but the run's torch "
                f"{env['torch']} is a build for CUDA {match[1]}.{match[2]}: a report only covers "
                "the wheel it ran"]
    if local == "cpu":
        return [f"the run's torch {env['torch']} is a CPU-only build: it cannot have run the "
                f"CUDA kernels of {filename}"]
    return []


def _major_minor(text: Any) -> tuple[int, int] | None:
    m = re.match(r"^\s*(\d+)\.(\d+)", text) if isinstance(text, str) else None
    return (int(m[1]), int(m[2])) if m else None


def _run_fits_wheel(doc: dict, filename: str, env: dict) -> list[str]:
    """A report only covers the wheel it ran: the run's OS, torch, CUDA and Python must be the ones
    the wheel's name is for, and its execution the one the wheel's SMs allow on the run's GPU
    ('native' needs a SASS target of the label for that compute capability; anything else ran
    PTX through the driver's JIT, which checks a code path, not that architecture's hardware)."""
    problems = []
    expected = wheel_os(filename)
    if isinstance(env.get("os"), str) and expected is not None and env["os"] != expected:
        # A Windows wheel never inherits a Linux run's results, nor the reverse.
        problems.append(f"the wheel {filename} is for {expected}, but the run was on "
                        f"{env['os']}: a report only covers the wheel it ran")
    _, version, _, tags = parse_wheel_name(filename)
    try:
        label = LocalLabel.parse(version.local or "")
    except ValueError:
        label = None  # not a factory name: nothing more the name can say
    if label is not None:
        for key, wanted, what in (("torch", label.torch, "torch"),
                                  ("cuda_runtime", label.cuda, "CUDA")):
            ran = _major_minor(env.get(key))
            if ran is not None and ran != wanted:
                problems.append(f"the wheel {filename} is for {what} {wanted[0]}.{wanted[1]}, but "
                                f"the run used {what} {env[key]}: a report only covers the "
                                "wheel it ran")
        problems += _torch_cuda_problem(filename, env, label.cuda)
        cap = _major_minor(env.get("compute_capability"))
        if cap is not None and doc.get("execution") == "native" and not any(
                expectation().sass_runs_on(sm, cap[0] * 10 + cap[1]) for sm in label.sms):
            problems.append(f"execution is 'native', but the wheel's SMs "
                            f"({', '.join(f'sm{sm}' for sm in label.sms)}) have no SASS for "
                            f"compute capability {cap[0]}.{cap[1]}: there it can only run PTX "
                            "through the driver's JIT (ptx-jit)")
    problems += _native_needs_sass(doc, env)
    stated = doc.get("expectation")
    if isinstance(stated, dict) and stated.get("execution") not in (None, doc.get("execution")):
        problems.append(f"execution is {doc.get('execution')!r}, but expectation.execution is "
                        f"{stated.get('execution')!r}: the report contradicts itself")
    python = _major_minor(env.get("python"))
    cpython = {t.interpreter for t in tags if re.fullmatch(r"cp\d+", t.interpreter)
               and t.abi != "abi3"}
    if python is not None and cpython and f"cp{python[0]}{python[1]}" not in cpython:
        problems.append(f"the wheel {filename} is for {', '.join(sorted(cpython))}, but the run "
                        f"used Python {env['python']}: a report only covers the wheel it ran")
    return problems


def _native_needs_sass(doc: dict, env: dict) -> list[str]:
    """'native' also needs SASS for the run's GPU among the SM targets the build info lists (the
    ones a note names as the code that ran), not only among the label's."""
    info = doc.get("build_info")
    targets = info.get("sm_targets") if isinstance(info, dict) else None
    cap = _major_minor(env.get("compute_capability"))
    if doc.get("execution") != "native" or cap is None or not _text_list(targets) or not targets:
        return []
    try:
        sms = [expectation().parse_target(t).sm for t in targets]
    except ValueError:
        return []  # said by _check_build_info
    if any(expectation().sass_runs_on(sm, cap[0] * 10 + cap[1]) for sm in sms):
        return []
    return [f"execution is 'native', but build_info.sm_targets ({', '.join(targets)}) have no "
            f"SASS for compute capability {cap[0]}.{cap[1]}: there it can only run PTX through "
            "the driver's JIT (ptx-jit)"]


def _check_checks(checks: Any) -> list[str]:
    if not isinstance(checks, list) or not checks:
        return ["checks must be a non-empty list"]
    problems, seen = [], set()
    for i, check in enumerate(checks):
        where = f"checks[{i}]"
        if not isinstance(check, dict):
            problems.append(f"{where} must be an object")
            continue
        name = check.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name must be a non-empty string")
        elif name in seen:
            problems.append(f"{where}.name {name!r} appears twice")
        seen.add(name)
        status = check.get("status")
        if status not in STATUSES:
            problems.append(f"{where}.status must be one of {STATUSES}, got {status!r}")
        elif status != "pass" and not isinstance(check.get("reason"), str):
            problems.append(f"{where} ({name}) is {status} without a reason")
        elif status == "pass" and (failed := _failed_parts(check)):
            problems.append(f"{where} ({name}) is pass, but {failed}: the report "
                            "contradicts itself (a check with a failure fails)")
        if "backend" not in check or not isinstance(check["backend"], (str, type(None))):
            problems.append(f"{where}.backend must be a string or null")
        problems += _check_check_details(where, check)
    return problems


def _failed_parts(check: dict) -> str | None:
    """What in a check record failed (its failures list, a compared case not ok), or None."""
    failures = check.get("failures")
    cases = check.get("cases") if isinstance(check.get("cases"), list) else []
    bad = [c.get("label", "?") for c in cases if isinstance(c, dict) and c.get("ok") is False]
    if isinstance(failures, list) and failures:
        return f"it lists {len(failures)} failure(s) ({failures[0]})"
    if bad:
        return f"its case(s) {', '.join(map(str, bad[:3]))} did not pass"
    return None


def _check_summary(summary: Any, checks: Any) -> list[str]:
    """``summary.all_passed`` sets validate's exit status: it must say what the checks say."""
    if summary is None:
        return []
    if not isinstance(summary, dict):
        return [f"summary must be an object or null, got {type(summary).__name__}"]
    stated = summary.get("all_passed")
    if stated is not None and not isinstance(stated, bool):
        return [f"summary.all_passed must be true or false, got {stated!r}"]
    if stated is None or not isinstance(checks, list):  # no claim, or no checks (said above)
        return []
    failed = [str(c.get("name", "?")) for c in checks
              if isinstance(c, dict) and c.get("status") == "fail"]
    if stated == (not failed):
        return []
    said = (f"{len(failed)} check(s) failed ({', '.join(failed)})" if failed
            else "no check failed")
    return [f"summary.all_passed is {str(stated).lower()}, but {said}: the report contradicts "
            "itself"]


# -- what a run proves ----------------------------------------------------------------------------
# One rule for the release (which publishes only a validated wheel) and the notes (which must not
# say "verified" of a run the release refuses).

def ran_backends(check: dict) -> list[str]:
    """The backends a check says ran (its ``backends`` list, else its ``backend``)."""
    ran = check.get("backends")
    if isinstance(ran, list) and ran:
        return [str(b) for b in ran]
    return [check["backend"]] if isinstance(check.get("backend"), str) and check["backend"] else []


def is_native_kernel(backend: str) -> bool:
    """A CUDA kernel of the wheel (``cuda-sm90-fp16``), not the SDPA fallback nor a Triton kernel."""
    return backend.startswith("cuda-")


def own_backends(report: Any) -> list[str] | None:
    """The wheel's CUDA kernels the run had to run on its GPU (expectation.native_backends' names,
    from the wheel's build info and family table), or None when the report does not say."""
    expected = report.get("expectation") if isinstance(report, dict) else None
    backends = expected.get("native_backends") if isinstance(expected, dict) else None
    if not isinstance(backends, list):
        return None
    names = [b.get("name") for b in backends if isinstance(b, dict)]
    return [n for n in names if isinstance(n, str) and n] or None


def unproven(checks: Any, own: list[str] | None = None) -> list[str]:
    """Why a run's checks validate nothing, as sentences (empty: none failed, and some passed on
    the wheel's own CUDA kernels). A pass proves only what ran: a passed check that names no
    backend proves nothing; one marked native that ran anything but the wheel's CUDA kernels
    claims a native result from a fallback; and a wheel is validated only if some passed check ran
    one of its CUDA kernels (the SDPA fallback and the Triton kernels prove nothing about them).
    ``own`` (own_backends): the wheel's kernels on that GPU; a CUDA kernel not among them (another
    installation's, another family's) is not this wheel's. None: any CUDA kernel counts."""
    checks = [c for c in checks if isinstance(c, dict)] if isinstance(checks, list) else []
    is_own = is_native_kernel if not own else own.__contains__
    reasons = []
    failed = [str(c.get("name", "?")) for c in checks if c.get("status") == "fail"]
    if failed:
        shown = ", ".join(failed[:5]) + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        reasons.append(f"validation failed: {len(failed)} check(s) failed ({shown})")
    passed = [c for c in checks if c.get("status") == "pass"]
    if not passed:
        reasons.append("no check passed")
    unnamed = [str(c.get("name", "?")) for c in passed if not ran_backends(c)]
    if unnamed:
        reasons.append(f"passed check(s) that do not say which backend ran: {', '.join(unnamed)}")
    theirs = f" (this wheel's on that GPU: {', '.join(own)})" if own else ""
    fallback = [f"{c.get('name', '?')} ({', '.join(ran_backends(c))})" for c in passed
                if c.get("native") is True and ran_backends(c)
                and not all(map(is_own, ran_backends(c)))]
    if fallback:
        reasons.append(f"native check(s) passed on a backend other than the wheel's CUDA "
                       f"kernels: {'; '.join(fallback)}{theirs}")
    if passed and not any(is_own(b) for c in passed for b in ran_backends(c)):
        ran = sorted({b for c in passed for b in ran_backends(c)})
        reasons.append(f"no passed check ran a CUDA kernel of this wheel (only "
                       f"{', '.join(ran) or 'no backend'}): a fallback's pass does not validate "
                       f"native kernels{theirs}")
    return reasons


# -- the fields a note, a chart or a release states ---------------------------------------------
# scripts/factory/notes.py and chart.py format these fields without checking them again: a report
# that passes here must render, so every type they rely on is checked here, once.

_ENV_TEXT = ("os", "os_release", "machine", "python", "python_implementation", "torch",
             "cuda_runtime", "driver", "triton", "date")
_FAMILY_TEXT_LISTS = ("ops", "qk_quant_gran", "pv_accum_dtype", "serves")


def _number(x: Any) -> bool:
    return _number_or_none(x) and x is not None


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _text_or_none(x: Any) -> bool:
    return x is None or isinstance(x, str)


def _text_list(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(i, str) for i in x)


def _version_problem(where: str, text: Any) -> list[str]:
    try:
        Version(text)
    except (InvalidVersion, TypeError):
        return [f"{where} must be a version such as '2.11.0+cu130', got {text!r}"]
    return []


def _check_stated_fields(doc: dict, env: dict) -> list[str]:
    problems = [f"environment.{key} must be a string or null, got {env[key]!r}"
                for key in _ENV_TEXT if not _text_or_none(env.get(key))]
    if isinstance(env.get("torch"), str):
        problems += _version_problem("environment.torch", env["torch"])
    problems += _check_gpu_sm(env)
    problems += _check_build_info(doc.get("build_info"))
    run = doc.get("run")
    if "run" in doc and not (isinstance(run, dict) and _text_or_none(run.get("command"))):
        problems.append("run must be an object whose command is a string")
    expected = doc.get("expectation")
    if expected is not None:
        backends = expected.get("native_backends") if isinstance(expected, dict) else None
        if not isinstance(expected, dict) or not isinstance(backends, (list, type(None))) or any(
                not isinstance(b, dict) or not _text_or_none(b.get("ptx_arch"))
                for b in backends or []):
            problems.append("expectation must be an object whose native_backends is a list of "
                            "objects with ptx_arch a string or null")
    problems += _check_families(doc.get("families"))
    problems += _check_backends_table(doc.get("backends_table"))
    problems += _check_accuracy(doc.get("accuracy"))
    return problems


def _check_gpu_sm(env: dict) -> list[str]:
    gpu_sm = env.get("gpu_sm")
    if gpu_sm is None:
        return []
    if not isinstance(gpu_sm, str) or not re.fullmatch(r"sm\d{2,3}", gpu_sm):
        return [f"environment.gpu_sm must look like 'sm90', got {gpu_sm!r}"]
    cap = _major_minor(env.get("compute_capability"))
    if cap is not None and gpu_sm != f"sm{cap[0]}{cap[1]}":
        return [f"environment.gpu_sm {gpu_sm!r} is not compute capability "
                f"{env['compute_capability']}: the report contradicts itself"]
    return []


def _check_build_info(info: Any) -> list[str]:
    if info is None:
        return []
    if not isinstance(info, dict):
        return [f"build_info must be an object or null, got {type(info).__name__}"]
    problems = []
    targets = info.get("sm_targets")
    if targets is not None:
        if not _text_list(targets):
            problems.append(f"build_info.sm_targets must be a list of strings, got {targets!r}")
        else:
            for i, text in enumerate(targets):
                try:  # the suite's own rule for a target (validation/expectation.py)
                    expectation().parse_target(text)
                except ValueError as exc:
                    problems.append(f"build_info.sm_targets[{i}]: {exc}")
    if info.get("torch") is not None:
        problems += _version_problem("build_info.torch", info["torch"])
    for key in ("cuda", "git_commit", "build_date", "cell_id"):
        if not _text_or_none(info.get(key)):
            problems.append(f"build_info.{key} must be a string or null, got {info[key]!r}")
    compilers = info.get("compilers")
    if compilers is not None and not (isinstance(compilers, dict)
                                      and all(isinstance(v, str) for v in compilers.values())):
        problems.append(f"build_info.compilers must be an object of strings, got {compilers!r}")
    if info.get("families") is not None and not _text_list(info["families"]):
        problems.append(f"build_info.families must be a list of strings, got "
                        f"{info['families']!r}")
    return problems


def _check_families(families: Any) -> list[str]:
    if families is None:
        return []
    if not isinstance(families, dict) or not all(isinstance(s, dict) for s in families.values()):
        return ["families must be an object of family tables (objects) or null"]
    problems = []
    for name, spec in families.items():
        for key in _FAMILY_TEXT_LISTS:
            if key in spec and not _text_list(spec[key]):
                problems.append(f"families[{name!r}].{key} must be a list of strings")
        if "head_dims" in spec and not (isinstance(spec["head_dims"], list)
                                        and all(map(_int, spec["head_dims"]))):
            problems.append(f"families[{name!r}].head_dims must be a list of integers")
    return problems


def _check_backends_table(table: Any) -> list[str]:
    if table is None:
        return []
    if not isinstance(table, list):
        return ["backends_table must be a list or null"]
    problems = []
    for i, row in enumerate(table):
        where = f"backends_table[{i}]"
        if not isinstance(row, dict):
            problems.append(f"{where} must be an object")
            continue
        if not isinstance(row.get("name"), str) or not _text_or_none(row.get("kind")):
            problems.append(f"{where}.name and .kind must be strings")
        low = row.get("min_capability")
        if low is not None and not (isinstance(low, list) and len(low) == 2
                                    and all(map(_int, low))):
            problems.append(f"{where}.min_capability must be [major, minor] or null, got {low!r}")
        if row.get("max_batch_and_heads") is not None and not _int(row["max_batch_and_heads"]):
            problems.append(f"{where}.max_batch_and_heads must be an integer or null")
    return problems


def _check_accuracy(acc: Any) -> list[str]:
    if acc is None:
        return []
    if not isinstance(acc, dict):
        return [f"accuracy must be an object (backend -> figures) or null, got "
                f"{type(acc).__name__}"]
    problems = []
    for backend, figures in acc.items():
        where = f"accuracy[{backend!r}]"
        if not isinstance(figures, dict):
            problems.append(f"{where} must be an object")
            continue
        missing = [k for k in ("min_cosine", "median_cosine", "max_rel_l1", "median_rel_l1")
                   if not _number(figures.get(k))]
        if missing:
            problems.append(f"{where} lacks the figure(s) {', '.join(missing)} (numbers)")
        if not _int(figures.get("cases")):
            problems.append(f"{where}.cases must be an integer")
    return problems


def _check_check_details(where: str, check: dict) -> list[str]:
    """The parts of a check a note states beyond name, status and backend."""
    problems = []
    if not _text_or_none(check.get("reason")):
        problems.append(f"{where}.reason must be a string or null")
    if check.get("backends") is not None and not _text_list(check["backends"]):
        problems.append(f"{where}.backends must be a list of strings, got {check['backends']!r}")
    elif check.get("backends") and isinstance(check.get("backend"), str) \
            and check["backend"] != ", ".join(check["backends"]):
        # the note prints backend, the release judges backends: they must say one thing
        problems.append(f"{where}.backend {check['backend']!r} is not its backends "
                        f"{check['backends']!r}: the report contradicts itself")
    errors = check.get("errors")
    if errors is not None:
        if not isinstance(errors, dict) or any(
                not _number_or_none(errors.get(k)) for k in ("cosine", "rel_l1", "max_abs")) \
                or not isinstance(errors.get("finite", True), bool):
            problems.append(f"{where}.errors must be an object of cosine, rel_l1, max_abs "
                            f"(numbers or null) and finite (true/false), got {errors!r}")
    return problems


def _check_performance_details(perf: dict) -> list[str]:
    """The parts of the performance section a note or chart states beyond the speed-ups."""
    problems = []
    for key in ("method", "error", "skipped"):
        if not _text_or_none(perf.get(key)):
            problems.append(f"performance.{key} must be a string or null")
    rounds = perf.get("rounds")
    if rounds is not None and not (_int(rounds) and rounds >= 1):
        problems.append(f"performance.rounds must be a positive integer, got {rounds!r}")
    timer = perf.get("timer")
    if timer is not None and not (isinstance(timer, dict) and _number_or_none(
            timer.get("warmup_ms")) and _number_or_none(timer.get("rep_ms"))):
        problems.append(f"performance.timer must be an object of warmup_ms and rep_ms "
                        f"(numbers), got {timer!r}")
    by_backend = perf.get("geomean_speedup_vs_sdpa_by_backend")
    if by_backend is not None and not (isinstance(by_backend, dict)
                                       and all(map(_number_or_none, by_backend.values()))):
        problems.append(f"performance.geomean_speedup_vs_sdpa_by_backend must be an object of "
                        f"numbers or null (backend -> figure), got {by_backend!r}")
    acc = perf.get("accuracy")
    if acc is not None and not (isinstance(acc, dict) and all(
            _number_or_none(acc.get(k)) for k in ("min_cosine", "max_rel_l1", "max_abs"))
            and (acc.get("min_cosine") is None) == (acc.get("max_rel_l1") is None)):
        problems.append(f"performance.accuracy must be an object whose min_cosine and "
                        f"max_rel_l1 are both numbers or both null, got {acc!r}")
    cases = perf.get("cases") if isinstance(perf.get("cases"), list) else []
    for i, case in enumerate(cases):
        if not isinstance(case, dict):
            continue  # said above
        if "name" in case and not isinstance(case["name"], str):  # the chart prints it
            problems.append(f"performance.cases[{i}].name must be a string")
        for key in ("backend", "error"):
            if not _text_or_none(case.get(key)):
                problems.append(f"performance.cases[{i}].{key} must be a string or null")
        for key in ("sdpa_tops", "sageattn_tops"):
            if not _number_or_none(case.get(key)):
                problems.append(f"performance.cases[{i}].{key} must be a number or null")
    return problems


def _number_or_none(x: Any) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)
                         and math.isfinite(x))


def _check_performance(perf: Any) -> list[str]:
    if not isinstance(perf, dict):
        return ["performance must be an object"]
    problems = []
    cases = perf.get("cases")
    if not isinstance(cases, list):
        problems.append("performance.cases must be a list")
    else:
        for i, case in enumerate(cases):
            if not isinstance(case, dict) or not _number_or_none(case.get("speedup_vs_sdpa")) \
                    or "speedup_vs_sdpa" not in case:
                problems.append(f"performance.cases[{i}].speedup_vs_sdpa must be a number or "
                                f"null")
    if "geomean_speedup_vs_sdpa" not in perf or not _number_or_none(
            perf.get("geomean_speedup_vs_sdpa")):
        problems.append("performance.geomean_speedup_vs_sdpa must be a number or null")
    problems += _check_performance_details(perf)
    if not problems:
        problems += _geomeans_come_from_cases(perf)
    return problems


def _geomean(values) -> float | None:
    """The benchmark's geometric mean (sageattention/benchmark.py): over the cases that ran."""
    vals = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def _geomeans_come_from_cases(perf: dict) -> list[str]:
    """Every geometric mean a report states is the one its own cases give: a speed-up figure with
    no measured case behind it (or another figure than the cases') is not a result."""
    cases = perf["cases"]
    claims = [("performance.geomean_speedup_vs_sdpa", perf["geomean_speedup_vs_sdpa"],
               _geomean(c.get("speedup_vs_sdpa") for c in cases))]
    by_backend = perf.get("geomean_speedup_vs_sdpa_by_backend") or {}
    if isinstance(by_backend, dict):
        claims += [(f"performance.geomean_speedup_vs_sdpa_by_backend[{name!r}]", value,
                    _geomean(((c.get("backends") or {}).get(name) or {}).get("speedup_vs_sdpa")
                             for c in cases if isinstance(c.get("backends"), dict)))
                   for name, value in by_backend.items()]
    problems = []
    for where, stated, derived in claims:
        same = (stated is None and derived is None) or (
            isinstance(stated, (int, float)) and derived is not None
            and math.isclose(stated, derived, rel_tol=1e-4))
        if not same:
            problems.append(f"{where} is {stated!r}, but the cases' speed-ups give "
                            f"{'no figure' if derived is None else f'{derived:.6g}'}: a speed-up "
                            "must come from the cases measured")
    return problems


def load_report(path: str | os.PathLike) -> dict:
    """Read and validate a report; ReportError names the file and every problem."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"{path}: no such report") from None
    except IsADirectoryError:
        raise ReportError(f"{path} is a folder; name a {REPORT_SUFFIX} file") from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the report ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not valid JSON ({exc})") from None
    problems = validate_report(doc)
    if len(problems) == 1:
        raise ReportError(f"{path} is not a valid report: {problems[0]}")
    if problems:
        raise ReportError(f"{path} is not a valid report:\n  " + "\n  ".join(problems))
    return doc


def verify_wheel(report: dict, wheel_path: str | os.PathLike) -> None:
    """Check that ``report`` is the report of exactly this wheel file (name and sha256)."""
    wheel_path = Path(wheel_path)
    bound = report["wheel"]
    if wheel_path.name != bound["filename"]:
        raise ReportError(f"the report is for {bound['filename']}, not {wheel_path.name}")
    actual = sha256_file(wheel_path)
    if actual != bound["sha256"]:
        raise ReportError(f"{wheel_path.name}: sha256 {actual} differs from the report's "
                          f"{bound['sha256']}: the wheel changed after validation; validate it "
                          f"again")


def write_report(report: dict, out_dir: str | os.PathLike) -> Path:
    """Validate, then write ``<out_dir>/<wheel stem>.report.json`` atomically."""
    problems = validate_report(report)
    if problems:
        raise ReportError("refusing to write an invalid report:\n  " + "\n  ".join(problems))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / report_filename(report["wheel"]["filename"])
    atomic_write_text(target, json.dumps(report, indent=2, allow_nan=False) + "\n")
    return target


def atomic_write_text(target: Path, text: str) -> None:
    """Write to a temporary file beside ``target``, then rename: readers never see half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def output_dir(text: str) -> Path:
    """argparse type of a folder a command writes into (created if missing): a path that is, or
    lies under, a file, or under a folder this process cannot write in, is refused before any
    work, not after it."""
    path = Path(text)
    existing = _nearest_existing(path)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == path else f"lies under the file {existing}"
        raise argparse.ArgumentTypeError(f"{text!r} {where}; name a folder (it is created if "
                                         "missing)")
    _refuse_unwritable(text, existing, "a folder where you can write")
    return path


def output_file(text: str) -> Path:
    """argparse type of a file a command writes (its folder is created if missing): a folder, a
    path under a file, or one under a folder this process cannot write in, is refused before any
    work, not after it."""
    path = Path(text)
    existing = _nearest_existing(path)
    if existing == path and path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; name the file to write")
    if existing is not None and existing != path and not existing.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} lies under the file {existing}; name the "
                                         "file to write")
    _refuse_unwritable(text, existing.parent if existing == path else existing,
                       "a file in a folder you can write")
    return path


def _refuse_unwritable(text: str, folder: Path | None, instead: str) -> None:
    """Refuse, before any work, an output whose nearest existing folder this process may not
    write in (a read-only checkout, another user's folder): found after a long build or GPU run,
    it cost the run."""
    if folder is not None and folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"{text!r}: cannot write in {folder} (no permission, or a read-only file system); "
            f"name {instead}")


def refuse_folder_targets(targets: list[Path]) -> None:
    """Raise ReportError when a file a command would write is a folder: refused before any file is
    written (os.replace onto a folder fails after the others)."""
    folders = [t for t in targets if t.is_dir()]
    if folders:
        raise ReportError(f"{', '.join(map(str, folders))} is a folder where a file is written; "
                          "move it away or write elsewhere with --out-dir")


def refuse_shared_targets(targets: list[Path]) -> None:
    """Raise ReportError when two reports would write one file (the second over the first)."""
    twice = sorted({str(t) for t in targets if targets.count(t) > 1})
    if twice:
        raise ReportError(f"two reports would write {', '.join(twice)}; name each wheel's report "
                          "once (or write them to different --out-dir)")


def _nearest_existing(path: Path) -> Path | None:
    return next((p for p in (path, *path.parents) if p.exists()), None)
