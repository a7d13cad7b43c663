"""Compile a kernel family's .cu files into objects, cached across torch versions.

Kernel .cu files include no torch header (csrc/ contract), so an object depends only on the
nvcc version, the flags (fixed kernel C++ standard, -gencode list) and the sources it can
include. The cache key hashes exactly those; a rebuild for another torch version, or of
another cell with the same (CUDA, SM) family build, finds every object and compiles only
the family's torch-facing bindings.cpp.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from .arch import KERNEL_CXX_STD, REPO_ROOT, FamilyBuild
from .errors import BuildError

HEADER_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".inc")
CACHE_ENV = "SAGEATTENTION_KERNEL_CACHE"
HEARTBEAT_S = 30.0
# What a missing source file means, and the fix (an sdist made without MANIFEST.in's grafts).
INCOMPLETE_TREE = ("this source tree or sdist is incomplete; build from a complete git checkout "
                   "or a fresh sdist")


def default_cache_dir(root: Path = REPO_ROOT) -> Path:
    return Path(os.environ.get(CACHE_ENV) or root / "build" / "kernel-cache")


def positive_jobs(raw: str) -> int:
    """A parallel job count given as text (MAX_JOBS, --jobs): a positive integer, else ValueError."""
    try:
        jobs = int(raw)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ValueError(f"must be a positive integer, got {raw!r}")
    return jobs


def jobs_argument(raw: str) -> int:
    """argparse type of the commands' --jobs: positive_jobs, refused as a usage error."""
    try:
        return positive_jobs(raw)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def jobs_from_env(env: os._Environ | dict = os.environ) -> int:
    """MAX_JOBS (torch's convention) or the CPU count; at least 1."""
    raw = env.get("MAX_JOBS")
    if raw:
        try:
            return positive_jobs(raw)
        except ValueError as exc:
            raise BuildError(f"MAX_JOBS {exc}") from None
    return max(1, os.cpu_count() or 1)


def kernel_sources(build: FamilyBuild, root: Path = REPO_ROOT) -> list[Path]:
    """The family's .cu files (torch-free kernels); bindings .cpp files are built elsewhere."""
    folder = root / build.family.sources
    sources = sorted(folder.glob("*.cu"))
    if not sources:
        raise BuildError(f"family {build.family.name}: no .cu files in {folder}: "
                         + INCOMPLETE_TREE)
    return sources


def binding_sources(build: FamilyBuild, root: Path = REPO_ROOT) -> list[Path]:
    folder = root / build.family.sources
    sources = sorted(folder.glob("*.cpp"))
    if not sources:
        raise BuildError(f"family {build.family.name}: no bindings .cpp in {folder}: "
                         + INCOMPLETE_TREE)
    return sources


def include_dirs(build: FamilyBuild, root: Path = REPO_ROOT) -> list[Path]:
    return [root / build.family.sources, root / "csrc" / "common", root / "csrc"]


def nvcc_flags(build: FamilyBuild, windows: bool = sys.platform == "win32") -> list[str]:
    """Release flags for kernel objects: optimized, no debug info, position independent."""
    host = ["-Xcompiler", "/MD", "-Xcompiler", "/O2"] if windows else \
        ["-Xcompiler", "-fPIC", "-Xcompiler", "-O3"]
    return ["-O3", f"-std={KERNEL_CXX_STD}", "-DNDEBUG", "--expt-relaxed-constexpr",
            *host, *build.gencode_flags()]


