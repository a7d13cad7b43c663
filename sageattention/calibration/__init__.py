"""Calibration tables: measured milliseconds of each backend on a grid of shapes, per GPU capability.

`sm<major><minor>.json` in this package is the table for GPUs of exactly that compute capability,
and `sm<major><minor>-<model>.json` (e.g. `sm90-nvidia-h200.json`, `model_slug` of the GPU's name)
one for a single GPU model of it, which that model reads instead: cards of one capability differ in
memory bandwidth and clocks, so SDPA's speed against ours does too. Each is written from real
measurements by `python -m sageattention.calibrate` (its `_generated` line says how to regenerate
it). The dispatcher reads it to pick, for a call's shape, the backend that was
measured fastest, SDPA included (off the grid: estimated from the nearest measured shapes). This
module owns the format: validating a table, the entries near a shape and what they say of it, and
writing a table. Loading for the dispatcher never raises: a missing
file means "no calibration"; a broken one is logged once and the static order is used, and so is
a path given by SAGEATTENTION_CALIBRATION that gives no table for the GPU (a broken table, one of
another capability, a folder without one for it): logged once, saying why and what is used instead.

Schema (version 1):

    {"_generated": "...", "schema_version": 1, "capability": [9, 0], "gpu_name": "...",
     "torch": "...", "triton": "..." | null, "date": "...", "command": "...", "method": "...",
     "entries": [{"dtype": "fp16", "batch": 4, "heads": 32, "seq_len": 4096, "head_dim": 128,
                  "causal": false, "ms": {"sdpa": 0.96, "cuda-sm80-fp16": 2.2}}, ...]}

A backend missing from an entry's "ms" was not measured there (it did not run). An entry whose keys
per sequence differ from its queries' (cross-attention, a decoding step) adds "kv_len" after
"seq_len"; without it keys and queries are both seq_len.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import re
import threading
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from ..backends import BACKEND_NAMES
from ..cases import DTYPES, Case

__all__ = ["ENV_VAR", "ESTIMATE_NEIGHBOURS", "SCHEMA_VERSION", "CalibrationError", "Entry", "Estimate", "Table",
           "dtype_name", "dumps", "file_name", "clear_cache", "for_gpu", "load", "model_slug", "parse",
           "parse_file_name"]

SCHEMA_VERSION = 1
# The variable naming your own tables (on, off or a path; read by sageattention.dispatch).
ENV_VAR = "SAGEATTENTION_CALIBRATION"
# Top-level keys, in the order a written table lists them (after "_generated").
META_KEYS = ("schema_version", "capability", "gpu_name", "torch", "triton", "date", "command", "method")
ENTRY_SHAPE_KEYS = ("dtype", "batch", "heads", "seq_len", "head_dim", "causal")
OPTIONAL_SHAPE_KEYS = ("kv_len",)   # absent: as seq_len
logger = logging.getLogger("sageattention")


class CalibrationError(ValueError):
    """A calibration table that does not follow the schema; the message names the file and field."""


@dataclass(frozen=True)
class Entry:
    """One measured shape (seq_len queries, kv_len keys: None means seq_len) and the milliseconds
    of each backend that ran."""

    dtype: str
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool
    ms: tuple[tuple[str, float], ...]  # (backend, ms), in BACKEND_NAMES order
    kv_len: int | None = None

    @property
    def case(self) -> Case:
        return Case(self.dtype, self.batch, self.heads, self.seq_len, self.head_dim, self.causal,
                    self.kv_len)

    @property
    def name(self) -> str:
        """The benchmark's name of this case, e.g. "fp16 4x32x4096x128 non-causal"."""
        return self.case.name

    def time(self, backend: str) -> float | None:
        """Measured milliseconds of `backend` here, or None (not measured)."""
        return dict(self.ms).get(backend)


