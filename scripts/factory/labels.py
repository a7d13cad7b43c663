"""Local version labels and wheel names, both ways.

The label rule itself (``LocalLabel``) lives in ``sageattention/build_info.py`` because the
installed wheel's runtime guard needs it too; it is loaded here by file path, so the factory
never imports the ``sageattention`` package (which imports torch and the compiled kernels).
Wheel names are parsed with ``packaging``, never by splitting strings.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from .arch import REPO_ROOT

if TYPE_CHECKING:
    from .model import Cell, Matrix

PROJECT = "sageattention"


def load_package_file(relative: str, name: str):
    """A module of the sageattention package loaded from its file (``relative`` to the repository),
    registered as ``name``, without importing the package: the rules the factory shares with it
    (the publish job, where notes and releases are made, has no torch)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / relative)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses needs the module registered while it runs
        spec.loader.exec_module(module)
    return sys.modules[name]


def expectation():
    """sageattention/validation/expectation.py: the SM-target, SASS and backend-name rules that the
    validation suite applies, for the reports, notes and release to apply alike."""
    return load_package_file("sageattention/validation/expectation.py", "_sageattention_expectation")


_rule = load_package_file("sageattention/build_info.py", "_sageattention_label_rule")
LocalLabel = _rule.LocalLabel
torch_without_cuda = _rule.torch_without_cuda


def base_version(root: Path = REPO_ROOT) -> str:
    """BASE_VERSION from sageattention/_version.py, read without importing the package."""
    namespace: dict = {}
    exec((root / "sageattention" / "_version.py").read_text("utf-8"), namespace)
    return str(Version(namespace["BASE_VERSION"]))


def full_version(label: "LocalLabel", base: str | None = None) -> Version:
    return Version(f"{base or base_version()}+{label}")


@dataclasses.dataclass(frozen=True)
class WheelIdentity:
    """What a wheel's file name says: version (with label) and tags."""

    filename: str
    version: Version
    label: "LocalLabel"
    tags: frozenset[Tag]

    @property
    def python_tag(self) -> str:
        return sorted({t.interpreter for t in self.tags})[0]

    @property
    def os(self) -> str:
        platforms = {t.platform for t in self.tags}
        if all(p.startswith("win") for p in platforms):
            return "windows"
        if all("linux" in p for p in platforms):
            return "linux"
        raise ValueError(f"{self.filename}: platform tags {sorted(platforms)} are neither "
                         "Linux nor Windows")


def parse_wheel_name(filename: str | Path) -> WheelIdentity:
    """Parse a sageattention wheel name; ValueError says what is wrong with it."""
    name = Path(filename).name
    try:
        dist, version, _build, tags = parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        raise ValueError(f"{name!r} is not a wheel file name ({exc}); expected "
                         "'<name>-<version>-<python tag>-<abi tag>-<platform tag>.whl'") from None
    if dist != PROJECT:
        raise ValueError(f"{name}: not a {PROJECT} wheel (distribution {dist!r})")
    if version.local is None:
        raise ValueError(f"{name}: version {version} has no local label; factory wheels are "
                         "named like sageattention-2.2.0+sm75.torch2.12cu130-...")
    return WheelIdentity(name, version, LocalLabel.parse(version.local), frozenset(tags))


def cell_for_wheel(filename: str | Path, cells: "Matrix | Iterable[Cell]") -> "Cell":
    """The matrix cell a wheel was built from (its name says OS, Python, torch, CUDA, SMs)."""
    ident = parse_wheel_name(filename)
    all_cells = list(getattr(cells, "cells", cells))
    found = [c for c in all_cells
             if c.label == ident.label and c.python_tag == ident.python_tag
             and c.os == ident.os]
    if len(found) != 1:
        raise ValueError(f"{ident.filename}: matches {len(found)} matrix cells "
                         f"({', '.join(c.id for c in found) or 'none'}); expected exactly one")
    return found[0]
