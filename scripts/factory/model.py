"""Frozen data types of the factory: a build target, a matrix cell, the matrix."""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from packaging.version import Version

from . import arch
from .labels import LocalLabel, base_version

OSES = ("linux", "windows")
_TARGET_RE = re.compile(r"^sm(\d+)(\+ptx)?$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, order=True)
class Target:
    """One SM target of a wheel: SASS for ``sm``, plus embedded PTX when ``ptx``."""

    sm: int
    ptx: bool = False

    @classmethod
    def parse(cls, text: str) -> "Target":
        match = _TARGET_RE.match(str(text).strip())
        if match is None:
            raise ValueError(f"not an SM target: {text!r}; write e.g. 'sm80' or 'sm75+PTX'")
        return cls(int(match[1]), match[2] is not None)

    def __str__(self) -> str:
        return f"sm{self.sm}" + ("+PTX" if self.ptx else "")


def parse_targets(text: str) -> tuple[Target, ...]:
    """A target list as in SAGEATTENTION_SM_TARGETS: 'sm80;sm90+PTX' (';' or ',' separated)."""
    parts = [p for p in re.split(r"[;,\s]+", text) if p]
    if not parts:
        raise ValueError("empty SM target list; write e.g. 'sm80' or 'sm80;sm90+PTX'")
    targets = sorted({Target.parse(p) for p in parts})
    if len({t.sm for t in targets}) != len(targets):
        raise ValueError(f"{text!r} names an SM twice (once with +PTX, once without?)")
    return tuple(targets)


@dataclasses.dataclass(frozen=True)
class Cell:
    """One wheel the matrix promises: OS x Python x torch x CUDA x SM targets."""

    os: str
    python: str
    torch: str
    cuda: str
    targets: tuple[Target, ...]
    build_runner: tuple[str, ...] = ()
    validate_runners: Mapping[int, tuple[str, ...]] = dataclasses.field(
        default_factory=dict, compare=False, hash=False)
    group: str = ""

    @property
    def python_tag(self) -> str:
        v = Version(self.python)
        return f"cp{v.major}{v.minor}"

    @property
    def torch_mm(self) -> str:
        return arch.major_minor(self.torch)

    @property
    def sms(self) -> tuple[int, ...]:
        return tuple(t.sm for t in self.targets)

    @property
    def label(self) -> LocalLabel:
        return LocalLabel.create(self.sms, self.torch, self.cuda)

    @property
    def cuda_tag(self) -> str:
        return self.label.cuda_tag

    @property
    def id(self) -> str:
        """Stable id; equal ids mean equal wheel names (the matrix refuses duplicates)."""
        sms = ".".join(f"sm{s}" for s in self.sms)
        return f"{self.os}-{self.python_tag}-torch{self.torch_mm}-{self.cuda_tag}-{sms}"

    def version(self, base: str | None = None) -> Version:
        return Version(f"{base or base_version()}+{self.label}")

    @property
    def torch_requirement(self) -> str:
        return f"torch=={self.torch_mm}.*"

    @property
    def cxx_std(self) -> str:
        return arch.cxx_std_for_torch(self.torch)

    @property
    def sm_targets(self) -> list[str]:
        return [str(t) for t in self.targets]

    def to_json(self) -> dict:
        """The expanded cell as CI consumes it (``nox -s matrix -- --json``)."""
        return {
            "id": self.id, "os": self.os, "python": self.python, "python_tag": self.python_tag,
            "torch": self.torch, "cuda": self.cuda, "sm_targets": self.sm_targets,
            "local_label": str(self.label), "version": str(self.version()),
            "torch_requirement": self.torch_requirement, "cxx_std": self.cxx_std,
            "build_runner": list(self.build_runner),
            "validate_runners": {f"sm{sm}": list(r) for sm, r in self.validate_runners.items()},
            "group": self.group,
        }


@dataclasses.dataclass(frozen=True)
class Matrix:
    version: int
    cells: tuple[Cell, ...]
    source: str = "build_matrix.yaml"

    def sms(self) -> list[int]:
        return sorted({sm for c in self.cells for sm in c.sms})

    def cells_for_sm(self, sm: int) -> list[Cell]:
        return [c for c in self.cells if sm in c.sms]

    def cell(self, cell_id: str) -> Cell:
        for c in self.cells:
            if c.id == cell_id:
                return c
        raise KeyError(cell_id)