# How many measured shapes an off-grid call's estimate draws on. Chosen by leaving each of the 80
# entries of the H100 table (5b7cdab) out in turn and predicting it from the rest: the nearest entry
# alone ran the kernel at 0.90-0.91x SDPA on two of them, three neighbours weighted by inverse squared
# distance lost on none (geomean 1.037x against the nearest entry's 1.026x, and 1.047x with every
# entry in the table); four or six neighbours lost on none either but forwent more of the gains
# (benchmarks/calibration_holdout.py reruns this on any table).
ESTIMATE_NEIGHBOURS = 3


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a cheap dispatch cache key
class Table:
    """A validated calibration table."""

    label: str            # "sm90" or "sm90-nvidia-h200": how reasons name the table
    source: str           # the file it was read from (or what the caller passed)
    capability: tuple[int, int]
    gpu_name: str
    torch: str
    triton: str | None
    date: str
    command: str
    method: str
    generated: str
    entries: tuple[Entry, ...]
    estimate_from: int = ESTIMATE_NEIGHBOURS   # how many entries an estimate off the grid draws on

    def neighbours(self, *, dtype: str, head_dim: int, causal: bool, seq_q: int, seq_k: int,
                   batch_heads: int, count: int = 1) -> list[tuple[Entry, float]]:
        """Up to `count` entries closest to this shape, nearest first, each with its squared distance;
        [] when the table has no entry of this causal flag. Entries of the same dtype are preferred,
        else those of the other half dtype (fp16 and bf16 run the same kernels at the same speed;
        the entry's name says which was measured); then the same head dim, else the nearest head
        dim (ties: the smaller); among those, by the squared distance in (log2 seq_q, log2 seq_k,
        log2 batch*heads), ties going to the first entry in the table's order."""
        pool = [e for e in self.entries if e.causal == causal]
        same_dtype = [e for e in pool if e.dtype == dtype]
        pool = same_dtype or pool
        if not pool:
            return []
        dim = min({e.head_dim for e in pool}, key=lambda d: (abs(d - head_dim), d))
        point = tuple(math.log2(max(x, 1)) for x in (seq_q, seq_k, batch_heads))

        def distance(e: Entry) -> float:
            there = (math.log2(e.seq_len), math.log2(e.case.keys), math.log2(e.batch * e.heads))
            return sum((a - b) ** 2 for a, b in zip(point, there))

        ranked = sorted(((e, distance(e)) for e in pool if e.head_dim == dim), key=lambda x: x[1])
        return ranked[:count]

    def estimate(self, *, dtype: str, head_dim: int, causal: bool, seq_q: int, seq_k: int,
                 batch_heads: int) -> "Estimate | None":
        """What the table says of this shape: the nearest entry's times where it was measured at the
        shape's point (or it is the only entry, or one of the nearest did not time SDPA), else each
        backend's time relative to SDPA's, interpolated from the `estimate_from` nearest entries
        (see Estimate). None when the table has no entry of this causal flag."""
        found = self.neighbours(dtype=dtype, head_dim=head_dim, causal=causal, seq_q=seq_q,
                                seq_k=seq_k, batch_heads=batch_heads, count=self.estimate_from)
        if not found:
            return None
        nearest, d0 = found[0]   # d0 == 0: measured at this point (maybe in the other dtype or head dim)
        if d0 == 0 or len(found) == 1 or any(e.time("sdpa") is None for e, _ in found):
            return Estimate.measured(nearest)
        return Estimate.interpolated(found)


@dataclass(frozen=True)
class Estimate:
    """Backends' times for one shape as the dispatcher ranks them: measured milliseconds where an
    entry matches the shape, else each backend's time as a multiple of SDPA's (so SDPA is 1.0),
    interpolated from nearby entries as a weighted geometric mean of their time ratios, weights the
    inverse squared distance (log2 space, as neighbours' distance). An entry that did not measure a
    backend adds nothing to its estimate; one no entry measured is None."""

    name: str       # the entry's name, or which entries the estimate draws on
    basis: str      # how reasons introduce the figures
    verb: str       # "measured" or "estimated"
    unit: str       # " ms", or "" for multiples of SDPA's time
    times: tuple[tuple[str, float], ...]
    head_dims: tuple[int, ...] = ()   # of the entries drawn on

    @classmethod
    def measured(cls, entry: Entry) -> "Estimate":
        return cls(entry.name, f"nearest measured: {entry.name}", "measured", " ms", entry.ms,
                   (entry.head_dim,))

    def at_head_dim(self, head_dim: int, widths: dict[str, int]) -> "Estimate":
        """This estimate for a call of ``head_dim`` that its entries did not measure, where each
        quantized backend runs a kernel of ``widths[backend]`` (zero-padded) and SDPA the call as it
        is: their work grows with the width, so each backend's time relative to SDPA's is taken
        times ``widths[backend] / head_dim`` (SDPA's own factor 1). Unchanged where the entries
        measured this head dim (their kernels ran padded already)."""
        if head_dim in self.head_dims or not any(w != head_dim for w in widths.values()):
            return self
        times = tuple((name, t * widths.get(name, head_dim) / head_dim) for name, t in self.times)
        basis = (f"{self.basis}; for head dim {head_dim}, each quantized backend's time times its kernel's "
                 f"width over {head_dim}")
        return replace(self, basis=basis, times=times)

    @classmethod
    def interpolated(cls, found: list[tuple[Entry, float]]) -> "Estimate":
        times = []
        for backend in BACKEND_NAMES:
            # log(a) - log(b), not log(a / b): the quotient of two valid (positive, finite) times can
            # round to 0 or inf, and a logarithm of 0 raised out of the sageattn call
            pairs = [(1.0 / d, math.log(e.time(backend)) - math.log(e.time("sdpa"))) for e, d in found
                     if e.time(backend) is not None]
            if pairs:
                times.append((backend, _exp(sum(w * x for w, x in pairs) / sum(w for w, _ in pairs))))
        name = f"the {len(found)} nearest measured shapes ({', '.join(e.name for e, _ in found)})"
        return cls(name, f"estimated from {name}, times as a multiple of SDPA's", "estimated", "",
                   tuple(times), tuple(sorted({e.head_dim for e, _ in found})))

    def time(self, backend: str) -> float | None:
        return dict(self.times).get(backend)

    def figure(self, backend: str) -> str:
        return f"{backend} {self.time(backend):.3g}{self.unit}"


