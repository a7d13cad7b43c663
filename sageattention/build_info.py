"""Build info carried by a wheel, and the local version label rule.

A wheel built by the factory (or by ``pip install`` from source) contains
``sageattention/_build_info.json``; a source checkout does not, and then :func:`load`
returns ``None``.

The local version label names what a wheel was compiled for. It is the one naming rule
shared by the factory (``scripts/factory/labels.py`` loads this file) and the runtime guard,
so it lives here, stdlib only, no torch, no package-relative import at module level:

* one SM:     ``sm75.torch2.12cu130``            -> ``2.2.0+sm75.torch2.12cu130``
* several:    ``sm80.sm86.sm90.torch2.14cu130``  (SMs ascending, each once)

``+PTX`` is not part of the label: the build info's ``sm_targets`` and ``ptx`` say which
targets embed PTX, and the matrix refuses two cells that differ only in PTX.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from importlib import resources
from typing import Any, Iterable

BUILD_INFO_FILE = "_build_info.json"
BUILD_INFO_SCHEMA_VERSION = 1

# Python's local version normalization turns '-' and '_' into '.', and lower-cases.
_LABEL_RE = re.compile(
    r"^(?P<sms>sm\d+(?:\.sm\d+)*)\.torch(?P<torch_major>\d+)\.(?P<torch_minor>\d+)"
    r"cu(?P<cuda_major>\d+)(?P<cuda_minor>\d)$"
)


@dataclasses.dataclass(frozen=True)
class LocalLabel:
    """What a wheel is compiled for: SM numbers, torch major.minor, CUDA major.minor."""

    sms: tuple[int, ...]
    torch: tuple[int, int]
    cuda: tuple[int, int]

    def __post_init__(self) -> None:
        if not self.sms:
            raise ValueError("a local label needs at least one SM (for example sm80)")
        if list(self.sms) != sorted(set(self.sms)):
            raise ValueError(f"label SMs must be ascending and unique, got {list(self.sms)}")
        if not 0 <= self.cuda[1] <= 9:
            raise ValueError(f"CUDA minor version must be one digit, got {self.cuda[1]}")

    @classmethod
    def create(cls, sms: Iterable[int], torch_version: str, cuda_version: str) -> "LocalLabel":
        """Build a label from SM numbers and version strings such as ``2.12.0+cu130``, ``13.0``."""
        return cls(tuple(sorted(set(int(s) for s in sms))),
                   _major_minor(torch_version, "torch"), _major_minor(cuda_version, "CUDA"))

    def __str__(self) -> str:
        sms = ".".join(f"sm{s}" for s in self.sms)
        return f"{sms}.torch{self.torch[0]}.{self.torch[1]}cu{self.cuda[0]}{self.cuda[1]}"

    @property
    def cuda_tag(self) -> str:
        return f"cu{self.cuda[0]}{self.cuda[1]}"

    @classmethod
    def parse(cls, label: str) -> "LocalLabel":
        """Parse a label (as written, or as ``packaging`` normalizes it) back to its parts."""
        normalized = label.lower().replace("-", ".").replace("_", ".")
        match = _LABEL_RE.match(normalized)
        if match is None:
            raise ValueError(
                f"not a sageattention local label: {label!r}; expected the form "
                "'sm75.torch2.12cu130' or 'sm80.sm90.torch2.14cu130'")
        sms = tuple(int(part[2:]) for part in match["sms"].split("."))
        parsed = cls(sms, (int(match["torch_major"]), int(match["torch_minor"])),
                     (int(match["cuda_major"]), int(match["cuda_minor"])))
        return parsed


def _major_minor(version: str, what: str) -> tuple[int, int]:
    match = re.match(r"^\s*(\d+)\.(\d+)", str(version))
    if match is None:
        raise ValueError(f"{what} version must look like 'X.Y' or 'X.Y.Z', got {version!r}")
    return int(match[1]), int(match[2])


def torch_without_cuda(torch_version: str) -> str:
    """What a torch whose ``torch.version.cuda`` is None is, for messages: "a ROCm (AMD GPU) build"
    (a +rocm local label) or "a CPU-only build"."""
    rocm = torch_version.partition("+")[2].lower().startswith("rocm")
    return "a ROCm (AMD GPU) build" if rocm else "a CPU-only build"


def wheel_filename(label: LocalLabel, python_tag: str, platform_tag: str,
                   base_version: str | None = None) -> str:
    """The wheel file name the factory gives a build of ``label`` (used in guard messages)."""
    if base_version is None:
        from ._version import BASE_VERSION as base_version
    return f"sageattention-{base_version}+{label}-{python_tag}-{python_tag}-{platform_tag}.whl"


class DamagedInstallError(ImportError):
    """The installed wheel's build info cannot be read: the installation is damaged."""


