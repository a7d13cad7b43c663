"""Check a built wheel: its name, metadata and build info must agree, and its file set
must be exactly what the source tree and its build info predict."""

from __future__ import annotations

import email.parser
import fnmatch
import json
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import arch
from .arch import REPO_ROOT
from .errors import WheelCheckError
from .labels import PROJECT, LocalLabel, WheelIdentity, cell_for_wheel, parse_wheel_name
from .model import Target

if TYPE_CHECKING:
    from .model import Matrix

BUILD_INFO = "sageattention/_build_info.json"
DIST_INFO_FILES = ("METADATA", "WHEEL", "RECORD", "top_level.txt")


def wheel_identity(path: Path) -> WheelIdentity:
    """The factory identity of the wheel file at ``path``; WheelCheckError when it has none."""
    path = Path(path)
    try:
        ident = parse_wheel_name(path.name)
        ident.os  # noqa: B018 - a platform the factory builds for (Linux or Windows)
    except ValueError as exc:
        raise WheelCheckError(str(exc)) from None
    if not path.is_file():
        raise WheelCheckError(f"no such wheel file: {path}")
    return ident


def read_wheel(path: Path) -> tuple[list[str], email.message.Message, dict]:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            meta_name = next((n for n in names if n.endswith(".dist-info/METADATA")
                              and n.count("/") == 1), None)
            if meta_name is None:
                raise WheelCheckError(f"{path.name}: no .dist-info/METADATA")
            metadata = email.parser.Parser().parsestr(zf.read(meta_name).decode("utf-8"))
            if BUILD_INFO not in names:
                raise WheelCheckError(f"{path.name}: no {BUILD_INFO} (not a factory build?)")
            info = json.loads(zf.read(BUILD_INFO))
    except zipfile.BadZipFile as exc:
        raise WheelCheckError(f"{path.name}: not a wheel: {exc} (a wheel is a zip archive)") \
            from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WheelCheckError(f"{path.name}: unreadable METADATA or {BUILD_INFO}: {exc}") \
            from None
    if not isinstance(info, dict):
        raise WheelCheckError(f"{path.name}: {BUILD_INFO} must hold a JSON object, got "
                              f"{type(info).__name__}")
    return names, metadata, info


def agreement_problems(path: Path, matrix: "Matrix | None" = None) -> list[str]:
    """Every disagreement between the wheel's name, METADATA and build info."""
    path = Path(path)
    ident = wheel_identity(path)
    names, metadata, info = read_wheel(path)
    problems = []
    if canonicalize_name(str(metadata["Name"])) != PROJECT:  # pip refuses such a wheel
        problems.append(f"METADATA Name {metadata['Name']!r} != file name project {PROJECT}")
    try:
        meta_version = Version(str(metadata["Version"]))
    except InvalidVersion:
        problems.append(f"METADATA Version {metadata['Version']!r} is not a valid version")
    else:
        if meta_version != ident.version:
            problems.append(f"METADATA version {meta_version} != file name version "
                            f"{ident.version}")
    try:
        info_version = Version(str(info.get("version")))
    except InvalidVersion:
        info_version = None
    if info_version != ident.version:
        problems.append(f"build info version {info.get('version')} != {ident.version}")
    if info.get("local_label") != str(ident.label):
        problems.append(f"build info local_label {info.get('local_label')} != {ident.label}")
    try:
        targets = info.get("sm_targets", [])
        if not isinstance(targets, list):
            raise ValueError(f"sm_targets must be a list such as ['sm75+PTX'], got {targets!r}")
        label_from_info = LocalLabel.create([Target.parse(t).sm for t in targets],
                                            str(info.get("torch", "0.0")),
                                            str(info.get("cuda", "0.0")))
    except ValueError as exc:
        problems.append(f"build info: {exc}")
    else:
        if label_from_info != ident.label:
            problems.append(f"build info (sm_targets {info.get('sm_targets')}, torch "
                            f"{info.get('torch')}, CUDA {info.get('cuda')}) says label "
                            f"{label_from_info}, file name says {ident.label}")
    torch_pins = []
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement as exc:
            problems.append(f"METADATA Requires-Dist {line!r} is not a requirement "
                            f"({str(exc).splitlines()[0]})")
            continue
        if canonicalize_name(requirement.name) == "torch":
            torch_pins.append(requirement)
    wanted_pin = f"=={ident.label.torch[0]}.{ident.label.torch[1]}.*"
    if [str(r.specifier) for r in torch_pins] != [wanted_pin]:
        problems.append(f"METADATA torch requirement {[str(r) for r in torch_pins]} != "
                        f"['torch{wanted_pin}']")
    if info.get("python_tag") != ident.python_tag:
        problems.append(f"build info python_tag {info.get('python_tag')} != file name "
                        f"{ident.python_tag}")
    families = arch.load_families()
    wanted_families = [f.name for f in arch.families_for(ident.label.sms, families)]
    if info.get("families") != wanted_families:
        problems.append(f"build info families {info.get('families')} != {wanted_families} "
                        "(what families.json says the SMs need)")
    for name in wanted_families:
        module = families[name].extension.replace(".", "/")
        if not [n for n in names if fnmatch.fnmatch(n, module + ".*")
                and n.endswith((".so", ".pyd"))]:
            problems.append(f"extension {families[name].extension} (family {name}) missing")
    if matrix is not None:
        try:
            cell = cell_for_wheel(path.name, matrix)
        except ValueError as exc:
            problems.append(str(exc))
        else:
            if info.get("cell_id") not in (None, cell.id):
                problems.append(f"build info cell_id {info.get('cell_id')} != {cell.id}")
    return problems


