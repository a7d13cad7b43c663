"""What ptxas made of each kernel: registers, spills, stack, and its performance notes.

    python -m scripts.factory ptxas [--family F ...] [--sm 90 ...] [-D NAME[=VALUE] ...]
                                    [--kernel REGEX] [--strict] [--json FILE] [--host]

Compiles each family's .cu files to cubins (device code only: seconds per file; ``--host`` to
object files, so that the launchers' host code compiles too, a few seconds more) with the release
flags of the factory's kernel build and ``-Xptxas=-v``, one SM target at a time, and tabulates
every kernel. A spill, a stack frame or a ptxas performance note (``(C7510) Potential Performance
Loss``: the wgmma pipeline serialized, as a ``printf`` in a wgmma kernel once caused) costs speed
silently: ``--strict`` exits 1 on any of them (CI runs it on the Hopper attention kernels; the
sm80 family's mma.sync kernels spill by design, at the 255-register ceiling or under a measured
occupancy cap, docs/kernels.md), the guard for the shipped kernels; tuning builds
pass their knobs with ``-D`` (``-D SAGE_WG_PERSISTENT=1``) to see what a variant costs before a
GPU call.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .arch import FamilyBuild, load_families
from .errors import FactoryError, ToolchainError
from .kernels import (Progress, find_nvcc, include_dirs, jobs_argument, jobs_from_env,
                      kernel_sources, nvcc_flags)
from .report import output_file

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_NOTE = re.compile(r"\((C\d+)\) (Potential Performance Loss: .*?)(?: in the function '([^']+)')?\s*$")
_WARNING = re.compile(r"ptxas.*\bwarning\b\s*:\s*(.*)$")


@dataclasses.dataclass
class Kernel:
    """One compiled entry function."""

    family: str
    source: str
    target: str
    name: str
    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)

    def problems(self) -> list[str]:
        found = [f"{self.spill_stores} bytes spill stores"] if self.spill_stores else []
        found += [f"{self.spill_loads} bytes spill loads"] if self.spill_loads else []
        found += [f"{self.stack} bytes stack frame"] if self.stack else []
        return found + self.notes


def parse_ptxas(text: str, family: str, source: str) -> tuple[list[Kernel], list[str]]:
    """Kernels in the order ptxas compiled them, and the warnings no kernel claims.

    A performance note names its function; it is attached to that kernel (or, without a name, to
    the kernel being compiled, else kept as a loose warning).
    """
    kernels: dict[tuple[str, str], Kernel] = {}
    current: Kernel | None = None
    pending_notes: list[tuple[str | None, str]] = []
    loose: list[str] = []
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            key = (m.group(1), m.group(2))
            current = kernels.setdefault(key, Kernel(family, source, m.group(2), m.group(1)))
        elif m := _PROPS.search(line):
            if current is not None:
                current.stack, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif m := _USED.search(line):
            if current is not None:
                current.registers = int(m.group(1))
        elif m := _NOTE.search(line):
            pending_notes.append((m.group(3), f"{m.group(1)} {m.group(2)}"))
        elif m := _WARNING.search(line):
            if current is not None:
                current.notes.append(f"warning: {m.group(1)}")
            else:
                loose.append(m.group(1))
    # ptxas prints the notes of a file before the entries they name
    for name, note in pending_notes:
        owners = [k for (fn, _), k in kernels.items() if fn == name] if name else []
        if owners:
            for k in owners:
                k.notes.append(note)
        else:
            loose.append(note)
    return list(kernels.values()), loose


@functools.lru_cache(maxsize=None)
def short_name(mangled: str) -> str:
    """A readable kernel name: c++filt's demangling without the namespace and parameter list."""
    filt = shutil.which("c++filt")
    if filt is None:
        return mangled
    name = subprocess.run([filt, mangled], capture_output=True, text=True).stdout.strip() or mangled
    name = re.sub(r"^void ", "", name)
    name = name.replace("sage::", "")
    # drop the parameter list: the last top-level "(...)"
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0 and name[i] == "(":
            return name[:i]
    return name