def _exp(x: float) -> float:
    """math.exp, but inf past float's range instead of OverflowError (a ratio of times that far
    apart only has to lose)."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


# --- validation -------------------------------------------------------------------------------

def _fail(source: str, where: str, problem: str) -> CalibrationError:
    return CalibrationError(f"calibration table {source}: {where}: {problem}")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _positive_ms(value) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        value = float(value)
    except OverflowError:  # an integer past float's range: not a finite time
        return False
    return math.isfinite(value) and value > 0


def _entry(raw, i: int, source: str) -> Entry:
    where = f"entries[{i}]"
    if not isinstance(raw, dict):
        raise _fail(source, where, f"must be an object, got {type(raw).__name__}")
    missing = [k for k in (*ENTRY_SHAPE_KEYS, "ms") if k not in raw]
    if missing:
        raise _fail(source, where, f"missing key(s) {', '.join(missing)}")
    unknown = sorted(set(raw) - {*ENTRY_SHAPE_KEYS, *OPTIONAL_SHAPE_KEYS, "ms"})
    if unknown:
        raise _fail(source, where, f"unknown key(s) {', '.join(unknown)}")
    if not isinstance(raw["dtype"], str) or raw["dtype"] not in DTYPES:
        raise _fail(source, f"{where}.dtype", f"{raw['dtype']!r} is not one of {', '.join(DTYPES)}")
    for key in ("batch", "heads", "seq_len", "head_dim", *OPTIONAL_SHAPE_KEYS):
        if key in raw and not _positive_int(raw[key]):
            raise _fail(source, f"{where}.{key}", f"must be a positive integer, got {raw[key]!r}")
    if not isinstance(raw["causal"], bool):
        raise _fail(source, f"{where}.causal", f"must be true or false, got {raw['causal']!r}")
    ms = raw["ms"]
    if not isinstance(ms, dict) or not ms:
        raise _fail(source, f"{where}.ms", "must be a non-empty object {backend: milliseconds}")
    for name, value in ms.items():
        if name not in BACKEND_NAMES:
            raise _fail(source, f"{where}.ms[{name!r}]",
                        f"unknown backend; the backends are: {', '.join(BACKEND_NAMES)}")
        if not _positive_ms(value):
            raise _fail(source, f"{where}.ms[{name!r}]",
                        f"must be a positive finite number of milliseconds, got {value!r}")
    return Entry(raw["dtype"], raw["batch"], raw["heads"], raw["seq_len"], raw["head_dim"], raw["causal"],
                 tuple((n, float(ms[n])) for n in BACKEND_NAMES if n in ms),
                 kv_len=None if raw.get("kv_len") in (None, raw["seq_len"]) else raw["kv_len"])


def parse(data, *, source: str, label: str | None = None) -> Table:
    """Validate a table (parsed JSON) and return it; CalibrationError names `source` and the field.

    label: how dispatch reasons name the table (default: the capability, e.g. "sm90")."""
    if not isinstance(data, dict):
        raise _fail(source, "top level", f"must be an object, got {type(data).__name__}")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise _fail(source, "schema_version",
                    f"{data.get('schema_version')!r} is not supported; this sageattention reads version "
                    f"{SCHEMA_VERSION} (regenerate the table with `python -m sageattention.calibrate`)")
    missing = [k for k in ("_generated", *META_KEYS, "entries") if k not in data]
    if missing:
        raise _fail(source, "top level", f"missing key(s) {', '.join(missing)}")
    unknown = sorted(set(data) - {"_generated", *META_KEYS, "entries"})
    if unknown:
        raise _fail(source, "top level", f"unknown key(s) {', '.join(unknown)}")
    cap = data["capability"]
    if not (isinstance(cap, list) and len(cap) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                            and x >= 0 for x in cap)):
        raise _fail(source, "capability", f"must be [major, minor], got {cap!r}")
    for key in ("_generated", "gpu_name", "torch", "date", "command", "method"):
        if not isinstance(data[key], str) or not data[key].strip():
            raise _fail(source, key, f"must be a non-empty string, got {data[key]!r}")
    if data["triton"] is not None and not isinstance(data["triton"], str):
        raise _fail(source, "triton", f"must be a version string or null, got {data['triton']!r}")
    if not isinstance(data["entries"], list) or not data["entries"]:
        raise _fail(source, "entries", "must be a non-empty list")
    entries = tuple(_entry(raw, i, source) for i, raw in enumerate(data["entries"]))
    shapes = [e.name for e in entries]
    twice = sorted({s for s in shapes if shapes.count(s) > 1})
    if twice:
        raise _fail(source, "entries", f"shape(s) listed more than once: {'; '.join(twice)}")
    capability = (cap[0], cap[1])
    return Table(label=label or f"sm{cap[0]}{cap[1]}", source=source, capability=capability,
                 gpu_name=data["gpu_name"], torch=data["torch"], triton=data["triton"], date=data["date"],
                 command=data["command"], method=data["method"], generated=data["_generated"],
                 entries=entries)


def load(path, *, label: str | None = None) -> Table:
    """Read and validate a table file (a path or an importlib.resources Traversable); CalibrationError
    (naming the file) when it is unusable."""
    try:
        text = path.read_text(encoding="utf-8") if hasattr(path, "read_text") else \
            Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CalibrationError(f"calibration table {path}: cannot be read ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise CalibrationError(f"calibration table {path}: not UTF-8 text, so not a JSON table "
                               f"({exc})") from exc
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise CalibrationError(f"calibration table {path}: {exc}") from exc
    except ValueError as exc:
        raise CalibrationError(f"calibration table {path}: not valid JSON ({exc})") from exc
    except RecursionError as exc:  # arrays or objects nested deeper than the parser goes
        raise CalibrationError(f"calibration table {path}: not a JSON table (nested too deeply to "
                               f"parse: {exc})") from exc
    return parse(data, source=str(path), label=label)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    """A JSON object as a dict, refusing a key given twice: json keeps the last silently, so a second
    "entries" list (two tables pasted together) or "sdpa" time would drop the first unseen."""
    data = {}
    for key, value in pairs:
        if key in data:
            raise _DuplicateKey(f"the key {key!r} appears twice in one object (values {data[key]!r:.60} "
                                f"and {value!r:.60}); keep one")
        data[key] = value
    return data


# --- the dispatcher's view: one table per GPU model or capability, never an exception ---------------

_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype) -> str | None:
    """The table's name of a torch dtype ("fp16", "bf16"), or None for one the table never holds."""
    return _DTYPE_NAMES.get(dtype)


