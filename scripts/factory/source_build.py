"""What setup.py builds: SM targets, torch, nvcc, families, version label, checked up front.

setup.py calls :func:`resolve` once. Targets come from, in order:
``SAGEATTENTION_SM_TARGETS`` ("sm80;sm90+PTX"), ``TORCH_CUDA_ARCH_LIST`` ("8.0;9.0+PTX"; "native"
means the visible GPUs, as for torch),
or the GPUs torch can see. ``SAGEATTENTION_CELL`` (set by the factory) names the matrix cell
the environment must match. Every failure is a ToolchainError saying what is missing and
what to set.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import platform as _platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping

from packaging.version import Version

from . import arch, host, kernels
from .errors import ToolchainError
from .labels import LocalLabel, base_version, expectation, torch_without_cuda
from .model import Cell, Target, parse_targets

TARGETS_ENV = "SAGEATTENTION_SM_TARGETS"
CELL_ENV = "SAGEATTENTION_CELL"


@dataclasses.dataclass(frozen=True)
class TorchFacts:
    version: str
    cuda: str | None
    gpu_capabilities: tuple[tuple[int, int], ...]


def torch_version_facts() -> tuple[str, str | None]:
    """(torch.__version__, torch.version.cuda) read from torch/version.py without importing
    torch, which takes seconds (and much longer on a loaded 2-core builder)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError(
            "torch is not importable in the build environment. Install a CUDA build of torch "
            "first, then build without isolation so the build sees it:\n"
            "    pip install torch\n    pip install --no-build-isolation <this package>")
    namespace: dict = {}
    version_py = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    exec(compile(version_py.read_text("utf-8"), str(version_py), "exec"), namespace)
    return str(namespace["__version__"]), namespace.get("cuda")


def probe_torch(need_gpus: bool = True) -> TorchFacts:
    """torch's version and CUDA; the visible GPUs only when asked (that needs torch itself)."""
    version, cuda = torch_version_facts()
    caps: tuple[tuple[int, int], ...] = ()
    if need_gpus and cuda:
        try:
            import torch
        except ImportError as exc:
            raise ToolchainError(f"torch {version} is installed but does not import: {exc}") \
                from exc
        if torch.cuda.is_available():
            caps = tuple(torch.cuda.get_device_capability(i)
                         for i in range(torch.cuda.device_count()))
    return TorchFacts(version, cuda, caps)


def _torch_arch_items(env: Mapping[str, str]) -> list[str]:
    """TORCH_CUDA_ARCH_LIST's items ('8.0;8.6+PTX' or '8.0 8.6'), without the empty ones a stray
    or trailing separator leaves ('8.0;8.6;'); [] when it is unset or holds no item, which torch
    reads as "the visible GPUs", as it reads 'native'."""
    return [item for item in re.split(r"[;\s]+", env.get("TORCH_CUDA_ARCH_LIST", "")) if item]


def _wants_visible_gpus(env: Mapping[str, str]) -> bool:
    """No target list is given: SAGEATTENTION_SM_TARGETS is unset (or empty, refused later) and
    TORCH_CUDA_ARCH_LIST is unset, empty or 'native'."""
    return not env.get(TARGETS_ENV) and _torch_arch_items(env) in ([], ["native"])