def compile_report(nvcc: Path, build: FamilyBuild, source: Path, defines: Sequence[str],
                   workdir: Path, host: bool = False) -> tuple[list[Kernel], list[str]]:
    """Compile one .cu for the build's single SASS target and parse what ptxas said; host: also
    its host code (an object file), which a cubin alone never compiles."""
    output = workdir / f"{build.family.name}_{source.stem}_{build.sass[0]}.{'o' if host else 'cubin'}"
    cmd = [str(nvcc), *nvcc_flags(build), "-c" if host else "-cubin", "-Xptxas=-v",
           *[f"-D{d}" for d in defines], *[f"-I{p}" for p in include_dirs(build)],
           "-o", str(output), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"nvcc failed on {source} ({build.family.name}, sm{build.sass[0]}):\n"
                             + (proc.stdout + proc.stderr)[-3000:])
    return parse_ptxas(proc.stdout + proc.stderr, build.family.name, source.name)


def report(families: Iterable[str] | None = None, sms: Iterable[int] | None = None,
           defines: Sequence[str] = (), jobs: int | None = None,
           nvcc: Path | None = None, host: bool = False,
           log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
           ) -> tuple[list[Kernel], list[str]]:
    """Every kernel of the chosen families (default: all) for each SM they serve (default: all;
    ``sms`` narrows it); host: compile each file's host code too (`compile_report`). Progress
    goes to ``log`` (stderr: stdout keeps the table), one line per file and a heartbeat."""
    table = load_families()
    names = list(families) if families else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ToolchainError(f"unknown famil{'y' if len(unknown) == 1 else 'ies'} "
                             f"{', '.join(unknown)}; families: {', '.join(table)}")
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise ToolchainError("nvcc not found: set CUDA_HOME (or put nvcc on PATH)")
    wanted = set(sms) if sms else None
    work: list[tuple[FamilyBuild, Path]] = []
    for name in names:
        fam = table[name]
        for sm in fam.serves:
            if wanted is None or sm in wanted:
                build = FamilyBuild(fam, (sm,), ())
                work += [(build, src) for src in kernel_sources(build)]
    if not work:
        served = sorted({sm for name in names for sm in table[name].serves})
        raise ToolchainError(f"none of {', '.join(names)} serves "
                             f"sm{', sm'.join(map(str, sorted(wanted or ())))}; "
                             f"{'it serves' if len(names) == 1 else 'they serve'} "
                             f"{', '.join(f'sm{sm}' for sm in served)}")
    kernels: list[Kernel] = []
    loose: list[str] = []
    jobs = jobs or jobs_from_env()
    progress = Progress("ptxas", len(work), log)
    log(f"[kernels ptxas] {len(work)} files of {', '.join(names)}, {jobs} job(s)")

    def one(item: tuple[FamilyBuild, Path]) -> tuple[list[Kernel], list[str]]:
        build, source = item
        name = f"{build.family.name}/{source.name} sm{build.sass[0]}"
        progress.begin(name)
        found, notes = compile_report(nvcc, build, source, defines, Path(tmp), host)
        progress.finish(name, f"{len(found)} kernels")
        return found, notes

    threading.Thread(target=progress.heartbeat, daemon=True).start()
    try:
        with tempfile.TemporaryDirectory(prefix="ptxas-") as tmp, \
                concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for found, notes in pool.map(one, work):
                kernels += found
                loose += notes
    finally:
        progress.stop.set()
    return kernels, loose


def format_table(kernels: Sequence[Kernel]) -> str:
    rows = [("family", "file", "target", "regs", "stack", "spill st/ld", "kernel", "notes")]
    for k in kernels:
        rows.append((k.family, k.source, k.target, str(k.registers), str(k.stack),
                     f"{k.spill_stores}/{k.spill_loads}", short_name(k.name), "; ".join(k.notes)))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:6], widths)) + "  " + r[6]
                     + (f"  [{r[7]}]" if r[7] else "") for r in rows)


