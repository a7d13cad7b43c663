"""GPU architecture facts: which CUDA compiles which SM, which torch ships which CUDA and which
Python, which kernel family serves which SM (read from sageattention/native/families.json), and
the nvcc -gencode flags that follow from them."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path
from typing import Iterable, Mapping

from packaging.version import Version

from .errors import ToolchainError

REPO_ROOT = Path(__file__).resolve().parents[2]
FAMILIES_JSON = REPO_ROOT / "sageattention" / "native" / "families.json"

# First CUDA release whose nvcc compiles the SM, and (exclusive) the release that dropped it.
# Sources: NVIDIA CUDA toolkit release notes (CUDA 13.0 removed sm_50..sm_72).
SM_CUDA_RANGE: Mapping[int, tuple[str, str | None]] = {
    50: ("6.0", "13.0"), 52: ("6.5", "13.0"), 53: ("6.5", "13.0"),
    60: ("8.0", "13.0"), 61: ("8.0", "13.0"), 62: ("8.0", "13.0"),
    70: ("9.0", "13.0"), 72: ("9.2", "13.0"),
    75: ("10.0", None), 80: ("11.0", None), 86: ("11.1", None), 87: ("11.4", None),
    89: ("11.8", None), 90: ("11.8", None),
    100: ("12.8", None), 103: ("12.9", None), 110: ("13.0", None),
    120: ("12.8", None), 121: ("12.9", None),
}

# First CUDA release with the arch-specific target (sm_90a) of an SM, for arch_specific families.
ARCH_SPECIFIC_FROM: Mapping[int, str] = {90: "12.0"}

# CUDA builds PyTorch publishes per torch minor release. Entries from 2.11 on list only the
# builds we have installed and run; add a CUDA version here once PyTorch publishes it.
TORCH_CUDA_BUILDS: Mapping[str, tuple[str, ...]] = {
    "2.4": ("11.8", "12.1", "12.4"),
    "2.5": ("11.8", "12.1", "12.4"),
    "2.6": ("11.8", "12.4", "12.6"),
    "2.7": ("11.8", "12.6", "12.8"),
    "2.8": ("12.6", "12.8", "12.9"),
    "2.9": ("12.6", "12.8", "13.0"),
    "2.10": ("12.6", "12.8", "13.0"),
    "2.11": ("13.0",),
    "2.12": ("13.0",),
    "2.13": ("13.0",),
    "2.14": ("13.0",),
}

# CPython minors PyTorch publishes wheels for, per torch minor release (keys as in
# TORCH_CUDA_BUILDS). 2.4-2.7: PyTorch RELEASE.md's "Release Compatibility Matrix", stable Pythons
# only (an "experimental" one, such as 3.13 for 2.5 or free-threaded 3.13t, is left out). 2.8 on:
# our reading of the release notes, not checked against that table here; cp311 for 2.14 and cp312
# for 2.11 are the builds we run. A cell this table refuses wrongly: widen the row, with a source.
TORCH_PYTHONS: Mapping[str, tuple[str, ...]] = {
    "2.4": ("3.8", "3.9", "3.10", "3.11", "3.12"),
    "2.5": ("3.9", "3.10", "3.11", "3.12"),
    "2.6": ("3.9", "3.10", "3.11", "3.12", "3.13"),
    "2.7": ("3.9", "3.10", "3.11", "3.12", "3.13"),
    "2.8": ("3.9", "3.10", "3.11", "3.12", "3.13"),
    "2.9": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.10": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.11": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.12": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.13": ("3.10", "3.11", "3.12", "3.13", "3.14"),
    "2.14": ("3.10", "3.11", "3.12", "3.13", "3.14"),
}

# torch's headers need C++20 from 2.13 on; older releases build with C++17.
TORCH_CXX20_FROM = Version("2.13")
# Kernel .cu files include no torch header, so their standard is fixed: their objects are
# then the same for every torch version and can be cached across torch builds.
KERNEL_CXX_STD = "c++17"


def major_minor(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor}"


def cxx_std_for_torch(torch_version: str) -> str:
    """The C++ standard a torch-including translation unit needs (a property of the cell)."""
    v = Version(major_minor(torch_version))
    return "c++20" if v >= TORCH_CXX20_FROM else "c++17"


def sm_compile_problem(sm: int, cuda: str) -> str | None:
    """Why CUDA ``cuda`` cannot compile ``sm``, or None when it can."""
    if sm not in SM_CUDA_RANGE:
        known = ", ".join(f"sm{s}" for s in SM_CUDA_RANGE)
        return f"sm{sm} is not a known NVIDIA architecture (known: {known})"
    first, dropped = SM_CUDA_RANGE[sm]
    v = Version(major_minor(cuda))
    if v < Version(first):
        return f"sm{sm} needs CUDA >= {first}, cell has CUDA {cuda}"
    if dropped is not None and v >= Version(dropped):
        return f"CUDA {dropped} dropped sm{sm}; cell has CUDA {cuda} (use CUDA < {dropped})"
    return None


def _torch_table_problem(table: Mapping[str, tuple[str, ...]], table_name: str, what: str,
                         torch_version: str, value: str, missing) -> str | None:
    """The lookup both torch tables share: None when ``value``'s major.minor is listed for the
    torch release, else ``missing(torch major.minor, listed)`` or, for a torch release the table
    does not know, what to add where."""
    mm = major_minor(torch_version)
    listed = table.get(mm)
    if listed is None:
        return (f"torch {mm} is not in the known torch/{what} table (known: {', '.join(table)}); "
                f"add it to {table_name} in scripts/factory/arch.py once PyTorch publishes it")
    return None if major_minor(value) in listed else missing(mm, listed)


def torch_cuda_problem(torch_version: str, cuda: str) -> str | None:
    """Why no torch ``torch_version`` build for CUDA ``cuda`` exists, or None when one does."""
    return _torch_table_problem(
        TORCH_CUDA_BUILDS, "TORCH_CUDA_BUILDS", "CUDA", torch_version, cuda,
        lambda mm, builds: f"torch {mm} has no CUDA {cuda} build (it ships: "
                           f"{', '.join('cu' + b.replace('.', '') for b in builds)})")


def torch_python_problem(torch_version: str, python: str) -> str | None:
    """Why no torch ``torch_version`` wheel for CPython ``python`` exists, or None when one does."""
    return _torch_table_problem(
        TORCH_PYTHONS, "TORCH_PYTHONS", "Python", torch_version, python,
        lambda mm, pythons: f"torch {mm} ships no wheel for Python {python} (it supports Python "
                            f"{', '.join(pythons)})")


@dataclasses.dataclass(frozen=True)
class Family:
    """One kernel family from families.json: one extension module built from one folder."""

    name: str
    extension: str
    sources: str
    serves: tuple[int, ...]
    min_nvcc: str
    embed_ptx: int | None
    # SASS for the arch-specific target (sm_90a), which runs only on exactly that SM; never PTX.
    arch_specific: bool = False


def load_families(path: Path = FAMILIES_JSON) -> dict[str, Family]:
    data = json.loads(Path(path).read_text("utf-8"))
    families = {}
    for name, spec in data["families"].items():
        embed = spec.get("embed_ptx")
        arch_specific = spec.get("arch_specific", False)
        if not isinstance(arch_specific, bool):
            raise ValueError(f"{path}: family {name}: arch_specific must be true or false, "
                             f"got {arch_specific!r}")
        if arch_specific and embed is not None:
            raise ValueError(f"{path}: family {name}: an arch_specific family embeds no PTX "
                             f"(its code runs only on the SMs it serves); set embed_ptx to null")
        families[name] = Family(
            name=name,
            extension=spec["extension"],
            sources=spec["sources"],
            serves=tuple(_sm_number(s) for s in spec["serves"]),
            min_nvcc=spec["min_nvcc"],
            embed_ptx=None if embed is None else int(re.fullmatch(r"compute_(\d+)", embed)[1]),
            arch_specific=arch_specific,
        )
    return families


def _sm_number(text: str) -> int:
    match = re.fullmatch(r"sm_?(\d+)", text)
    if match is None:
        raise ValueError(f"not an SM name: {text!r} (expected e.g. 'sm80')")
    return int(match[1])


def families_for(sms: Iterable[int], families: Mapping[str, Family]) -> list[Family]:
    """Families that serve at least one of ``sms``, in families.json order."""
    wanted = set(sms)
    return [f for f in families.values() if wanted & set(f.serves)]


@dataclasses.dataclass(frozen=True)
class FamilyBuild:
    """What one family compiles for one wheel: real SASS targets and embedded PTX."""

    family: Family
    sass: tuple[int, ...]
    ptx: tuple[int, ...]

    def gencode_flags(self) -> list[str]:
        suffix = "a" if self.family.arch_specific else ""
        flags = [f"-gencode=arch=compute_{sm}{suffix},code=sm_{sm}{suffix}" for sm in self.sass]
        flags += [f"-gencode=arch=compute_{sm},code=compute_{sm}" for sm in self.ptx]
        return flags


def family_builds(targets: Iterable[tuple[int, bool]],
                  families: Mapping[str, Family]) -> list[FamilyBuild]:
    """Per family: SASS for each target it serves, PTX for '+PTX' targets and ``embed_ptx``.

    ``targets`` are (sm, ptx) pairs. A target compiles to plain SASS (sm90 -> sm_90) for the
    families that are not arch-specific (sm80, sm89), and to the arch-specific SASS of the
    families that are (the sm90 and sm90_fp8 families: sm_90a, with their wgmma kernels), which get
    no PTX even for a '+PTX' target: their code runs only on exactly the SM it was built for.
    """
    targets = list(targets)
    builds = []
    for fam in families_for([sm for sm, _ in targets], families):
        sass = sorted({sm for sm, _ in targets if sm in fam.serves})
        ptx = set()
        if not fam.arch_specific:
            ptx = {sm for sm, want_ptx in targets if want_ptx and sm in fam.serves}
            if fam.embed_ptx is not None:
                ptx.add(fam.embed_ptx)
        builds.append(FamilyBuild(fam, tuple(sass), tuple(sorted(ptx))))
    return builds


def nvcc_version(nvcc: str | Path) -> Version:
    """Parse ``nvcc --version`` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    try:
        out = subprocess.run([str(nvcc), "--version"], check=True, capture_output=True,
                             text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ToolchainError(f"cannot run {nvcc} --version: {exc}") from exc
    match = re.search(r"release \d+\.\d+, V(\d+\.\d+(?:\.\d+)?)", out)
    if match is None:
        raise ToolchainError(f"cannot read the CUDA version from `{nvcc} --version`:\n{out}")
    return Version(match[1])


def check_toolchain(nvcc: Version, cuda: str, builds: Iterable[FamilyBuild]) -> None:
    """Refuse an nvcc that does not match the cell's CUDA major or cannot compile a target."""
    if nvcc.major != Version(cuda).major:
        raise ToolchainError(
            f"nvcc {nvcc} does not match the cell's CUDA {cuda} (torch's CUDA): the major "
            "versions must agree")
    for build in builds:
        if nvcc < Version(build.family.min_nvcc):
            raise ToolchainError(
                f"family {build.family.name} needs nvcc >= {build.family.min_nvcc}, found {nvcc}")
        for sm in set(build.sass) | set(build.ptx):
            problem = sm_compile_problem(sm, f"{nvcc.major}.{nvcc.minor}")
            if problem:
                raise ToolchainError(f"nvcc {nvcc} cannot compile family {build.family.name} "
                                     f"for sm{sm}: {problem}")
        if build.family.arch_specific:
            for sm in build.sass:
                first = ARCH_SPECIFIC_FROM.get(sm)
                if first is None:
                    known = ", ".join(f"sm_{s}a" for s in ARCH_SPECIFIC_FROM)
                    raise ToolchainError(
                        f"family {build.family.name} is arch-specific, but sm_{sm}a is not a "
                        f"known arch-specific target (known: {known})")
                if nvcc < Version(first):
                    raise ToolchainError(f"family {build.family.name} needs nvcc >= {first} for "
                                         f"sm_{sm}a, found {nvcc}")