def model_slug(gpu_name: str) -> str:
    """A GPU's name as a file name part: "NVIDIA H200" -> "nvidia-h200" (lower case, each run of
    other characters than letters and digits one "-")."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    if not slug:
        raise ValueError(f"GPU name {gpu_name!r} has no letters or digits to name a table after")
    return slug


def file_name(capability, gpu_name: str | None = None) -> str:
    """The package file holding the table for GPUs of this capability, (9, 0) -> "sm90.json", or with
    `gpu_name` the one for that GPU model alone: (9, 0), "NVIDIA H200" -> "sm90-nvidia-h200.json"."""
    base = f"sm{capability[0]}{capability[1]}"
    return f"{base}.json" if gpu_name is None else f"{base}-{model_slug(gpu_name)}.json"


_FILE_NAME = re.compile(r"sm(\d+)(\d)(?:-([a-z0-9]+(?:-[a-z0-9]+)*))?\.json")


def parse_file_name(name: str) -> tuple[tuple[int, int], str | None] | None:
    """file_name's inverse: "sm90.json" -> ((9, 0), None), "sm90-nvidia-h200.json" -> ((9, 0),
    "nvidia-h200"), None for a name of neither form."""
    match = _FILE_NAME.fullmatch(name)
    return ((int(match[1]), int(match[2])), match[3]) if match else None


def tables_folder():
    """Where the packaged tables are (this package's folder; tests point it elsewhere)."""
    return resources.files(__name__)


@functools.lru_cache(maxsize=None)  # one Table object per file: tables are compared by identity
def _read(resource, capability: tuple[int, int], *, label: str | None = None,
          named: bool = True) -> Table | CalibrationError:
    """The table in ``resource``, or the CalibrationError saying why it cannot serve GPUs of
    ``capability`` (broken; for another capability; a file named after a GPU model whose table is
    another model's). ``named``: the file's name must match its contents (a package or folder
    table); a file given by path serves the GPUs of its own capability whatever its name."""
    try:
        table = load(resource, label=label)
        if not named:
            if table.capability != tuple(capability):
                major, minor = table.capability
                raise CalibrationError(
                    f"calibration table {resource}: capability: it is the table of sm{major}{minor} GPUs "
                    f"(capability {list(table.capability)}), not of this one (sm{capability[0]}{capability[1]})")
            return table
        capability_named, slug = parse_file_name(resource.name)
        if table.capability != capability_named:
            raise CalibrationError(f"calibration table {resource}: capability: {list(table.capability)} "
                                   f"does not match the file name {resource.name}")
        if slug is not None and _slug_or_none(table.gpu_name) != slug:
            raise CalibrationError(f"calibration table {resource}: gpu_name: {table.gpu_name!r} does not "
                                   f"match the file name {resource.name}")
        return table
    except CalibrationError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 -- a table must never break a sageattn call
        return CalibrationError(f"calibration table {resource}: unusable ({type(exc).__name__}: {exc})")


def _slug_or_none(gpu_name: str | None) -> str | None:
    try:
        return None if gpu_name is None else model_slug(gpu_name)
    except ValueError:  # a name without letters or digits names no model
        return None


@functools.lru_cache(maxsize=None)  # one object per (table, label), as _read's
def _relabelled(table: Table, label: str) -> Table:
    return dataclasses.replace(table, label=label)


def _seen_on(table: Table, gpu_name: str | None) -> Table:
    """``table``, its label saying which GPU model measured it when that is not the running one
    (``gpu_name``; None: not known), so reasons say an H200 runs by an H100's timings."""
    here = _slug_or_none(gpu_name)
    if here is None or _slug_or_none(table.gpu_name) == here:
        return table
    return _relabelled(table, f"{table.label} (measured on {table.gpu_name})")


def _from_user_path(path: Path, capability: tuple[int, int], names: list[str]) -> tuple[Table | None, list[str]]:
    """(the table under ``path`` for this GPU or None, why each file tried before it or instead of
    it did not serve: one line per file)."""
    problems = []
    if path.is_dir():
        for name in names:
            candidate = path / name
            if not candidate.exists():
                continue
            if not candidate.is_file():
                problems.append(f"{candidate} is not a file")
                continue
            found = _read(candidate, capability, label=f"{name[:-5]} from {candidate}")
            if isinstance(found, Table):
                return found, problems   # a broken model table before it is still said
            problems.append(str(found))
        if not problems:
            problems.append(f"the folder {path} holds no {' or '.join(names)}")
    elif path.is_file():
        found = _read(path, capability, label=f"{names[-1][:-5]} from {path}", named=False)
        if isinstance(found, Table):
            return found, []
        problems.append(str(found))
    elif path.exists():
        problems.append(f"{path} is neither a table file nor a folder of tables")
    else:
        problems.append(f"{path} no longer exists")
    return None, problems


_found: dict = {}               # for_gpu's answers, by its arguments
_found_lock = threading.Lock()  # one thread reads (and warns of) a table; the others wait for it


def for_gpu(capability: tuple[int, int], gpu_name: str | None = None,
            user_path: str | None = None) -> Table | None:
    """The table for a GPU of exactly this capability named ``gpu_name`` (torch's device name), or
    None (not calibrated, or broken). A table measured on that GPU model
    (``file_name(capability, gpu_name)``) wins over the capability's (``file_name(capability)``).
    Where the table was measured on another GPU model than ``gpu_name``, its label says which.

    ``user_path`` (SAGEATTENTION_CALIBRATION=PATH): a table file, used for the GPUs of its own
    capability, or a folder holding tables named as the package's; it wins over the packaged
    tables, which serve when the path has none for this GPU (logged once as a warning saying why
    and what serves instead). Cached, and thread-safe: each file is read once per process, and
    a changed file is not read again until clear_cache()."""
    key = (tuple(capability), gpu_name, user_path)
    try:
        return _found[key]
    except KeyError:
        pass
    with _found_lock:
        if key not in _found:
            _found[key] = _find(*key)
        return _found[key]


def _find(capability: tuple[int, int], gpu_name: str | None, user_path: str | None) -> Table | None:
    names = [file_name(capability)]
    if gpu_name is not None and _slug_or_none(gpu_name) is not None:
        names.insert(0, file_name(capability, gpu_name))
    problems = []
    if user_path is not None:
        try:
            table, problems = _from_user_path(Path(user_path), capability, names)
        except OSError as exc:  # a folder you may not list, say
            table, problems = None, [f"{user_path} cannot be read ({exc})"]
        if table is not None:
            table = _seen_on(table, gpu_name)
            if problems:   # your model table is broken, say, and your capability's serves
                logger.warning("sageattention: ignoring what %s=%s holds for this GPU (%s): %s; using %s "
                               "instead", ENV_VAR, user_path, _gpu_words(capability, gpu_name),
                               "; ".join(problems), table.label)
            return table
    table = None
    for name in names:
        resource = tables_folder().joinpath(name)
        if resource.is_file():
            found = _read(resource, capability, label=name[:-5])
            if isinstance(found, Table):
                table = _seen_on(found, gpu_name)
                break
            logger.warning("sageattention: ignoring calibration table %s (%s); backends are chosen by the "
                           "next table or the static preference order", resource, found)
    if problems:
        instead = f"the packaged table {table.label}" if table is not None else "the static preference order"
        logger.warning("sageattention: %s=%s gives no calibration table for this GPU (%s): %s; using %s "
                       "instead", ENV_VAR, user_path, _gpu_words(capability, gpu_name), "; ".join(problems),
                       instead)
    return table


def _gpu_words(capability: tuple[int, int], gpu_name: str | None) -> str:
    return f"sm{capability[0]}{capability[1]}" + (f", {gpu_name}" if gpu_name else "")


def clear_cache() -> None:
    """Forget the tables read so far (for_gpu reads each file once per process): the next call
    reads them again, e.g. after you rewrote your table."""
    with _found_lock:
        _found.clear()
        _read.cache_clear()
        _relabelled.cache_clear()


# --- writing ------------------------------------------------------------------------------------

def _entry_sort_key(e: dict) -> tuple:
    return (e["dtype"], e["head_dim"], e["causal"], e["seq_len"], e.get("kv_len") or e["seq_len"],
            e["batch"], e["heads"])


def _shape_fields(e: dict) -> dict:
    """The entry's shape keys in the written order; kv_len (after seq_len) only where it differs."""
    fields = {}
    for key in ENTRY_SHAPE_KEYS:
        fields[key] = e[key]
        if key == "seq_len" and e.get("kv_len") not in (None, e["seq_len"]):
            fields["kv_len"] = e["kv_len"]
    return fields


def dumps(data: dict, *, source: str = "<table being written>") -> str:
    """The table as written to disk: validated first (a CalibrationError names `source`), entries
    sorted by (dtype, head_dim, causal, seq_len, kv_len, batch, heads), ms keys sorted, one entry
    per line; the same table gives the same text."""
    parse(data, source=source)
    entries = sorted(data["entries"], key=_entry_sort_key)
    head = {"_generated": data["_generated"], **{k: data[k] for k in META_KEYS}}
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rows = [json.dumps({**_shape_fields(e), "ms": dict(sorted(e["ms"].items()))})
            for e in entries]
    body = ",\n".join(f"    {r}" for r in rows)
    return "{\n" + "\n".join(lines) + '\n  "entries": [\n' + body + "\n  ]\n}\n"
