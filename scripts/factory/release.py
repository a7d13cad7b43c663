"""Assemble a release folder from built wheels and their validation reports: validated wheels only.

A wheel is accepted only when ``<reports>/<wheel stem>.report.json`` exists, names this wheel
(file name, version and tags), carries its sha256 and the wheel's own build info, names the
wheel's CUDA kernels for the run's GPU (``expectation.native_backends``), has no failed check and
at least one passed check that ran one of those kernels, and says it ran on a GPU this wheel can
run on, with the wheel's torch, CUDA and Python; when the wheel's METADATA and build info agree
with its file name; and when its notes ``<reports>/<wheel stem>.md`` are exactly what
``python -m scripts.factory.notes`` generates from that report (notes are generated, never written
or edited by hand). Everything else is refused, with the reasons, and is not copied. Accepted
wheels of two versions, or two builds of one matrix cell, stop the release (exit 2, nothing
written). docs/release.md lists every rule.

The release folder holds (flat, so it can be uploaded as GitHub release assets as-is)::

    <wheels>.whl  <stem>.md (notes)  <stem>.speedup.svg  <stem>.report.json  manifest.json
    SHA256SUMS  RELEASE_BODY.md
    simple/<local label>/sageattention/index.html   (PEP 503, see scripts/factory/index.py)

``manifest.json`` is what ``scripts/pick_wheel.py`` reads; docs/release.md documents its format.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field, replace
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

try:  # run as `python scripts/factory/release.py` or imported as scripts.factory.release
    from . import chart as chart_mod
    from . import index as index_mod
    from . import notes as notes_mod
    from . import report as report_mod
    from .labels import LocalLabel, expectation
except ImportError:  # pragma: no cover - script mode: the repository root first, as -m has it
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from scripts.factory import chart as chart_mod  # type: ignore[no-redef]
    from scripts.factory import index as index_mod  # type: ignore[no-redef]
    from scripts.factory import notes as notes_mod  # type: ignore[no-redef]
    from scripts.factory import report as report_mod  # type: ignore[no-redef]
    from scripts.factory.labels import LocalLabel, expectation  # type: ignore[no-redef]

PROJECT = "sageattention"
MANIFEST_SCHEMA_VERSION = 1
BUILD_INFO_PATH = "sageattention/_build_info.json"
FAMILIES_PATH = "sageattention/native/families.json"  # the wheel's own kernel family table

EXIT_OK = 0
EXIT_REFUSED = 1  # some wheel refused (the release is still written with the accepted ones)
EXIT_USAGE = 2
EXIT_NOTHING = 3  # no wheel accepted: nothing written

__all__ = [
    "Accepted",
    "Refused",
    "ReleasePlan",
    "GpuTarget",
    "parse_gpu_target",
    "parse_compute_capability",
    "normalize_cuda",
    "judge_wheel",
    "plan_release",
    "write_release",
    "main",
]


# ---------------------------------------------------------------- small parsers (pure)

_TARGET_RE = re.compile(r"^(?:sm_?|compute_?)?(\d+)(\d)([af]?)(\+ptx)?$", re.IGNORECASE)
_DOTTED_TARGET_RE = re.compile(r"^(\d+)\.(\d+)([af]?)(\+ptx)?$", re.IGNORECASE)


@dataclass(frozen=True)
class GpuTarget:
    """One SM target of a wheel: SASS for ``cc`` (runs on the same major, minor >= ``cc``'s;
    only on exactly ``cc`` when arch-specific like sm_90a), plus PTX when embedded, JIT-compiled
    by the driver where the dispatcher runs it: ``ptx_serves`` lists those GPUs (a '+PTX'
    target's PTX: the SMs its families serve), None every GPU at or newer than ``cc`` (a family's
    embed_ptx), the rule of expectation.ptx_serves."""

    name: str
    cc: tuple[int, int]
    ptx: bool
    arch_specific: bool
    ptx_serves: tuple[tuple[int, int], ...] | None = None

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "cc": f"{self.cc[0]}.{self.cc[1]}",
            "sass": True,
            "ptx": self.ptx,
            "arch_specific": self.arch_specific,
            "ptx_serves": None if not self.ptx or self.ptx_serves is None
            else [f"{a}.{b}" for a, b in self.ptx_serves],
        }

    def runs_on(self, cc: tuple[int, int]) -> str | None:
        """'native', 'ptx-jit' or None: how code built for this target runs on a GPU of ``cc``."""
        if self.arch_specific:
            if cc == self.cc:
                return "native"
        elif expectation().sass_runs_on(self.cc[0] * 10 + self.cc[1], cc[0] * 10 + cc[1]):
            return "native"
        if self.ptx and cc >= self.cc and (self.ptx_serves is None or cc in self.ptx_serves):
            return "ptx-jit"
        return None


def parse_gpu_target(text: str) -> GpuTarget:
    """Parse an SM target as build info writes it: ``sm75``, ``sm75+PTX``, ``sm_90a``, ``8.9``."""
    if not isinstance(text, str):
        raise TypeError(f"SM target must be a string like 'sm75+PTX', got {type(text).__name__}")
    cleaned = text.strip()
    match = _TARGET_RE.match(cleaned) or _DOTTED_TARGET_RE.match(cleaned)
    if not match:
        raise ValueError(
            f"unrecognised SM target {text!r}; "
            "expected forms like 'sm75', 'sm75+PTX', 'sm_90a', '8.9'"
        )
    major, minor, suffix, ptx = match.groups()
    return GpuTarget(
        name=cleaned,
        cc=(int(major), int(minor)),
        ptx=bool(ptx),
        arch_specific=bool(suffix),
    )


def parse_compute_capability(value: object) -> tuple[int, int]:
    """Compute capability from a report: ``"9.0"``, ``[9, 0]``, ``"sm90"``, ``"sm_90"``, ``90``."""
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) for v in value)
    ):
        return int(value[0]), int(value[1])
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10:
        return divmod(value, 10)
    if isinstance(value, str):
        try:
            target = parse_gpu_target(value)
        except ValueError:
            pass
        else:
            if not target.ptx and not target.arch_specific:
                return target.cc
    raise ValueError(
        f"unrecognised compute capability {value!r}; expected '9.0', [9, 0], 'sm90' or 90"
    )


def normalize_cuda(value: object) -> str:
    """CUDA version as ``"13.0"`` from ``"13.0"``, ``"cu130"``, ``"cu128"`` or ``"12.8.1"``."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"unrecognised CUDA version {value!r}; expected '13.0' or 'cu130'")
    text = value.strip().lower()
    if text.startswith("cu"):
        digits = text[2:]
        if digits.isdigit() and len(digits) >= 2:
            return f"{int(digits[:-1])}.{int(digits[-1])}"
    else:
        parts = text.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return f"{int(parts[0])}.{int(parts[1])}"
    raise ValueError(f"unrecognised CUDA version {value!r}; expected '13.0' or 'cu130'")