def targets_from_env(env: Mapping[str, str], caps: tuple[tuple[int, int], ...]
                     ) -> tuple[tuple[Target, ...], str]:
    """(targets, where they came from)."""
    if TARGETS_ENV in env and not env[TARGETS_ENV].strip():
        # set but empty (an unfilled variable in a script): not "unset", which would build for
        # whatever GPU is visible
        raise ToolchainError(f"{TARGETS_ENV} is set but empty; set it to the GPUs this build is "
                             f"for, e.g. {TARGETS_ENV}='sm80', or unset it")
    if env.get(TARGETS_ENV):
        try:
            return parse_targets(env[TARGETS_ENV]), TARGETS_ENV
        except ValueError as exc:
            raise ToolchainError(f"{TARGETS_ENV}={env[TARGETS_ENV]!r}: {exc}"
                                 + _targets_hint(env[TARGETS_ENV])) from None
    items = _torch_arch_items(env)
    if items == ["native"]:  # torch's spelling of "the visible GPUs"
        if caps:
            return (parse_targets(";".join(f"sm{a}{b}" for a, b in caps)),
                    "the visible GPU(s), TORCH_CUDA_ARCH_LIST=native")
        raise ToolchainError(
            "TORCH_CUDA_ARCH_LIST=native asks for the visible GPUs, but torch sees no CUDA GPU "
            f"here; set {TARGETS_ENV} to the GPUs this build is for, e.g. {TARGETS_ENV}='sm80'")
    if items:
        parts, notes = [], []
        for item in items:
            match = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", item)
            if match is None:
                raise ToolchainError(f"TORCH_CUDA_ARCH_LIST item {item!r} is not like '8.0' or "
                                     f"'9.0+PTX'; or set {TARGETS_ENV}='sm80;sm90+PTX' instead")
            # 9.0a: the sm90 target already builds the arch-specific families as sm_90a (and the
            # others as sm_90), so the suffix selects nothing more
            if match[3]:
                notes.append(f"{item} built as sm{match[1]}{match[2]}")
            parts.append(f"sm{match[1]}{match[2]}" + (match[4] or ""))
        where = "TORCH_CUDA_ARCH_LIST" + (f" ({', '.join(notes)})" if notes else "")
        try:
            return parse_targets(";".join(parts)), where
        except ValueError as exc:  # e.g. "8.0;8.0+PTX": one SM twice
            raise ToolchainError(f"TORCH_CUDA_ARCH_LIST={env['TORCH_CUDA_ARCH_LIST']!r}: {exc}") \
                from None
    if caps:
        return parse_targets(";".join(f"sm{a}{b}" for a, b in caps)), "the visible GPU(s)"
    raise ToolchainError(
        f"no SM targets: no CUDA GPU is visible and {TARGETS_ENV} is not set. Set it to the "
        "GPUs this build is for, for example\n"
        f"    {TARGETS_ENV}='sm80' pip install --no-build-isolation .\n"
        "(one or more of sm75, sm80, sm86, sm87, sm89, sm90, ';'-separated; '+PTX' also embeds "
        "that SM's PTX; the sm75 family's compute_75 PTX, always embedded, runs on newer GPUs)")


# Spellings of an SM that other tools use: sm_80, 80, 8.0 (TORCH_CUDA_ARCH_LIST), compute_80,
# sm90a (the arch-specific target, which the sm90 target already builds where it matters).
_OTHER_SPELLING = re.compile(r"(?:sm_?|compute_?)?(\d+?)\.?(\d)([af]?)(\+ptx)?", re.IGNORECASE)


def other_spelling(item: str) -> re.Match | None:
    """An SM in another tool's spelling (groups: major, minor, arch suffix, '+ptx'), or None."""
    return _OTHER_SPELLING.fullmatch(item.strip())


def _targets_hint(text: str) -> str:
    """'; did you mean ...' with the list respelled as Target.parse reads it, or '' when some
    item is no SM in any spelling (parse_targets' message then says what is accepted)."""
    items = [p for p in re.split(r"[;,\s]+", text) if p]
    fixed, notes = [], []
    for item in items:
        match = other_spelling(item)
        if match is None:
            return ""
        fixed.append(f"sm{match[1]}{match[2]}" + ("+PTX" if match[4] else ""))
        if match[3]:
            notes.append(f"{item}: the sm{match[1]}{match[2]} target already compiles the "
                         f"arch-specific families as sm_{match[1]}{match[2]}{match[3]}")
    try:
        parse_targets(";".join(fixed))
    except ValueError:
        return ""
    return (f"; did you mean {TARGETS_ENV}='{';'.join(fixed)}'?"
            + "".join(f" ({note})" for note in notes))