@functools.lru_cache(maxsize=1)
def load() -> dict[str, Any] | None:
    """The wheel's build info, or ``None`` in a source checkout (no build info file).
    DamagedInstallError when the file is there but is not build info: not JSON, or a field the
    guard reads (:func:`field_problem`) missing or malformed, which was a KeyError or ValueError
    traceback at ``import sageattention``."""
    try:
        where = resources.files(__package__).joinpath(BUILD_INFO_FILE)
        text = where.read_text("utf-8")
    except (FileNotFoundError, OSError):
        return None
    try:
        info = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        problem = f"is not valid JSON ({exc})"
    else:
        if isinstance(info, dict) and "version" in info:
            problem = field_problem(info)
            if problem is None:
                return info
        else:
            problem = ("has no 'version' field" if isinstance(info, dict)
                       else f"holds a JSON {type(info).__name__}, not an object")
    raise DamagedInstallError(
        f"{where} {problem}: this sageattention installation is damaged. Reinstall the wheel: "
        "pip install --force-reinstall --no-deps <the sageattention .whl file you installed>")


# What the guard and the loader read, and what each must look like. Other fields (those
# scripts/factory/buildinfo.py adds later, say) are kept and ignored.
_FIELDS = {
    "version": "a version such as '2.2.0+sm80.torch2.11cu130'",
    "local_label": "a label such as 'sm80.sm90.torch2.11cu130'",
    "torch": "the torch version it was built against, such as '2.11.0+cu130'",
    "cuda": "the CUDA version of that torch, such as '13.0'",
    "sm_targets": "a non-empty list of SM targets such as ['sm80', 'sm90+PTX']",
    "families": "a list of kernel family names such as ['sm80', 'sm89'] (or absent)",
    "ptx": "a list of embedded PTX such as ['compute_75'] (or absent)",
}


def _field_ok(key: str, value: Any) -> bool:
    if key in ("version", "local_label", "torch", "cuda"):
        if not isinstance(value, str) or not value.strip():
            return False
        try:
            if key == "local_label":
                LocalLabel.parse(value)
            elif key in ("torch", "cuda"):
                _major_minor(value, key)
        except ValueError:
            return False
        return True
    if key in ("families", "ptx") and value is None:
        return True
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return False
    if key == "sm_targets":
        # the guard's and the validation suite's rule for a target (validation/expectation.py)
        from .validation.expectation import parse_target

        try:
            return bool(value) and all(parse_target(v) for v in value)
        except ValueError:
            return False
    if key == "ptx":
        return all(re.fullmatch(r"compute_\d{2,3}[af]?", v) for v in value)
    return True


def field_problem(info: dict[str, Any]) -> str | None:
    """Why ``info`` is not build info the guard can read (a field missing or malformed), or None."""
    for key, expected in _FIELDS.items():
        optional = key in ("families", "ptx")
        if key not in info:
            if optional:
                continue
            return f"has no {key!r} field (expected {expected})"
        if not _field_ok(key, info[key]):
            return f"has {key!r} = {info[key]!r} (expected {expected})"
    return None


def package_version() -> str:
    """``__version__``: the wheel's full version (with label), or BASE_VERSION from source."""
    from ._version import BASE_VERSION

    info = load()
    return BASE_VERSION if info is None else str(info["version"])