def cache_key(nvcc_id: str, flags: Sequence[str], source: Path, build: FamilyBuild,
              root: Path = REPO_ROOT) -> str:
    digest = hashlib.sha256()
    digest.update(nvcc_id.encode())
    digest.update("\0".join(flags).encode())
    digest.update(source.relative_to(root).as_posix().encode())
    # Everything the .cu could include: its family folder and csrc/common.
    for folder in include_dirs(build, root)[:2]:
        for path in sorted(folder.rglob("*")):
            if path.suffix in HEADER_SUFFIXES and path.is_file():
                digest.update(path.relative_to(root).as_posix().encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


@dataclasses.dataclass(frozen=True)
class KernelObject:
    source: Path
    path: Path
    cached: bool
    seconds: float


class Progress:
    """Prints one line per finished object and a heartbeat while compiles run."""

    def __init__(self, family: str, total: int, log: Callable[[str], None]) -> None:
        self.family, self.total, self.log = family, total, log
        self.start = time.monotonic()
        self.done = 0
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def begin(self, name: str) -> None:
        with self.lock:
            self.running[name] = time.monotonic()

    def finish(self, name: str, note: str) -> None:
        with self.lock:
            self.running.pop(name, None)
            self.done += 1
            self.log(f"[kernels {self.family}] {self.done}/{self.total} {name}: {note} "
                     f"(elapsed {self.elapsed():.1f}s)")

    def heartbeat(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            with self.lock:
                names = ", ".join(f"{n} {time.monotonic() - t:.0f}s"
                                  for n, t in self.running.items())
            if names:
                self.log(f"[kernels {self.family}] still compiling: {names} "
                         f"(elapsed {self.elapsed():.0f}s)")


def compile_family(build: FamilyBuild, *, nvcc: Path, nvcc_id: str, cache_dir: Path,
                   jobs: int, root: Path = REPO_ROOT,
                   log: Callable[[str], None] = print) -> list[KernelObject]:
    """Compile (or take from the cache) every .cu object of one family; returns them in order."""
    return compile_families([build], nvcc=nvcc, nvcc_id=nvcc_id, cache_dir=cache_dir, jobs=jobs,
                            root=root, log=log)[0]


def compile_families(builds: Sequence[FamilyBuild], *, nvcc: Path, nvcc_id: str, cache_dir: Path,
                     jobs: int, root: Path = REPO_ROOT,
                     log: Callable[[str], None] = print) -> list[list[KernelObject]]:
    """Compile (or take from the cache) every .cu object of every family, all through one pool
    of ``jobs`` compiles: a family has about three objects, so one family at a time left most of
    a many-core machine idle (the sm90 wheel's four families took 154 s one after another on 16
    cores, each about as long as its slowest object). Returns each family's objects in order."""
    windows = sys.platform == "win32"
    suffix = ".obj" if windows else ".o"
    # The toolchain's fingerprint (nvcc_id: nvcc's --version and the host compiler's version line,
    # both in every key) is in each family's first line: a carried cache that misses on another
    # machine then shows whether the toolchain is what differs.
    toolchain = hashlib.sha256(nvcc_id.encode()).hexdigest()[:8]
    tasks = []
    progresses = []
    for build in builds:
        sources = kernel_sources(build, root)
        flags = nvcc_flags(build)
        family_dir = cache_dir / build.family.name
        family_dir.mkdir(parents=True, exist_ok=True)
        progress = Progress(build.family.name, len(sources), log)
        progresses.append(progress)
        log(f"[kernels {build.family.name}] {len(sources)} objects, {jobs} job(s), "
            f"{' '.join(build.gencode_flags())}, toolchain {toolchain}, cache {family_dir}")
        tasks += [(build, flags, family_dir, progress, source) for source in sources]

    failed = threading.Event()  # set by the first failing compile: later ones do not start

    def one(task) -> KernelObject | None:
        build, flags, family_dir, progress, source = task
        if failed.is_set():
            return None
        key = cache_key(nvcc_id, flags, source, build, root)
        target = family_dir / f"{source.stem}-{key}{suffix}"
        if target.is_file():
            progress.finish(source.name, "cache hit")
            return KernelObject(source, target, True, 0.0)
        progress.begin(source.name)
        began = time.monotonic()
        partial = target.with_name(target.name + f".{os.getpid()}.tmp")
        command = [str(nvcc), "-c", str(source), "-o", str(partial), *flags,
                   *[f"-I{d}" for d in include_dirs(build, root)]]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            failed.set()
            partial.unlink(missing_ok=True)
            progress.finish(source.name, "FAILED")
            raise BuildError(f"nvcc failed on {source.relative_to(root)} "
                             f"(exit {result.returncode}):\n{' '.join(command)}\n"
                             f"{result.stdout}{result.stderr}")
        os.replace(partial, target)  # atomic: a killed build never leaves a half object
        seconds = time.monotonic() - began
        progress.finish(source.name, f"compiled in {seconds:.1f}s")
        return KernelObject(source, target, False, seconds)

    for progress in progresses:
        threading.Thread(target=progress.heartbeat, daemon=True).start()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(one, task) for task in tasks]
    finally:
        for progress in progresses:
            progress.stop.set()
    for future in futures:  # the first failure, in source order
        if future.exception() is not None:
            raise future.exception()
    objects = [future.result() for future in futures]
    per_family: list[list[KernelObject]] = []
    for progress in progresses:
        mine, objects = objects[:progress.total], objects[progress.total:]
        hits = sum(o.cached for o in mine)
        log(f"[kernels {progress.family}] done: {len(mine) - hits} compiled, {hits} from "
            f"cache, {progress.elapsed():.1f}s")
        per_family.append(mine)
    return per_family


def nvcc_in(toolkit: str | Path) -> Path | None:
    """The nvcc of a CUDA toolkit folder (its bin/), or None when it has none."""
    candidate = Path(toolkit) / "bin" / ("nvcc.exe" if sys.platform == "win32" else "nvcc")
    return candidate if candidate.is_file() else None


# The variables that name a CUDA toolkit folder, in the order find_nvcc reads them.
TOOLKIT_VARS = ("CUDA_HOME", "CUDA_PATH")


def find_nvcc(env: os._Environ | dict = os.environ) -> Path | None:
    """nvcc from CUDA_HOME / CUDA_PATH, else PATH."""
    for var in TOOLKIT_VARS:
        if env.get(var) and (nvcc := nvcc_in(env[var])) is not None:
            return nvcc
    found = shutil.which("nvcc")
    return Path(found) if found else None


def cuda_home_of(nvcc: Path) -> Path:
    """The toolkit folder of an nvcc, also when ``nvcc`` on PATH is a wrapper script (as
    /usr/local/bin/nvcc is on some images): nvcc's dry run names its own bin/ folder."""
    guess = nvcc.resolve().parent.parent
    if (guess / "include" / "cuda_runtime.h").is_file():
        return guess
    dry = subprocess.run([str(nvcc), "--dryrun", "-x", "cu", "-c", os.devnull],
                         capture_output=True, text=True)
    for line in (dry.stdout + dry.stderr).splitlines():
        if line.startswith("#$ _HERE_="):
            return Path(line.split("=", 1)[1].strip()).parent
    return guess


def nvcc_identity(nvcc: Path) -> str:
    """The full ``nvcc --version`` text: part of every cache key."""
    return subprocess.run([str(nvcc), "--version"], capture_output=True, text=True,
                          check=True).stdout