def os_of_platform_tag(platform_tag: str) -> str:
    """'linux', 'windows' or 'macos' for a wheel platform tag (display and grouping only)."""
    if platform_tag.startswith(("linux", "manylinux", "musllinux")):
        return "linux"
    if platform_tag.startswith("win"):
        return "windows"
    if platform_tag.startswith("macosx"):
        return "macos"
    return platform_tag


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- judging one wheel


@dataclass(frozen=True)
class WheelFacts:
    """What the wheel itself says: filename facts, its build info and its METADATA."""

    filename: str
    version: str
    local_label: str
    tags: tuple[str, ...]
    platforms: tuple[str, ...]
    build_info: dict
    requires_python: str | None
    torch_requirement: str | None
    # families.json's "families" as the wheel carries it (None: the wheel has none), for where
    # its PTX runs
    families_table: dict | None = None


@dataclass(frozen=True)
class Accepted:
    path: Path
    sha256: str
    size: int
    facts: WheelFacts
    targets: tuple[GpuTarget, ...]
    report: dict
    report_path: Path
    note_path: Path

    @property
    def chart_path(self) -> Path:
        """The speed-up chart the note links, beside it (checked by _check_note)."""
        return self.note_path.parent / chart_mod.chart_filename(self.path.name)


@dataclass(frozen=True)
class Refused:
    filename: str
    reasons: tuple[str, ...]


@dataclass
class ReleasePlan:
    accepted: list[Accepted] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)