@dataclasses.dataclass(frozen=True)
class SourceBuild:
    targets: tuple[Target, ...]
    targets_from: str
    torch_version: str
    cuda: str
    nvcc: Path
    nvcc_version: Version
    nvcc_id: str
    builds: tuple[arch.FamilyBuild, ...]
    label: LocalLabel
    version: str
    torch_requirement: str
    cxx_std: str
    cell_id: str | None
    jobs: int

    def describe(self) -> str:
        lines = [f"sageattention {self.version}: targets {' '.join(map(str, self.targets))} "
                 f"(from {self.targets_from}), torch {self.torch_version}, CUDA {self.cuda}, "
                 f"nvcc {self.nvcc_version}, {self.cxx_std}, {self.jobs} job(s)"]
        for b in self.builds:
            lines.append(f"  family {b.family.name} -> {b.family.extension}: "
                         f"{' '.join(b.gencode_flags())}")
        return "\n".join(lines)


def wheel_cuda_include_dirs(cuda: str, search: list[str] | None = None) -> list[Path]:
    """CUDA library headers (cuBLAS, cuSPARSE) that torch's headers include, from the
    nvidia-* wheels torch installs: nvidia/cu13/include (CUDA 13) or nvidia/*/include (12)."""
    major = Version(cuda).major
    found: list[Path] = []
    for entry in search if search is not None else sys.path:
        base = Path(entry) / "nvidia"
        if not base.is_dir():
            continue
        for candidate in [base / f"cu{major}" / "include", *sorted(base.glob("*/include"))]:
            if candidate.is_dir() and candidate not in found:
                found.append(candidate)
    return found


def resolve(env: Mapping[str, str] = os.environ,
            torch_facts: Callable[[bool], TorchFacts] = probe_torch,
            find_nvcc: Callable[[Mapping[str, str]], Path | None] = kernels.find_nvcc,
            nvcc_identity: Callable[[Path], str] = kernels.nvcc_identity,
            root: Path = arch.REPO_ROOT) -> SourceBuild:
    # GPUs decide the targets only when no target list is set.
    facts = torch_facts(_wants_visible_gpus(env))
    if not facts.cuda:
        raise ToolchainError(
            f"torch {facts.version} is {torch_without_cuda(facts.version)}; sageattention's kernels need a CUDA "
            "build of torch (for example: pip install torch --index-url "
            "https://download.pytorch.org/whl/cu130)")
    targets, source = targets_from_env(env, facts.gpu_capabilities)
    families = _load_families(root)
    for t in targets:
        if not any(t.sm in f.serves for f in families.values()):
            served = sorted({s for f in families.values() for s in f.serves})
            if t.sm not in arch.SM_CUDA_RANGE:  # a typo (sm800), not a GPU too new for us
                raise ToolchainError(
                    f"{t} (from {source}) is not an NVIDIA GPU architecture; this build "
                    "supports " + ", ".join(f"sm{s}" for s in served))
            # a GPU newer than every family (Blackwell): the embed_ptx family's PTX runs there
            ptx = expectation().newest_embedded_ptx(
                (f.embed_ptx for f in families.values() if f.embed_ptx is not None), t.sm)
            hint = (f"; for an sm{t.sm} GPU build sm{ptx} ({TARGETS_ENV}='sm{ptx}'), "
                    f"whose embedded compute_{ptx} PTX the driver compiles for it"
                    if ptx is not None else "")
            raise ToolchainError(f"no kernel family serves {t} (from {source}); supported: "
                                 + ", ".join(f"sm{s}" for s in served) + hint)
    builds = tuple(arch.family_builds(((t.sm, t.ptx) for t in targets), families))
    _check_sources(builds, root)

    for var in kernels.TOOLKIT_VARS:
        # a toolkit named but without nvcc: find_nvcc would take the one on PATH, and torch's
        # extension builder this variable's headers, two toolkits in one build
        if env.get(var) and kernels.nvcc_in(env[var]) is None:
            raise ToolchainError(f"{var}={env[var]} has no bin/nvcc: point it at the CUDA "
                                 f"{facts.cuda} toolkit, or unset it to use the nvcc on PATH")
    nvcc = find_nvcc(env)
    if nvcc is None:
        raise ToolchainError(
            f"nvcc not found: install the CUDA {facts.cuda} toolkit and set CUDA_HOME to it "
            "(for example CUDA_HOME=/usr/local/cuda), or put its bin/ on PATH")
    found_by = next((var for var in kernels.TOOLKIT_VARS if env.get(var)), "PATH")
    # the version first: arch.nvcc_version turns an nvcc that does not run into a ToolchainError
    nvcc_version = arch.nvcc_version(nvcc)
    try:
        identity = nvcc_identity(nvcc)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ToolchainError(f"cannot run {nvcc} --version (nvcc from {found_by}): {exc}") \
            from None
    try:
        arch.check_toolchain(nvcc_version, facts.cuda, builds)
    except ToolchainError as exc:
        raise ToolchainError(f"{exc}\n(nvcc {nvcc_version} is {nvcc}, found through "
                             f"{found_by})") from None

    label = LocalLabel.create([t.sm for t in targets], facts.version, facts.cuda)
    torch_base = Version(facts.version).base_version
    cell = Cell(os=host.host_os(), python=f"{sys.version_info.major}.{sys.version_info.minor}",
                torch=torch_base, cuda=facts.cuda, targets=targets)
    wanted = env.get(CELL_ENV)
    if wanted and wanted != cell.id:
        raise ToolchainError(
            f"{CELL_ENV}={wanted} but this environment builds cell {cell.id} (Python "
            f"{_platform.python_version()}, torch {facts.version}, CUDA {facts.cuda}, targets "
            f"{' '.join(map(str, targets))}); use the cell's Python and torch")
    from .buildinfo import build_date, host_compiler_version
    build_date(env)  # a bad SOURCE_DATE_EPOCH stops the build here, before any compile
    compiler = _host_compiler(env, host_compiler_version)
    return SourceBuild(
        targets=targets, targets_from=source, torch_version=facts.version, cuda=facts.cuda,
        nvcc=nvcc, nvcc_version=nvcc_version,
        nvcc_id=identity + "\n" + compiler,
        builds=builds, label=label, version=str(cell.version(base_version())),
        torch_requirement=cell.torch_requirement, cxx_std=cell.cxx_std,
        cell_id=wanted or None, jobs=kernels.jobs_from_env(env))