def _regex(text: str) -> re.Pattern:
    """argparse type of --kernel: checked before anything is compiled."""
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression ({exc}): {text!r}") from None


def _sm_number(text: str) -> int:
    """argparse type of --sm: an SM as 90 or, as plan and build spell it, sm90."""
    match = re.fullmatch(r"(?:sm)?(\d{2,3})", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not an SM: {text!r}; write e.g. 90 or sm90")
    return int(match.group(1))


def _define(text: str) -> str:
    """argparse type of -D: NAME or NAME=VALUE, NAME a C identifier (nvcc refused it only after
    the compiles had started)."""
    if not re.fullmatch(r"[A-Za-z_]\w*(=.*)?", text, re.DOTALL):
        raise argparse.ArgumentTypeError(f"not NAME[=VALUE] with NAME a C identifier: {text!r}; "
                                         "e.g. -D SAGE_WG_PERSISTENT=1")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.factory ptxas",
        description="Compile kernel families to cubins with ptxas -v and tabulate registers, "
                    "stack, spills and ptxas performance notes per kernel (device code only, or with "
                    "--host the launchers too; no torch, no GPU).",
        epilog="exit codes: 0 done (with --strict: nothing found); 1 --strict found a spill, a "
               "stack frame or a performance note; 2 bad arguments, nvcc failed, or --json "
               "could not be written.")
    parser.add_argument("--family", nargs="+", action="extend", metavar="F",
                        help="families from sageattention/native/families.json (default: all)")
    parser.add_argument("--sm", nargs="+", action="extend", type=_sm_number, metavar="XY",
                        help="only these SM targets, e.g. 90 or sm90 (default: every SM each "
                             "family serves)")
    parser.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]",
                        type=_define,
                        help="a preprocessor define for every file, e.g. -D SAGE_WG_PERSISTENT=1")
    parser.add_argument("--kernel", type=_regex, metavar="REGEX",
                        help="only kernels whose name (demangled, or mangled) matches, e.g. attn_wgmma")
    parser.add_argument("--jobs", type=jobs_argument, default=None,
                        help="parallel nvcc runs (default: MAX_JOBS or the CPU count)")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 if any kernel spills, has a stack frame or a performance note")
    parser.add_argument("--json", type=output_file, metavar="FILE",
                        help="also write the kernels as JSON")
    parser.add_argument("--host", action="store_true",
                        help="also compile each file's host code (object files, slower): a launcher "
                             "that does not compile for some -D set fails here, not in a device build")
    args = parser.parse_args(argv)
    for option, given in (("--family", args.family), ("--sm", args.sm)):
        twice = sorted({str(x) for x in given or () if given.count(x) > 1})
        if twice:  # each file would compile, and each kernel be listed, twice
            parser.error(f"argument {option}: {', '.join(twice)} given twice; name each once")
    try:
        kernels, loose = report(args.family, args.sm, args.defines, args.jobs, host=args.host)
    except FactoryError as exc:  # no nvcc, an unknown family, a bad MAX_JOBS, a failed compile
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.kernel:
        kernels = [k for k in kernels if args.kernel.search(k.name) or args.kernel.search(short_name(k.name))]
        if not kernels:
            print(f"error: no kernel matches --kernel {args.kernel.pattern!r}", file=sys.stderr)
            return 2
    print(format_table(kernels))
    for note in loose:
        print(f"ptxas: {note}")
    if args.json:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps([dataclasses.asdict(k) for k in kernels], indent=1)
                                 + "\n")
        except OSError as exc:  # after the compiles: say so, no traceback
            print(f"error: cannot write --json {args.json}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    bad = [k for k in kernels if k.problems()]
    print(f"{len(kernels)} kernels, {len(bad)} with spills, a stack frame or a performance note"
          + (f" ({', '.join(sorted({k.family for k in bad}))})" if bad else ""))
    return 1 if args.strict and (bad or loose) else 0
