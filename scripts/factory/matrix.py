"""Load and validate build_matrix.yaml (schema version 1) into frozen cells.

Every problem found is reported at once, each naming the entry, the cell and the field.
See README.md, "The build matrix", for the format.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from packaging.version import InvalidVersion, Version

from . import arch
from .arch import REPO_ROOT
from .errors import FactoryError, MatrixError, exit_codes
from .labels import LocalLabel
from .model import OSES, Cell, Matrix, Target

DEFAULT_MATRIX = REPO_ROOT / "build_matrix.yaml"
SCHEMA_VERSION = 1

TOP_KEYS = {"version": "schema version (1)", "runners": "runner labels",
            "cells": "list of cell groups"}
RUNNER_KEYS = {"build": "OS -> labels", "validate": "SM -> labels"}
GROUP_KEYS = {"name": "group name", "os": "linux/windows", "python": "'3.12'",
              "torch": "'2.12.0'", "cuda": "'13.0'", "sm": "SM targets",
              "runners": "per-group runner override"}
EXAMPLES = {"os": "linux", "python": '"3.12"', "torch": '"2.12.0"', "cuda": '"13.0"',
            "sm": "[sm80]"}
REQUIRED_GROUP_KEYS = ("os", "python", "torch", "cuda", "sm")
# Fields that name a major.minor only, and why a patch there breaks the build: the factory looks
# for python3.X on PATH, and CI installs the toolkit cuda-nvcc-X-Y and torch from .../whl/cuXY.
MAJOR_MINOR_ONLY = {"python": "the CPython minor the wheel is for (python3.X builds it)",
                    "cuda": "torch's CUDA build (cu130 is 13.0; CI installs that toolkit and "
                            "torch's cuXY build from it)"}
# Names people reach for first, mapped to ours (checked before fuzzy matching).
KEY_ALIASES = {"arch": "sm", "archs": "sm", "sms": "sm", "targets": "sm", "sm_targets": "sm",
               "platform": "os", "pythons": "python", "cuda_version": "cuda",
               "torch_version": "torch", "schema_version": "version"}


def _unknown_keys(found: Mapping, allowed: Mapping, where: str) -> list[str]:
    problems = []
    for key in found:
        if key in allowed:
            continue
        alias = KEY_ALIASES.get(str(key))
        hint = [alias] if alias in allowed else difflib.get_close_matches(str(key), list(allowed),
                                                                          n=1)
        did_you_mean = f"; did you mean {hint[0]!r}?" if hint else ""
        problems.append(f"{where}: unknown key {key!r}{did_you_mean} "
                        f"(accepted: {', '.join(allowed)})")
    return problems


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list) else [value]


def _version_string(value: Any, field: str, where: str, problems: list[str]) -> str | None:
    # YAML reads 3.10 as the float 3.1, so versions must be quoted strings. The number cannot
    # say how it was written (3.1 or 3.10?), so the hint is the example, not the number quoted.
    if value is None:
        problems.append(f"{where}: field {field!r} has no value; write e.g. "
                        f"{field}: {EXAMPLES[field]}")
        return None
    if not isinstance(value, str):
        problems.append(f"{where}: field {field!r}: {value!r} must be a quoted string "
                        f"(YAML reads unquoted 3.10 as the number 3.1); quote the version as "
                        f"you meant it, e.g. {field}: {EXAMPLES[field]}")
        return None
    try:
        version = Version(value)
    except InvalidVersion:
        problems.append(f"{where}: field {field!r}: {value!r} is not a version")
        return None
    if len(version.release) < 2:
        problems.append(f"{where}: field {field!r}: {value!r} needs a major and a minor version, "
                        f"e.g. {field}: {EXAMPLES[field]}")
        return None
    # A cell pins a release (torch==X.Y.*): a nightly or release candidate would be built and
    # labelled as the final release it predates, which it is not ABI-compatible with.
    if version.is_devrelease or version.is_prerelease:
        kind = "a development (nightly) build" if version.is_devrelease else "a pre-release"
        problems.append(f"{where}: field {field!r}: {value!r} is {kind}; the matrix builds "
                        f"against final releases only, e.g. {field}: \"{version.base_version}\"")
        return None
    if version.local:
        # The cell's own cuda field says which CUDA build of torch it uses; a label here would be
        # installed as written (pip install torch==2.14.1+cu128) even where it disagrees.
        why = ("the cell's 'cuda' field names torch's CUDA build" if field == "torch"
               else "versions in the matrix are plain releases")
        problems.append(f"{where}: field {field!r}: {value!r} has a local label "
                        f"(+{version.local}); {why}: write {field}: \"{version.public}\"")
        return None
    if field in MAJOR_MINOR_ONLY and len(version.release) > 2:
        short = ".".join(map(str, version.release[:2]))
        problems.append(f"{where}: field {field!r}: {value!r} has a patch version, but it names "
                        f"{MAJOR_MINOR_ONLY[field]}: write {field}: \"{short}\"")
        return None
    label_problem = _label_problem(field, value)
    if label_problem:
        problems.append(f"{where}: field {field!r}: {value!r} cannot be written in the wheel's "
                        f"local label: {label_problem}")
        return None
    return value


def _label_problem(field: str, value: str) -> str | None:
    """Why the local label rule (sageattention/build_info.py) cannot spell ``value``, or None.

    The rule is asked itself (it spells CUDA 13.0 as cu130, so a minor must be one digit) rather
    than restating its limits here; the other parts of the probe label are placeholders.
    """
    if field not in ("torch", "cuda"):
        return None
    torch, cuda = (value, "0.0") if field == "torch" else ("0.0", value)
    try:
        LocalLabel.create((0,), torch, cuda)
    except ValueError as exc:
        return str(exc)
    return None


def _runner_labels(value: Any, where: str, problems: list[str]) -> tuple[str, ...]:
    labels = _as_list(value)
    if not labels or not all(isinstance(x, str) and x for x in labels):
        problems.append(f"{where}: runner labels must be a non-empty string or list of strings,"
                        f" got {value!r}")
        return ()
    return tuple(labels)


def _parse_runners(raw: Any, where: str, problems: list[str]) -> tuple[dict, dict]:
    if raw is None:
        return {}, {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: 'runners' must be a mapping with keys build, validate")
        return {}, {}
    problems += _unknown_keys(raw, RUNNER_KEYS, f"{where}.runners")
    build, validate = {}, {}
    for key, meaning in RUNNER_KEYS.items():
        if not isinstance(raw.get(key) or {}, dict):
            problems.append(f"{where}.runners.{key}: must be a mapping {meaning}, got "
                            f"{raw[key]!r}")
            raw = {**raw, key: {}}
    for os_name, labels in (raw.get("build") or {}).items():
        if os_name not in OSES:
            problems.append(f"{where}.runners.build: unknown OS {os_name!r} "
                            f"(accepted: {', '.join(OSES)})")
            continue
        build[os_name] = _runner_labels(labels, f"{where}.runners.build.{os_name}", problems)
    for sm_name, labels in (raw.get("validate") or {}).items():
        try:
            target = Target.parse(sm_name)
        except ValueError as exc:
            problems.append(f"{where}.runners.validate: {exc}")
            continue
        validate[target.sm] = _runner_labels(labels, f"{where}.runners.validate.{sm_name}",
                                             problems)
    return build, validate


def _parse_wheel_targets(entry: Any, where: str, problems: list[str]):
    """One entry of ``sm``: 'sm80' or 'sm75+PTX' (one-SM wheel) or a list (one multi-SM wheel)."""
    names = entry if isinstance(entry, list) else [entry]
    try:
        targets = sorted(Target.parse(n) for n in names)
    except ValueError as exc:
        problems.append(f"{where}: field 'sm': {exc}")
        return None
    if len({t.sm for t in targets}) != len(targets) or not targets:
        problems.append(f"{where}: field 'sm': {entry!r} names an SM twice or none")
        return None
    return tuple(targets)


def _cell_problems(cell: Cell, families: Mapping[str, arch.Family]) -> list[str]:
    """Impossible combinations in one cell, each naming the field at fault."""
    problems = []
    torch_problem = arch.torch_cuda_problem(cell.torch, cell.cuda)
    if torch_problem:
        problems.append(f"field 'cuda': {torch_problem}")
    python_problem = arch.torch_python_problem(cell.torch, cell.python)
    if python_problem:
        problems.append(f"field 'python': {python_problem}")
    for target in cell.targets:
        compile_problem = arch.sm_compile_problem(target.sm, cell.cuda)
        if compile_problem:
            problems.append(f"field 'sm' ({target}): {compile_problem}")
            continue
        serving = [f for f in families.values() if target.sm in f.serves]
        if not serving:
            served = sorted({s for f in families.values() for s in f.serves})
            problems.append(f"field 'sm' ({target}): no kernel family serves sm{target.sm} "
                            f"(families.json serves: {', '.join(f'sm{s}' for s in served)})")
        for fam in serving:
            if Version(arch.major_minor(cell.cuda)) < Version(fam.min_nvcc):
                problems.append(f"field 'cuda': target {target} needs kernel family "
                                f"{fam.name} (ops {fam.extension}), which needs CUDA >= "
                                f"{fam.min_nvcc}; cell has CUDA {cell.cuda}")
    return problems


def parse_matrix(data: Any, source: str = "build_matrix.yaml",
                 families: Mapping[str, arch.Family] | None = None) -> Matrix:
    """Validate parsed YAML and expand it into cells. Raises MatrixError listing every problem."""
    families = arch.load_families() if families is None else families
    problems: list[str] = []
    if not isinstance(data, dict):
        raise MatrixError("the file must be a mapping with keys version, runners, cells", source)
    problems += _unknown_keys(data, TOP_KEYS, "top level")
    # type(...) is int: YAML's `true` and `1.0` compare equal to 1 but are no schema version
    if type(data.get("version")) is not int or data.get("version") != SCHEMA_VERSION:
        problems.append(f"top level: 'version' must be {SCHEMA_VERSION}, got "
                        f"{data.get('version')!r}")
    build_runners, validate_runners = _parse_runners(data.get("runners"), "top level", problems)
    groups = data.get("cells")
    if not isinstance(groups, list) or not groups:
        problems.append("top level: 'cells' must be a non-empty list of cell groups")
        groups = []

    cells: list[Cell] = []
    first_seen: dict[str, str] = {}
    for index, group in enumerate(groups):
        where = f"cells[{index}]"
        if not isinstance(group, dict):
            problems.append(f"{where}: must be a mapping with keys {', '.join(GROUP_KEYS)}")
            continue
        if group.get("name"):
            where += f" ({group['name']})"
        problems += _unknown_keys(group, GROUP_KEYS, where)
        missing = [k for k in REQUIRED_GROUP_KEYS if k not in group]
        if missing:
            problems.append(f"{where}: missing field(s) {', '.join(missing)}")
            continue
        group_build, group_validate = _parse_runners(group.get("runners"), where, problems)
        oses = []
        for os_name in _as_list(group["os"]):
            if os_name in OSES:
                oses.append(os_name)
            else:
                hint = difflib.get_close_matches(str(os_name), OSES, n=1)
                problems.append(f"{where}: field 'os': {os_name!r} is not supported "
                                f"(accepted: {', '.join(OSES)})"
                                + (f"; did you mean {hint[0]!r}?" if hint else ""))
        versions = {}
        for field in ("python", "torch", "cuda"):
            values = [_version_string(v, field, where, problems) for v in _as_list(group[field])]
            versions[field] = [v for v in values if v is not None]
        wheel_targets = [_parse_wheel_targets(e, where, problems) for e in _as_list(group["sm"])]
        wheel_targets = [t for t in wheel_targets if t is not None]
        for field in ("os", "python", "torch", "cuda", "sm"):
            if _as_list(group[field]) == []:
                problems.append(f"{where}: field {field!r} is an empty list, so the group "
                                f"builds nothing; give at least one value, e.g. "
                                f"{field}: {EXAMPLES[field]}")

        for os_name, py, torch, cuda, targets in itertools.product(
                oses, versions["python"], versions["torch"], versions["cuda"], wheel_targets):
            runners = {**validate_runners, **group_validate}
            cell = Cell(os=os_name, python=py, torch=torch, cuda=cuda, targets=targets,
                        build_runner=group_build.get(os_name, build_runners.get(os_name, ())),
                        validate_runners={t.sm: runners[t.sm] for t in targets
                                          if t.sm in runners},
                        group=str(group.get("name", "")))
            cell_where = f"{where} cell {cell.id}"
            cell_problems = _cell_problems(cell, families)
            problems += [f"{cell_where}: {p}" for p in cell_problems]
            if cell.id in first_seen:
                problems.append(f"{cell_where}: duplicate cell (same wheel name as in "
                                f"{first_seen[cell.id]}); cells that differ only in '+PTX' or "
                                "in the torch patch version build the same wheel")
                continue
            first_seen[cell.id] = where
            if not cell_problems:
                cells.append(cell)
    if problems:
        raise MatrixError(problems, source)
    return Matrix(version=SCHEMA_VERSION, cells=tuple(cells), source=source)


def load_matrix(path: str | Path = DEFAULT_MATRIX) -> Matrix:
    path = Path(path)
    try:
        import yaml
    except ImportError as exc:
        raise FactoryError("reading build_matrix.yaml needs PyYAML: pip install pyyaml "
                           "(on an offline runner, carry its wheel)") from exc
    try:
        text = path.read_text("utf-8")
    except OSError as exc:
        raise MatrixError(f"cannot read the file: {exc.strerror}", str(path)) from exc
    except UnicodeDecodeError as exc:  # a binary file, or another encoding: YAML is UTF-8 here
        raise MatrixError(f"not UTF-8 text ({exc.reason} at byte {exc.start}); save the "
                          "matrix as UTF-8 YAML", str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MatrixError(f"not valid YAML: {exc}", str(path)) from exc
    return parse_matrix(data, source=str(path))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.factory matrix",
        description="Validate build_matrix.yaml and print its cells.",
        epilog=exit_codes(MatrixError))
    parser.add_argument("--check", metavar="FILE", type=Path,
                        help="validate FILE instead of the repository's build_matrix.yaml")
    parser.add_argument("--json", action="store_true",
                        help="print the expanded cells as JSON (for a CI job matrix)")
    args = parser.parse_args(argv)
    try:
        matrix = load_matrix(args.check or DEFAULT_MATRIX)
    except FactoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps({"schema_version": matrix.version,
                          "cells": [c.to_json() for c in matrix.cells]}, indent=2))
    else:
        print(f"{matrix.source}: OK, {len(matrix.cells)} cells, SMs "
              + ", ".join(f"sm{s}" for s in matrix.sms()))
        for cell in matrix.cells:
            print(f"  {cell.id:45s} torch {cell.torch:8s} targets {' '.join(cell.sm_targets)}")
    return 0