def _load_families(root: Path) -> dict[str, arch.Family]:
    path = root / arch.FAMILIES_JSON.relative_to(arch.REPO_ROOT)
    try:
        return arch.load_families(path)
    except FileNotFoundError:
        raise ToolchainError(f"{path} is missing: {kernels.INCOMPLETE_TREE}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ToolchainError(f"{path} is malformed: {exc!r}") from None


def _check_sources(builds: tuple[arch.FamilyBuild, ...], root: Path) -> None:
    """Every family's sources and include folders are here, before torch's builder starts (an
    sdist made without MANIFEST.in's `graft csrc` failed deep inside build_ext)."""
    for build in builds:
        for folder in kernels.include_dirs(build, root):
            if not folder.is_dir():
                raise ToolchainError(f"family {build.family.name}: {folder} is missing: "
                                     + kernels.INCOMPLETE_TREE)
        kernels.kernel_sources(build, root)
        kernels.binding_sources(build, root)


def _host_compiler(env: Mapping[str, str], version_of: Callable[[Mapping[str, str]], str]) -> str:
    """The host compiler's version line; a CXX that names no runnable program stops the build
    here rather than as a traceback (CXX may be a wrapper and a compiler: 'ccache g++')."""
    try:
        words = [w for w in shlex.split(env.get("CXX", "")) if not w.startswith("-")]  # no flags
    except ValueError as exc:  # an unbalanced quote
        raise ToolchainError(f"CXX={env['CXX']!r} cannot be split into words: {exc}") from None
    for word in words:
        if shutil.which(word) is None:
            raise ToolchainError(f"CXX={env['CXX']!r}: {word} is not an executable program; "
                                 "set CXX to a C++ compiler nvcc supports (e.g. CXX=g++) or "
                                 "unset it")
    if len(words) > 1:
        env = {**env, "CXX": words[-1]}  # the compiler, not the wrapper, decides the objects
    try:
        return version_of(env)
    except OSError as exc:
        raise ToolchainError(f"cannot run the host C++ compiler: {exc}; set CXX to one "
                             "(e.g. CXX=g++)") from None