def expected_files(path: Path, root: Path = REPO_ROOT) -> set[str]:
    """The exact file set a wheel should hold, from the source tree and its build info."""
    ident = parse_wheel_name(Path(path).name)
    _names, _metadata, info = read_wheel(Path(path))
    package = root / "sageattention"
    files = {BUILD_INFO}
    for py in package.rglob("*.py"):
        rel_dir = py.parent.relative_to(root)
        # setuptools ships .py files of packages only: every folder needs an __init__.py.
        chain = [root / Path(*rel_dir.parts[:i]) for i in range(1, len(rel_dir.parts) + 1)]
        if all((d / "__init__.py").is_file() for d in chain) and "__pycache__" not in py.parts:
            files.add(py.relative_to(root).as_posix())
    for data in package.rglob("*.json"):
        if data.name != "_build_info.json" and "__pycache__" not in data.parts:
            files.add(data.relative_to(root).as_posix())
    families = arch.load_families()
    suffix = (f".{ident.python_tag}-win_amd64.pyd" if ident.os == "windows" else
              f".cpython-{ident.python_tag[2:]}-x86_64-linux-gnu.so")
    for name in info.get("families", []):
        if name in families:  # an unknown family is one of agreement_problems' findings
            files.add(families[name].extension.replace(".", "/") + suffix)
    dist_info = f"sageattention-{ident.version}.dist-info"
    files |= {f"{dist_info}/{n}" for n in DIST_INFO_FILES}
    return files


def check_wheel(path: Path, matrix: "Matrix | None" = None, *, exact_files: bool = True,
                root: Path = REPO_ROOT) -> None:
    """Raise WheelCheckError listing every problem; silent when the wheel is right."""
    path = Path(path)
    problems = agreement_problems(path, matrix)
    if exact_files:
        with zipfile.ZipFile(path) as zf:
            actual = {n for n in zf.namelist() if not n.endswith("/")}
        expected = expected_files(path, root)
        if actual != expected:
            problems.append("file set differs from the expected one: unexpected "
                            f"{sorted(actual - expected)}, missing {sorted(expected - actual)}")
    if problems:
        raise WheelCheckError(f"{path.name}:\n" + "\n".join(f"  - {p}" for p in problems))