def read_wheel_facts(path: Path) -> WheelFacts:
    """Read the filename, build info and METADATA of a wheel. Raises ValueError if unusable."""
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise ValueError(f"not a valid wheel filename: {exc}") from None
    if name != canonicalize_name(PROJECT):
        raise ValueError(f"not a {PROJECT} wheel (project {name!r})")
    if not version.local:
        raise ValueError("the version has no local label (expected e.g. 2.2.0+sm75.torch2.12cu130)")
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            if BUILD_INFO_PATH not in names:
                raise ValueError(
                    f"the wheel has no {BUILD_INFO_PATH}: it was not built by the factory"
                )
            build_info = json.loads(zf.read(BUILD_INFO_PATH))
            families_table = None
            if FAMILIES_PATH in names:
                try:
                    families_table = json.loads(zf.read(FAMILIES_PATH))["families"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise ValueError(f"{FAMILIES_PATH} in the wheel is not a kernel family table "
                                     f"(JSON with a 'families' object)") from None
                if not isinstance(families_table, dict) or not all(
                        isinstance(v, dict) for v in families_table.values()):
                    raise ValueError(f"{FAMILIES_PATH} in the wheel: 'families' must map names "
                                     f"to objects")
            metadata_name = next(
                (n for n in names if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None
            )
            if metadata_name is None:
                raise ValueError("the wheel has no .dist-info/METADATA")
            metadata = HeaderParser().parsestr(zf.read(metadata_name).decode("utf-8"))
    except zipfile.BadZipFile as exc:
        raise ValueError(f"not a readable zip file: {exc}") from None
    except OSError as exc:  # a folder named *.whl, no permission
        raise ValueError(f"cannot read the wheel: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{BUILD_INFO_PATH} is not valid JSON: {exc}") from None
    if not isinstance(build_info, dict):
        raise ValueError(f"{BUILD_INFO_PATH} is not a JSON object")
    try:
        meta_version = Version(str(metadata.get("Version")))
    except InvalidVersion:
        meta_version = None
    if canonicalize_name(str(metadata.get("Name"))) != name or meta_version != version:
        # pip refuses to install a wheel whose METADATA names another project or version
        raise ValueError(f"{metadata_name} says {metadata.get('Name')} {metadata.get('Version')}, "
                         f"but the file name says {PROJECT} {version}: pip refuses such a wheel")
    torch_req = None
    for line in metadata.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == "torch" and req.marker is None:
            torch_req = str(req.specifier) or None
    return WheelFacts(
        filename=path.name,
        version=str(version),
        local_label=version.local,
        tags=tuple(sorted(str(t) for t in tags)),
        platforms=tuple(sorted({t.platform for t in tags})),
        build_info=build_info,
        requires_python=metadata.get("Requires-Python"),
        torch_requirement=torch_req,
        families_table=families_table,
    )


def _cc_pairs(sms) -> tuple[tuple[int, int], ...] | None:
    """SM numbers (90) as sorted compute capabilities ((9, 0)); None stays None."""
    return None if sms is None else tuple(sorted((sm // 10, sm % 10) for sm in sms))


def _check_build_info(facts: WheelFacts) -> tuple[list[str], tuple[GpuTarget, ...]]:
    reasons: list[str] = []
    info = facts.build_info
    try:
        same_version = Version(str(info.get("version"))) == Version(facts.version)
    except InvalidVersion:
        same_version = False
    if not same_version:
        reasons.append(f"build info version {info.get('version')!r} is not the file name's "
                       f"{facts.version}")
    if info.get("local_label") not in (None, facts.local_label):
        reasons.append(
            f"build info local_label {info.get('local_label')!r} does not match the filename's "
            f"{facts.local_label!r}"
        )
    for key in ("torch", "cuda", "sm_targets", "cell_id"):
        if not info.get(key):
            reasons.append(f"build info has no {key!r}")
    targets: list[GpuTarget] = []
    raw_targets = info.get("sm_targets") or []
    if not isinstance(raw_targets, list):
        reasons.append(f"build info sm_targets must be a list, got {raw_targets!r}")
        raw_targets = []
    for raw in raw_targets:
        try:
            targets.append(parse_gpu_target(raw))
        except (TypeError, ValueError) as exc:
            reasons.append(f"build info: {exc}")
    # The PTX a wheel embeds is build info's "ptx" list: '+PTX' targets' and also a family's
    # embed_ptx (the sm75 family's compute_75 in a plain 'sm75' wheel), as the runtime guard reads.
    embedded = info.get("ptx") or []
    if not isinstance(embedded, list) or not all(
        isinstance(p, str) and re.fullmatch(r"compute_\d+\d", p) for p in embedded
    ):
        reasons.append(f"build info ptx must be a list like ['compute_75'], got {embedded!r}")
        embedded = []
    ptx_ccs = {(int(p[8:-1]), int(p[-1])) for p in embedded}
    targets = [replace(t, ptx=True) if t.cc in ptx_ccs else t for t in targets]
    # Where each PTX runs: the wheel's own family table and families (without them, as the
    # driver would run it: every newer GPU).
    wheel_families = info.get("families")
    if facts.families_table is not None and isinstance(wheel_families, list) and wheel_families:
        rule = expectation()
        unknown = [f for f in wheel_families if f not in facts.families_table]
        if unknown:
            reasons.append(f"build info families {unknown} are not in the wheel's {FAMILIES_PATH}")
        targets = [replace(t, ptx_serves=_cc_pairs(rule.wheel_ptx_serves(
            facts.families_table, wheel_families, t.cc[0] * 10 + t.cc[1]))) if t.ptx else t
            for t in targets]
    # The manifest takes torch, CUDA and targets from build info and the torch pin from METADATA;
    # the picker and the user read the label. They must say one thing (the label rule of
    # sageattention/build_info.py, which `factory check` applies too).
    try:
        label = LocalLabel.parse(facts.local_label)
    except ValueError as exc:
        reasons.append(f"the file name's label: {exc}")
    else:
        if info.get("torch") and info.get("cuda") and targets:
            try:
                built = LocalLabel.create([t.cc[0] * 10 + t.cc[1] for t in targets],
                                          str(info["torch"]), str(info["cuda"]))
            except ValueError as exc:
                reasons.append(f"build info: {exc}")
            else:
                if built != label:
                    reasons.append(
                        f"build info (sm_targets {raw_targets}, torch {info['torch']}, CUDA "
                        f"{info['cuda']}) says label {built}, the file name says {label}")
        pin = f"=={label.torch[0]}.{label.torch[1]}.*"
        if facts.torch_requirement != pin:
            reasons.append(f"METADATA requires torch{facts.torch_requirement or ' (any)'}, but "
                           f"the label says torch{pin}: pip would install another torch")
    if info.get("cuda"):
        try:
            normalize_cuda(info["cuda"])
        except ValueError as exc:
            reasons.append(f"build info: {exc}")
    return reasons, tuple(targets)


def _check_report(
    report_path: Path, wheel_path: Path, targets: tuple[GpuTarget, ...],
    build_info: dict | None = None,
) -> tuple[list[str], dict | None]:
    """Reasons to refuse the wheel on account of its report (empty: the report clears it), and
    the report when it is a valid one (None otherwise). ``build_info``: the wheel's own, which
    the run must have imported (the report's build_info is what the run's package said)."""
    if not report_path.is_file():
        return [
            f"no validation report ({report_path.name} missing): the wheel was not validated"
        ], None
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [f"report {report_path.name} is not readable JSON: {exc}"], None
    # The report format is report.py's rule; the release only adds what "validated" means.
    problems = report_mod.validate_report(report)
    reasons = [f"invalid report: {p}" for p in problems]
    if not isinstance(report, dict):
        return reasons, None
    wheel = report.get("wheel")
    if isinstance(wheel, dict) and {"filename", "sha256"} <= wheel.keys():
        try:
            report_mod.verify_wheel(report, wheel_path)  # same file name, same sha256
        except report_mod.ReportError as exc:
            reasons.append(str(exc))

    if build_info is not None:
        reasons += _same_build_info(report.get("build_info"), build_info)
    # failed checks, no pass, or passes that prove nothing about the wheel's CUDA kernels: only
    # the wheel's own kernels on that GPU (the report's expectation) count
    own = report_mod.own_backends(report)
    if own is None:
        reasons.append("the report does not name the wheel's CUDA kernels the run had to run "
                       "(expectation.native_backends): a pass cannot be told from another "
                       "kernel's; validate the wheel again with the current suite")
    reasons += report_mod.unproven(report.get("checks"), own)

    execution = report.get("execution")
    env = report.get("environment") if isinstance(report.get("environment"), dict) else {}
    try:
        cc = parse_compute_capability(env.get("compute_capability"))
    except ValueError:
        cc = None  # validate_report has named the problem
    if cc is not None and targets and execution in report_mod.EXECUTIONS:
        # The report must come from a GPU this wheel runs on, the way the report says it ran.
        ways = {t.runs_on(cc) for t in targets} - {None}
        if execution not in ways:
            can = " or ".join(sorted(ways)) if ways else "not at all"
            reasons.append(
                f"report says {execution} on compute capability {cc[0]}.{cc[1]}, but this wheel "
                f"({', '.join(t.name for t in targets)}) runs there {can}"
            )
    return reasons, (None if problems else report)


def _same_build_info(ran: object, wheel: dict) -> list[str]:
    """The build info the run's package reported must be the wheel's own: another one means the
    run imported another installation (or the report is another build's), and the notes, which
    state the report's build info, would describe that build."""
    if ran is None:
        return ["the report has no build_info: the run did not show that it imported this wheel "
                "(a source tree has none); validate the wheel again"]
    if ran == wheel:
        return []
    if not isinstance(ran, dict):
        return []  # validate_report has named the problem
    keys = sorted(k for k in set(ran) | set(wheel) if ran.get(k) != wheel.get(k))
    shown = ", ".join(f"{k} {ran.get(k)!r} (the wheel's: {wheel.get(k)!r})" for k in keys[:4])
    return [f"the report's build_info is not this wheel's: {shown}"
            f"{f' and {len(keys) - 4} more' if len(keys) > 4 else ''}; the run imported another "
            "build of sageattention, or the report is another build's: validate this wheel"]


def _check_note(note_path: Path, report_path: Path, report: dict | None) -> list[str]:
    """Reasons to refuse the wheel on account of its notes: they and the speed-up chart they link
    must exist and be, byte for byte, what ``python -m scripts.factory.notes`` generates from the
    report (notes are generated from real runs, never written or edited by hand)."""
    if not note_path.is_file():
        return [f"no release notes ({note_path.name} missing): run the notes step "
                "(nox -s notes)"]
    if report is None:
        return []  # no report, or an invalid one: its reasons say why; nothing to compare with
    try:
        # notes.generate is what `python -m scripts.factory.notes` writes: load_report, its
        # refusals (an environment it cannot state, a misnamed report), then render.
        _, chart_path, expected, expected_svg = notes_mod.generate(report_path, note_path.parent)
    except Exception as exc:  # any failure of the notes step is a refusal reason, not a traceback
        why = " ".join(str(exc).split()) or type(exc).__name__
        return [f"release notes cannot be generated from {report_path.name} "
                f"(python -m scripts.factory.notes refuses it: {why}): a note is generated from "
                "its report, so this wheel has none"]
    try:
        actual = note_path.read_bytes()
    except OSError as exc:
        return [f"release notes {note_path.name} are not readable: {exc.strerror or exc}"]
    if actual != expected.encode("utf-8"):
        return [f"release notes {note_path.name} differ from what python -m scripts.factory.notes "
                f"generates from {report_path.name}: notes are generated from the report, never "
                "written or edited by hand; run the notes step (nox -s notes, or python -m "
                f"scripts.factory.notes {report_path.name}) and publish what it writes"]
    # the note shows this chart: published without it, its link would be broken
    if not chart_path.is_file() or chart_path.read_bytes() != expected_svg.encode("utf-8"):
        return [f"the speed-up chart {chart_path.name} that the notes link is "
                f"{'missing' if not chart_path.is_file() else 'not what the notes step generates'}"
                f": run the notes step (nox -s notes), which writes it beside the note"]
    return []


def judge_wheel(wheel_path: Path, reports_dir: Path) -> Accepted | Refused:
    """Accept or refuse one wheel, naming every reason for a refusal."""
    try:
        facts = read_wheel_facts(wheel_path)
    except ValueError as exc:
        return Refused(wheel_path.name, (str(exc),))
    sha256 = sha256_of(wheel_path)
    stem = wheel_path.name[: -len(".whl")]
    reasons, targets = _check_build_info(facts)
    report_path = reports_dir / f"{stem}.report.json"
    report_reasons, report = _check_report(report_path, wheel_path, targets, facts.build_info)
    reasons += report_reasons
    note_path = reports_dir / f"{stem}.md"
    reasons += _check_note(note_path, report_path, report)
    if reasons or report is None:
        return Refused(wheel_path.name, tuple(reasons))
    return Accepted(
        path=wheel_path,
        sha256=sha256,
        size=wheel_path.stat().st_size,
        facts=facts,
        targets=targets,
        report=report,
        report_path=report_path,
        note_path=note_path,
    )


def plan_release(wheels: list[Path], reports_dir: Path, progress=None) -> ReleasePlan:
    """Judge every wheel; ``progress(i, n, path)`` is called before each (hashing a wheel of
    hundreds of MB takes seconds)."""
    plan = ReleasePlan()
    ordered = sorted(wheels, key=lambda p: p.name)
    for i, wheel in enumerate(ordered, 1):
        if progress is not None:
            progress(i, len(ordered), wheel)
        verdict = judge_wheel(wheel, reports_dir)
        (plan.accepted if isinstance(verdict, Accepted) else plan.refused).append(verdict)
    by_version: dict[str, list[str]] = {}
    for a in plan.accepted:
        by_version.setdefault(Version(a.facts.version).public, []).append(a.path.name)
    if len(by_version) > 1:
        listed = "; ".join(f"{v}: {', '.join(names)}" for v, names in sorted(by_version.items()))
        raise ValueError(f"wheels of several versions in one release ({listed}); a release "
                         "holds one version: move the others out of the wheel folder")
    clashes = _same_cell(plan.accepted)
    if clashes:
        raise ValueError("; ".join(clashes) + ": a release holds one wheel per matrix cell (the "
                         "picker could not choose between them); keep only the one to publish "
                         "(the repaired wheel) in the wheel folder")
    return plan


def _same_cell(accepted: list[Accepted]) -> list[str]:
    """Accepted wheels that are builds of one matrix cell: the same build info cell_id, or the
    same local label, Python/ABI tags and OS (the pre-repair linux_x86_64 wheel beside its
    repaired manylinux one)."""
    groups: dict[tuple, list[str]] = {}
    for a in accepted:
        tags = parse_wheel_filename(a.path.name)[3]
        pythons = tuple(sorted({f"{t.interpreter}-{t.abi}" for t in tags}))
        oses = tuple(sorted({os_of_platform_tag(p) for p in a.facts.platforms}))
        for key in (("cell", a.facts.build_info.get("cell_id")),
                    ("variant", a.facts.local_label, pythons, oses)):
            if key[1] is not None:
                groups.setdefault(key, []).append(a.path.name)
    clashes, said = [], set()
    for key, names in groups.items():
        if len(names) > 1 and frozenset(names) not in said:
            said.add(frozenset(names))
            what = (f"cell {key[1]!r}" if key[0] == "cell" else
                    f"label {key[1]}, {', '.join(key[2])}, {', '.join(key[3])}")
            clashes.append(f"{' and '.join(names)} are builds of one matrix cell ({what})")
    return clashes


# ---------------------------------------------------------------- outputs


def validation_summary(report: dict) -> dict:
    checks = report.get("checks", [])
    counts = {s: sum(1 for c in checks if c.get("status") == s) for s in ("pass", "fail", "skip")}
    env = report.get("environment", {})
    perf = report.get("performance") if isinstance(report.get("performance"), dict) else {}
    cc = parse_compute_capability(env.get("compute_capability"))
    return {
        "status": "passed",
        "gpu_name": env.get("gpu_name"),
        "compute_capability": f"{cc[0]}.{cc[1]}",
        "execution": report.get("execution"),
        "checks_passed": counts["pass"],
        "checks_failed": counts["fail"],
        "checks_skipped": counts["skip"],
        "backends": sorted({b for c in checks if c.get("status") == "pass"
                            for b in report_mod.ran_backends(c)}),
        "geomean_speedup_vs_sdpa": perf.get("geomean_speedup_vs_sdpa"),
    }


def manifest_entry(item: Accepted, index_dir: str) -> dict:
    facts = item.facts
    info = facts.build_info
    stem = facts.filename[: -len(".whl")]
    return {
        "filename": facts.filename,
        "url": facts.filename,  # relative to manifest.json (release assets are flat)
        "sha256": item.sha256,
        "size": item.size,
        "version": facts.version,
        "local_label": facts.local_label,
        "cell": info.get("cell_id"),
        "tags": list(facts.tags),
        "os": sorted({os_of_platform_tag(p) for p in facts.platforms}),
        "requires_python": facts.requires_python,
        "torch": info.get("torch"),
        "torch_requirement": facts.torch_requirement,
        "cuda": normalize_cuda(info["cuda"]),
        "gpu_targets": [t.as_json() for t in item.targets],
        "families": info.get("families"),
        "execution": item.report.get("execution"),
        "validation": validation_summary(item.report),
        "note": f"{stem}.md",
        "report": f"{stem}.report.json",
        "index": f"{index_dir}/{facts.local_label}/",
    }


def render_body(version: str, entries: list[dict], plan: ReleasePlan, notes: dict[str, str]) -> str:
    lines = [
        f"# {PROJECT} {version}",
        "",
        "Every wheel below passed the GPU validation suite on the GPU named in its row; "
        "wheels that were not validated, failed, or changed after validation are not published.",
        "",
        "Find the one wheel for your machine (standard library only; reads your OS, Python, torch, "
        "CUDA and GPU):",
        "",
        "```",
        "python scripts/pick_wheel.py --manifest <this release's manifest.json URL>",
        "```",
        "",
        "| wheel | OS | torch | CUDA | SM targets | validated on | runs there as | checks "
        "| geomean vs SDPA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        v = e["validation"]
        speed = v["geomean_speedup_vs_sdpa"]
        lines.append(
            f"| `{e['filename']}` | {', '.join(e['os'])} | {e['torch']} | {e['cuda']} | "
            f"{', '.join(t['name'] for t in e['gpu_targets'])} | "
            f"{v['gpu_name']} ({v['compute_capability']}) | "
            f"{v['execution']} | {v['checks_passed']} passed, {v['checks_skipped']} skipped | "
            f"{f'{speed:.2f}x' if isinstance(speed, (int, float)) else 'n/a'} |"
        )
    lines += [
        "",
        "`ptx-jit` means the wheel's code ran as PTX compiled by the driver on a newer GPU: that "
        "validates the code path's correctness, not the older GPU itself.",
        "",
        "Checksums: `SHA256SUMS` (`sha256sum -c SHA256SUMS`). "
        "Machine-readable list: `manifest.json`.",
    ]
    if plan.refused:
        lines += ["", "## Not published", ""]
        for r in plan.refused:
            lines.append(f"- `{r.filename}`: {'; '.join(r.reasons)}")
    for e in entries:
        lines += ["", f"## {e['filename']}", "", notes[e["filename"]].strip()]
    return "\n".join(lines) + "\n"


class WheelChangedError(RuntimeError):
    """An accepted wheel's bytes changed between its checks and its copy into the release."""


def write_release(
    plan: ReleasePlan,
    out_dir: Path,
    index_base_url: str | None = None,
    index_url: str | None = None,
    index_dir: str = "simple",
) -> dict:
    """Write the release folder atomically (built beside ``out_dir``, then moved).

    Returns the manifest."""
    if not plan.accepted:
        raise ValueError("no wheel was accepted: refusing to write an empty release")
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        entries, notes, index_entries = [], {}, []
        for item in plan.accepted:
            shutil.copy2(item.path, staging / item.path.name)
            copied = sha256_of(staging / item.path.name)
            if copied != item.sha256:   # what is published must be the file that was judged
                raise WheelChangedError(
                    f"{item.path.name} changed after it was checked (sha256 {item.sha256} then, "
                    f"{copied} when copied); run the release again")
            shutil.copy2(item.report_path, staging / item.report_path.name)
            shutil.copy2(item.note_path, staging / item.note_path.name)
            shutil.copy2(item.chart_path, staging / item.chart_path.name)
            notes[item.path.name] = item.note_path.read_text(encoding="utf-8")
            entries.append(manifest_entry(item, index_dir))
            index_entries.append(
                index_mod.IndexEntry(item.path.name, item.sha256, item.facts.requires_python)
            )
        index_mod.write_index(staging / index_dir, PROJECT, index_entries, index_base_url)
        version = Version(entries[0]["version"]).public
        manifest = {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "project": PROJECT,
            "version": version,
            "generated_by": "scripts/factory/release.py (nox -s release)",
            "index": {
                "layout": "one PEP 503 index per local label",
                "path": f"{index_dir}/",
                "url": index_url,
                "wheel_base_url": index_base_url,
            },
            "wheels": entries,
            "refused": [{"filename": r.filename, "reasons": list(r.reasons)} for r in plan.refused],
        }
        (staging / "manifest.json").write_text(
            json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8"
        )
        summed = sorted(p.name for p in staging.iterdir() if p.is_file())
        (staging / "SHA256SUMS").write_text(
            "".join(f"{sha256_of(staging / name)}  {name}\n" for name in summed), encoding="utf-8"
        )
        (staging / "RELEASE_BODY.md").write_text(
            render_body(version, entries, plan, notes), encoding="utf-8"
        )
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


# ---------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.factory.release",
        description=(
            "Assemble a release folder from built wheels and their GPU validation reports. "
            "Only wheels whose report exists, matches the wheel's sha256 and passed are published; "
            "every refusal is printed with its reasons."
        ),
        epilog=(
            f"exit codes: {EXIT_OK} all wheels accepted (or some refused with --allow-partial); "
            f"{EXIT_REFUSED} some refused (release still written with the accepted ones); "
            f"{EXIT_USAGE} bad arguments or inputs (also: accepted wheels of two versions, or "
            "two builds of one matrix cell), or --out could not be written; "
            f"{EXIT_NOTHING} no wheel accepted (nothing written)"
        ),
    )
    parser.add_argument(
        "--wheels",
        type=Path,
        default=Path("wheelhouse"),
        help="folder of built (repaired) wheels (default: wheelhouse)",
    )
    parser.add_argument(
        "--reports",
        type=Path,
        default=Path("release_notes"),
        help="folder of <wheel stem>.report.json and <wheel stem>.md (default: release_notes)",
    )
    parser.add_argument(
        "--out",
        type=report_mod.output_dir,
        default=Path("dist/release"),
        help="release folder to write; replaced if it holds a previous release; must not be or "
        "hold --wheels or --reports (default: dist/release)",
    )
    parser.add_argument(
        "--index-base-url",
        default=None,
        type=index_mod.absolute_url,
        help="absolute URL the index links wheels under (e.g. the GitHub release "
        "download URL); default: relative links into the release folder",
    )
    parser.add_argument(
        "--index-url",
        default=None,
        type=index_mod.absolute_url,
        help="public URL where the simple/ folder will be hosted; recorded in "
        "manifest.json so the picker can print the --index-url command",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="exit 0 even if some wheels were refused (they are still left out)",
    )
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    return parser


def _progress(i: int, n: int, wheel: Path) -> None:
    print(f"[{i}/{n}] checking {wheel.name}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for what, folder in (("wheel", args.wheels), ("report", args.reports)):
        if not folder.is_dir():
            why = "is a file, not a folder" if folder.exists() else "does not exist"
            print(f"error: {what} folder {folder} {why}", file=sys.stderr)
            return EXIT_USAGE
    out = args.out.resolve()
    for what, folder in (("wheel", args.wheels), ("report", args.reports)):
        # Replacing --out removes everything in it: an input there would be deleted.
        if folder.resolve() == out or out in folder.resolve().parents:
            where = "is" if folder.resolve() == out else "holds"
            print(
                f"error: --out {args.out} {where} the {what} folder {folder}; replacing the "
                "release would delete it: choose another --out",
                file=sys.stderr,
            )
            return EXIT_USAGE
    if args.out.exists() and any(args.out.iterdir()) and not (args.out / "manifest.json").is_file():
        print(
            f"error: {args.out} is not empty and holds no previous release; choose another --out",
            file=sys.stderr,
        )
        return EXIT_USAGE
    wheels = sorted(args.wheels.glob("*.whl"))
    if not wheels:
        print(f"error: no *.whl in {args.wheels}", file=sys.stderr)
        return EXIT_USAGE
    try:
        plan = plan_release(wheels, args.reports, progress=None if args.json else _progress)
    except ValueError as exc:  # several versions, or two wheels of one cell
        print(f"error: {exc}; nothing written", file=sys.stderr)
        return EXIT_USAGE

    def report_json(written: bool) -> None:
        # printed once the outcome is known: "out" names the release only where it was written
        if args.json:
            print(json.dumps({
                "accepted": [a.path.name for a in plan.accepted],
                "refused": [{"filename": r.filename, "reasons": list(r.reasons)} for r in plan.refused],
                "out": str(args.out) if written else None,
            }, indent=2))

    if not args.json:
        for item in plan.accepted:
            print(f"accepted  {item.path.name}")
        for r in plan.refused:
            print(f"REFUSED   {r.filename}")
            for reason in r.reasons:
                print(f"          - {reason}")
    if not plan.accepted:
        report_json(False)
        print("error: no wheel passed the release checks; nothing written", file=sys.stderr)
        return EXIT_NOTHING
    try:
        write_release(plan, args.out, args.index_base_url, args.index_url)
    except WheelChangedError as exc:
        report_json(False)
        print(f"error: {exc}; nothing written", file=sys.stderr)
        return EXIT_NOTHING
    except ValueError as exc:  # the index refuses two accepted wheels it cannot tell apart
        report_json(False)
        print(f"error: {exc}: keep one of them in {args.wheels}; nothing written",
              file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:  # a read-only or full --out: write_release leaves nothing behind
        report_json(False)
        print(f"error: cannot write the release to {args.out}: {exc.strerror or exc}; nothing "
              "written", file=sys.stderr)
        return EXIT_USAGE
    report_json(True)
    if not args.json:
        print(f"wrote {len(plan.accepted)} wheel(s) to {args.out} ({len(plan.refused)} refused)")
    if plan.refused and not args.allow_partial:
        return EXIT_REFUSED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
