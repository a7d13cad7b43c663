"""Backend selection: which backend a call runs, and why. Also the force and explain API.

`choose()` is a pure function of the call's needs (`Request`), what the installed build contains
(`Inventory`), the GPU's compute capability and, for the default `sageattn` path, the calibration
table of that GPU (`sageattention/calibration/`); it walks the capability table in `backends.py`.
The tensor-level helpers (`select_backend`, `explain`) only gather those inputs.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
import threading
from dataclasses import dataclass, field

import torch

from . import backends, calibration
from .backends import SDPA, Backend
from .inputs import SAGEATTN_KEYWORDS, AttnCall, parse_call, split_kwargs

__all__ = ["BackendChoice", "BackendUnavailableError", "Inventory", "Request", "calibration_enabled",
           "calibration_for", "choose", "environment_problems", "explain", "force_backend", "forced_backend", "last_backend",
           "select_backend", "use_calibration"]

ENV_VAR = "SAGEATTENTION_BACKEND"
CALIBRATION_ENV_VAR = calibration.ENV_VAR
CALIBRATION_VALUES = ("on", "off")  # the first is the default
# Words people write for on and off elsewhere: refused (a file of that name aside), with a hint.
_CALIBRATION_SYNONYMS = {**dict.fromkeys(("1", "true", "yes", "y", "enable", "enabled"), "on"),
                         **dict.fromkeys(("0", "false", "no", "n", "disable", "disabled", "none"), "off")}
# Every reason for choosing SDPA because it was measured faster opens with this; such a choice is a
# speed decision, not a fallback the user should act on, so log_once logs it at INFO, not WARNING.
SDPA_FASTER = "SDPA is faster for this shape"
# A quantized backend replaces SDPA only where the calibration measured it at least this much
# faster: SDPA's own time at one shape moves by several percent from one process to the next on the
# H200 (568-614 TOPS at fp16 4x32x4096x128 over one day's calls, benchmarks/results/), so a smaller
# measured gain can be a loss when the user runs it, and sageattn must not be slower than SDPA.
CALIBRATION_MIN_SPEEDUP = 1.05
logger = logging.getLogger("sageattention")


class BackendUnavailableError(RuntimeError):
    """The backend that was asked for (forced, or named by a kernel-specific function) cannot run."""


@dataclass(frozen=True)
class Inventory:
    """What the installed build can run: native family -> None (usable) or the reason it is not;
    Triton: (usable, reason). Hashable, so choices can be cached per (request, inventory)."""

    native: tuple  # ((family, None | reason), ...); a dict is accepted and frozen
    triton: tuple[bool, str]

    def __post_init__(self):
        if isinstance(self.native, dict):
            object.__setattr__(self, "native", tuple(sorted(self.native.items())))

    def __hash__(self) -> int:  # computed once: an Inventory is part of every cached choice's key
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.native, self.triton))
            object.__setattr__(self, "_hash", cached)
        return cached

    def family_problem(self, family: str) -> str | None:
        return dict(self.native).get(family, "not in this build")

    def contents(self) -> str:
        usable = [f for f, why in self.native if why is None]
        text = "native families " + (", ".join(usable) if usable else "none")
        return text + ("; Triton kernels" if self.triton[0] else f"; no Triton ({self.triton[1]})")


@dataclass(frozen=True)
class Request:
    """What one call needs from a backend, without the tensors. The shape fields (None: unknown)
    only serve the calibration lookup."""

    device_type: str
    capability: tuple[int, int] | None
    dtype: torch.dtype
    head_dim: int
    has_mask: bool = False
    requires_grad: bool = False
    dropout: bool = False
    qk_quant_gran: str | None = None
    pv_accum_dtype: str | None = None
    smooth_v: bool = False
    batch_heads: int | None = None  # batch * query heads
    batch: int | None = None
    q_heads: int | None = None
    seq_q: int | None = None
    seq_k: int | None = None
    causal: bool = False
    return_lse: bool = False
    scale_magnitude: float = 0.0  # |sm_scale|, only compared with backends.MAX_QUANTIZED_SCALE


@dataclass(frozen=True)
class BackendChoice:
    """The backend a call runs (`name`), why (`reason`), and the resolved kernel options (None for SDPA).

    fallback: True exactly when the call runs PyTorch SDPA, whatever the cause: the input needs it,
    no quantized backend fits, SDPA is forced, or the calibration measured SDPA faster for this
    shape. calibrated: the choice was made from the calibration table's measurements (then the
    reason names the table and the figures)."""

    name: str
    reason: str
    fallback: bool
    qk_quant_gran: str | None = None
    pv_accum_dtype: str | None = None
    adjustments: tuple[str, ...] = field(default_factory=tuple)
    calibrated: bool = False

    def sentence(self) -> str:
        if self.fallback and (self.calibrated or self.reason.startswith(SDPA_FASTER)):
            return f"runs PyTorch SDPA: {self.reason}"
        if self.fallback:
            return f"falls back to PyTorch SDPA because {self.reason}"
        options = ""
        if self.qk_quant_gran or self.pv_accum_dtype:
            options = f" (qk_quant_gran={self.qk_quant_gran!r}, pv_accum_dtype={self.pv_accum_dtype!r})"
        text = f"runs backend {self.name!r}{options}: {self.reason}"
        if self.adjustments:
            text += "; adjusted: " + "; ".join(self.adjustments)
        return text

    __str__ = sentence


# --- what the machine has -------------------------------------------------------------------

@functools.cache
def _native_state() -> dict:
    families = backends.load_families()
    try:
        from sageattention import native
        state = dict(native.available_families())
    except Exception as exc:  # no compiled kernels (source checkout, CPU-only build, broken wheel)
        return {f: f"sageattention.native is unusable ({type(exc).__name__}: {exc})" for f in families}
    return {f: state.get(f, "not in this build") for f in families}


@functools.lru_cache(maxsize=None)
def _triton_state(device_index: int | None) -> tuple[bool, str]:
    try:
        from sageattention import triton as triton_backend
        return triton_backend.is_available(device_index)
    except Exception as exc:
        return False, f"sageattention.triton is unusable ({type(exc).__name__}: {exc})"


def current_inventory(device: torch.device | None = None) -> Inventory:
    """The installed build's backends, probed once per process (and per device for Triton)."""
    index = device.index if device is not None and device.type == "cuda" else None
    if device is not None and device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return _inventory(index)


@functools.lru_cache(maxsize=None)
def _inventory(device_index: int | None) -> Inventory:
    return Inventory(native=_native_state(), triton=_triton_state(device_index))


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device_index))


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    return _capability(_cuda_index(device))


@functools.lru_cache(maxsize=None)
def _device_name(device_index: int) -> str:
    return torch.cuda.get_device_name(device_index)


def device_name(device: torch.device) -> str | None:
    """torch's name of a CUDA device ("NVIDIA H200"), which picks a GPU model's calibration table;
    None off CUDA."""
    if device.type != "cuda":
        return None
    return _device_name(_cuda_index(device))


# --- forcing --------------------------------------------------------------------------------

_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar("sageattention_forced", default=None)


def _check_name(name, source: str) -> str:
    if name not in backends.BACKEND_NAMES:
        raise ValueError(f"{source}={name!r} is not a backend; use one of: {', '.join(backends.BACKEND_NAMES)}")
    return name


@contextlib.contextmanager
def force_backend(name: str):
    """Run every sageattention call in this context on backend `name`, or raise
    BackendUnavailableError where it cannot run. No silent fallback."""
    token = _forced.set(_check_name(name, "force_backend(name)"))
    mark = [name]   # this entry's own slot: found by identity, whichever thread leaves first
    _plain_enter(mark)
    try:
        yield
    finally:
        _forced.reset(token)
        _plain_leave(mark)


def forced_backend(env=None) -> str | None:
    """The forced backend: force_backend() first, then the SAGEATTENTION_BACKEND variable."""
    name = _forced.get()
    if name is not None:
        return name
    global _env_plain
    value = (os.environ if env is None else env).get(ENV_VAR, "").strip()
    value = _check_name(value, ENV_VAR) if value else None
    if env is None:
        _env_plain = value
    return value


# force_backend()'s name and the variable's, as plain module globals for code that dynamo traces
# (traced.grad_sdpa): torch 2.11's dynamo cannot trace ContextVar.get, and it guards on a global's
# value, so a graph is traced again when they change. Process-wide, not per thread or task: the
# innermost force_backend() entered last; the variable as the last eager call (or the import) read it.
_forced_plain: str | None = None
# The force_backend() contexts open now, in the order they were entered (each a one-name list, so
# that a context finds its own by identity): a context left before one entered after it (two
# threads, interleaved) must not restore a name that the later one replaced, nor outlive both.
_plain_open: list[list[str]] = []
_plain_lock = threading.Lock()


def _plain_enter(mark: list[str]) -> None:
    global _forced_plain
    with _plain_lock:
        _plain_open.append(mark)
        _forced_plain = mark[0]


def _plain_leave(mark: list[str]) -> None:
    global _forced_plain
    with _plain_lock:
        for i in range(len(_plain_open) - 1, -1, -1):
            if _plain_open[i] is mark:
                del _plain_open[i]
                break
        _forced_plain = _plain_open[-1][0] if _plain_open else None


_env_plain: str | None = os.environ.get(ENV_VAR, "").strip() or None


def forced_backend_plain() -> str | None:
    """forced_backend() from the plain globals above (see there)."""
    return _forced_plain if _forced_plain is not None else _env_plain


def environment_problems(env=None) -> list[str]:
    """What is wrong with SAGEATTENTION_BACKEND and SAGEATTENTION_CALIBRATION as set: each makes
    every sageattn call raise, so a command that makes many (the benchmark, calibrate) says so
    before it starts, and `python -m sageattention` in its verdict."""
    env = os.environ if env is None else env
    problems = []
    value = env.get(ENV_VAR, "").strip()
    if value:
        try:
            _check_name(value, ENV_VAR)
        except ValueError as exc:
            problems.append(str(exc))
    try:
        _calibration_setting(env)
    except ValueError as exc:
        problems.append(str(exc))
    return problems


def refuse_quantized_forced(forced: str | None, why: str, remedy: str = "run it unforced") -> None:
    """For a call that can only run torch's SDPA (`why` says what it is): BackendUnavailableError
    when a quantized backend is forced, which never falls back silently; forcing SDPA runs it."""
    if forced is not None and forced != SDPA:
        raise BackendUnavailableError(f"backend {forced!r} is forced but cannot run this call: {why}; "
                                      f"force 'sdpa' or {remedy}")


# --- calibration on/off ----------------------------------------------------------------------

_calibration_switch: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "sageattention_calibration", default=None)


@contextlib.contextmanager
def use_calibration(enabled: bool):
    """Within the context, `sageattn` consults the GPU's calibration table (True) or walks the static
    preference order (False), whatever SAGEATTENTION_CALIBRATION says."""
    if not isinstance(enabled, bool):
        raise TypeError(f"use_calibration(enabled) takes True or False, got {enabled!r}")
    token = _calibration_switch.set(enabled)
    try:
        yield
    finally:
        _calibration_switch.reset(token)


def _calibration_setting(env=None) -> tuple[bool, str | None]:
    """(enabled, user table path or None) from SAGEATTENTION_CALIBRATION: on (default), off, or the
    path of a table file or of a folder of tables named as the package's, sm<major><minor>.json or
    sm<major><minor>-<model>.json (your own measurements); on and off in any case, a leading ~ as
    the home folder. What the path holds is checked when a GPU's table is looked up
    (calibration.for_gpu: logged once where it gives none)."""
    raw = (os.environ if env is None else env).get(CALIBRATION_ENV_VAR, "")
    value = raw.strip()
    if value.lower() in CALIBRATION_VALUES or not value:
        return (value.lower() or CALIBRATION_VALUES[0]) == "on", None
    path = os.path.expanduser(value)
    if os.path.exists(path):
        return True, os.path.abspath(path)
    meant = _CALIBRATION_SYNONYMS.get(value.lower())
    why = f"for {meant}, write {meant}" if meant else "that path does not exist"
    raise ValueError(f"{CALIBRATION_ENV_VAR}={raw!r} is not accepted; use one of: "
                     f"{', '.join(CALIBRATION_VALUES)} (default {CALIBRATION_VALUES[0]}), or the path "
                     f"of a calibration table or of a folder of them ({why})")


def _calibration_state(env=None) -> tuple[bool, str | None]:
    """(enabled, user table path): use_calibration() decides on/off first, then the variable; a bad
    variable fails even when the switch decides."""
    enabled, user_path = _calibration_setting(env)
    switch = _calibration_switch.get()
    return (enabled if switch is None else switch), user_path


def calibration_enabled(env=None) -> bool:
    """Whether the default dispatch consults calibration tables: use_calibration() first, then the
    SAGEATTENTION_CALIBRATION variable (on/off/a path, default on)."""
    return _calibration_state(env)[0]


def calibration_for(capability: tuple[int, int] | None, env=None, *,
                    gpu_name: str | None = None) -> calibration.Table | None:
    """The calibration table the default dispatch uses on a GPU of this capability and name
    (`device_name`; None: the capability's table only): the one under SAGEATTENTION_CALIBRATION=PATH
    if it has one for this GPU, else the packaged one, a table of that GPU model before the
    capability's; None on CPU, when disabled, or when there is no (usable) table for exactly this
    capability."""
    enabled, user_path = _calibration_state(env)  # one read of the variable per call
    if not enabled or capability is None:
        return None
    return calibration.for_gpu(tuple(capability), gpu_name, user_path)


# --- last backend (thread-local) ------------------------------------------------------------

_last = threading.local()


def record_backend(name: str | None) -> None:
    _last.name = name


def last_backend() -> str | None:
    """Name of the backend the last sageattention call in this thread actually ran (None: none yet,
    or the call had nothing to compute)."""
    return getattr(_last, "name", None)


# --- the rule -------------------------------------------------------------------------------

def _input_reason(req: Request, candidates: tuple[Backend, ...]) -> str | None:
    """Why the input itself needs SDPA whatever is installed, or None."""
    if req.device_type != "cuda":
        return f"the inputs are on {req.device_type}; the quantized kernels need a CUDA GPU"
    if req.dtype not in (torch.float16, torch.bfloat16):
        return f"the inputs are {req.dtype}; the quantized kernels take float16 and bfloat16"
    if req.requires_grad:
        return "the inputs require grad; the quantized kernels are forward-only"
    if req.dropout:
        return "dropout_p > 0; the quantized kernels have no dropout"
    if req.scale_magnitude > backends.MAX_QUANTIZED_SCALE:
        return _scale_reason(req)
    if req.has_mask and not any(b.takes_mask for b in candidates):
        return "an attention mask was given; the native kernels take no mask"
    dims = [b.head_dims for b in candidates if b.head_dims is not None]
    if dims and not any(req.head_dim in d for d in dims):
        return f"head dim {req.head_dim} is not covered by the kernels ({_dims(dims)})"
    limits = [b.max_batch_and_heads for b in candidates]
    if limits and all(_past_grid_limit(req, limit) for limit in limits):
        return _past_grid_limit(req, max(limits)) + " of the quantized kernels"
    return None


def _scale_reason(req: Request) -> str:
    return (f"|sm_scale| {req.scale_magnitude:g} is above {backends.MAX_QUANTIZED_SCALE:g}, the largest the "
            "quantized kernels are checked with")


def _too_short_to_quantize(req: Request) -> str | None:
    """Why a call is too short on one side for the quantized path to pay, or None (see
    backends.MIN_QUANTIZED_TOKENS)."""
    least = backends.MIN_QUANTIZED_TOKENS
    for one, many, count in (("query", "queries", req.seq_q), ("key", "keys", req.seq_k)):
        if count is not None and count < least:
            return (f"{count} {one if count == 1 else many} per sequence, fewer than {least}: a "
                    "call this short is bound by memory, and quantizing it costs more than the INT8 "
                    "product saves (force a backend to run one anyway)")
    return None


def _past_grid_limit(req: Request, limit: int | None) -> str | None:
    """Why this call's batch or query heads do not fit a kernel's launch grid, or None."""
    if limit is None:
        return None
    for what, count in (("batch", req.batch), ("query heads", req.q_heads)):
        if count is not None and count > limit:
            return f"{what} {count} exceeds the launch grid limit of {limit}"
    return None


def _past_token_limit(req: Request, limit: int | None) -> str | None:
    """Why this call's sequences are longer than a kernel indexes, or None."""
    if limit is None:
        return None
    for what, count in (("query", req.seq_q), ("key", req.seq_k)):
        if count is not None and count > limit:
            return f"{count} {what} tokens in one sequence exceed its limit of {limit}"
    return None


def _dims(dims) -> str:
    sizes, spans = set(), set()
    for d in dims:
        if isinstance(d, range):
            spans.add(f"{d.start}..{d.stop - 1}")
        else:
            sizes.update(d)
    return ", ".join([str(x) for x in sorted(sizes)] + sorted(spans))


def _misfits(b: Backend, req: Request, inv: Inventory) -> tuple[list[str], list[str]]:
    """(hard reasons b cannot run this call, option mismatches that a substitution would fix)."""
    hard, options = [], []
    if b.kind == "sdpa":
        return hard, options
    if req.device_type != "cuda":
        hard.append(f"needs a CUDA tensor, got {req.device_type}")
    elif not b.serves(req.capability):
        served = ", ".join(f"sm{a}{c}" for a, c in sorted(b.capabilities)) or \
            f"sm{b.min_capability[0]}{b.min_capability[1]}+"
        hard.append(f"compute capability {req.capability[0]}.{req.capability[1]} is not served ({served})")
    if b.kind == "native" and inv.family_problem(b.family) is not None:
        hard.append(f"family {b.family} unavailable: {inv.family_problem(b.family)}")
    if b.kind == "triton" and not inv.triton[0]:
        hard.append(f"Triton unavailable: {inv.triton[1]}")
    if req.dtype not in b.dtypes:
        hard.append(f"dtype {req.dtype} not supported")
    if b.head_dims is not None and req.head_dim not in b.head_dims:
        hard.append(f"head dim {req.head_dim} not covered ({_dims([b.head_dims])})")
    if too_big := _past_grid_limit(req, b.max_batch_and_heads):
        hard.append(too_big)
    if too_long := _past_token_limit(req, b.max_tokens):
        hard.append(too_long)
    if req.has_mask and not b.takes_mask:
        hard.append("takes no attention mask")
    if req.requires_grad and not b.takes_grad:
        hard.append("forward only (inputs require grad)")
    if req.dropout and not b.takes_dropout:
        hard.append("no dropout")
    if req.scale_magnitude > backends.MAX_QUANTIZED_SCALE:
        hard.append(_scale_reason(req))
    if req.qk_quant_gran is not None and req.qk_quant_gran not in b.qk_quant_grans:
        options.append(f"qk_quant_gran={req.qk_quant_gran!r} is not provided by {b.name} "
                       f"(it has {', '.join(b.qk_quant_grans)}); using {b.qk_quant_grans[0]!r}")
    if req.pv_accum_dtype is not None and req.pv_accum_dtype not in b.pv_accum_dtypes:
        options.append(f"pv_accum_dtype={req.pv_accum_dtype!r} is not provided by {b.name} "
                       f"(it has {', '.join(b.pv_accum_dtypes)}); using {b.default_pv_accum_dtype!r}")
    if req.smooth_v and not b.takes_smooth_v:
        options.append(f"smooth_v=True is not provided by {b.name}; V is not smoothed")
    return hard, options


def _native_choice(b: Backend, req: Request, reason: str, adjustments=(), *,
                   calibrated: bool = False) -> BackendChoice:
    gran = req.qk_quant_gran if req.qk_quant_gran in b.qk_quant_grans else b.qk_quant_grans[0]
    accum = req.pv_accum_dtype if req.pv_accum_dtype in b.pv_accum_dtypes else b.default_pv_accum_dtype
    return BackendChoice(b.name, reason, False, gran, accum, tuple(adjustments), calibrated)


def _default_path(candidates, allow_fallback: bool, forced) -> bool:
    """Plain `sageattn`: every backend allowed, SDPA allowed, nothing forced."""
    return candidates is None and allow_fallback and forced is None


def choose(req: Request, inv: Inventory, *, candidates: tuple[str, ...] | None = None,
           allow_fallback: bool = True, forced: str | None = None,
           calibration: calibration.Table | None = None) -> BackendChoice:
    """Pick the backend for one call (see _choose); choices are cached, the rule is pure.

    calibration: the GPU's calibration table (`calibration_for(req.capability, gpu_name=...)`; None: the static
    order). Only the default `sageattn` path consults it; forcing and the kernel-specific functions
    (candidates given, no fallback) ignore it.
    """
    if not _default_path(candidates, allow_fallback, forced):
        calibration = None
    return _choose(req, inv, candidates, allow_fallback, forced, calibration)


@functools.lru_cache(maxsize=512)
def _choose(req: Request, inv: Inventory, candidates, allow_fallback: bool, forced,
            table: calibration.Table | None) -> BackendChoice:
    """Pick the backend for one call.

    candidates: the quantized backends the calling function may use (None: all; `sageattn`).
    allow_fallback: whether no fitting candidate means SDPA (`sageattn`) or an error unless the input
    itself needs SDPA (the kernel-specific functions).
    forced: a backend name that must be used, or BackendUnavailableError.
    table: the calibration table to rank the usable backends and SDPA by (None: the static order).
    The table is part of the cache key (by identity), so switching calibration off or injecting
    another table never returns a stale choice.
    """
    order = [n for n in backends.preference_order(req.capability) if n != SDPA]
    if candidates is not None:
        order = [n for n in order if n in candidates]
    rows = tuple(backends.backend(n) for n in order)
    if forced is not None:
        return _forced_choice(forced, req, inv, candidates)

    # A function's own backends that this GPU's order leaves out (the FP8 ones on an A100, Triton
    # on a T4) are assessed after it: none can run here, and a refusal then says why for each.
    unlisted = tuple(backends.backend(n) for n in candidates or () if n != SDPA and n not in order)
    assessed = [(b, *_misfits(b, req, inv)) for b in rows + unlisted]
    note = None
    if table is not None:
        choice, note = _calibrated_choice(req, order, assessed, table)
        if choice is not None:
            return choice

    # Plain sageattn only, and not with return_lse: SDPA's LSE is a separate fp32 pass over Q.K^T
    # that the native kernels' LSE does not need.
    default = _default_path(candidates, allow_fallback, forced)
    short = _too_short_to_quantize(req) if default and not req.return_lse else None
    if short and any(not hard for _, hard, _ in assessed):
        reason = f"{SDPA_FASTER}: {short}"
        return BackendChoice(SDPA, f"{reason}; {note}" if note else reason, True)

    skipped = []
    for relax in (False, True):
        for b, hard, options in assessed:
            if hard or (options and not relax):
                if not relax:
                    skipped.append((b.name, f"{b.name}: {'; '.join(hard + options)}"))
                continue
            gpu = f"sm{req.capability[0]}{req.capability[1]}"
            why = f"first usable backend for {gpu} in the order {', '.join(order)}"
            passed_over = [text for name, text in skipped if name != b.name]
            if passed_over:
                why += " (skipped " + " | ".join(passed_over) + ")"
            if note:
                why += f"; {note}"
            return _native_choice(b, req, why, options)

    input_reason = _input_reason(req, rows or tuple(backends.backend(n) for n in (candidates or ())))
    if input_reason is not None:
        return BackendChoice(SDPA, input_reason, True)
    detail = " | ".join(text for _, text in skipped) or "no quantized backend is listed for this GPU"
    if not allow_fallback:
        wanted = ", ".join(candidates or ()) or "none"
        raise BackendUnavailableError(
            f"no compiled backend provides this operation here (wanted {wanted}): {detail}. "
            f"The installed build contains: {inv.contents()}. Install the wheel built for this GPU, "
            "or call sageattn(), which falls back to PyTorch SDPA.")
    return BackendChoice(SDPA, f"no quantized backend fits: {detail}", True)


def _calibrated_choice(req: Request, order: list[str], assessed: list, table: calibration.Table):
    """(choice, None) from what the table says of the call's shape (the entry that matches it, else
    times estimated from the nearest entries: Table.estimate), or (None, why the table was not used)
    for the static order to apply. Among the backends that can run the call (no hard misfit), those
    that provide every option asked for come first, then the fastest, then unmeasured ones in the
    static order; SDPA runs instead unless that pick was measured (or estimated) at least
    CALIBRATION_MIN_SPEEDUP times as fast."""
    fitting = [(b, options) for b, hard, options in assessed if not hard]
    if not fitting:
        return None, None  # the input or the build decides; the static path says why
    label = f"calibration {table.label}"
    if req.has_mask:
        return None, f"{label} not used: it times calls without an attention mask"
    if req.return_lse:
        return None, f"{label} not used: it times calls without return_lse"
    if None in (req.batch_heads, req.seq_q, req.seq_k):
        return None, f"{label} not used: the call's shape is not known"
    dtype = calibration.dtype_name(req.dtype)
    entry = table.estimate(dtype=dtype, head_dim=req.head_dim, causal=req.causal, seq_q=req.seq_q,
                           seq_k=req.seq_k, batch_heads=req.batch_heads)
    if entry is None:
        kind = "causal" if req.causal else "non-causal"
        return None, f"{label} has no {kind} entries"
    # a head dim the table did not measure: the backends run it at their kernels' widths (padded)
    entry = entry.at_head_dim(req.head_dim, {b.name: b.padded_head_dim(req.head_dim) for b, _ in fitting})
    names = [b.name for b, _ in fitting] + [SDPA]
    measured = sorted(((n, entry.time(n)) for n in names if entry.time(n) is not None), key=lambda x: x[1])
    if not measured:
        return None, f"{label} measured none of the usable backends at {entry.name}"

    def rank(item):
        b, options = item
        ms = entry.time(b.name)
        return bool(options), ms is None, ms or 0.0, order.index(b.name)

    best, options = min(fitting, key=rank)
    where = f"{label}, {entry.basis}: " + ", ".join(entry.figure(n) for n, _ in measured)
    unmeasured = [b.name for b, _ in fitting if entry.time(b.name) is None]
    if unmeasured:
        where += f"; not measured there: {', '.join(unmeasured)}"
    sdpa_ms, best_ms = entry.time(SDPA), entry.time(best.name)
    if sdpa_ms is not None and (best_ms is None or sdpa_ms < best_ms * CALIBRATION_MIN_SPEEDUP):
        if best_ms is None:
            # nothing measured SDPA against the pick: say so, not that SDPA beat the figures shown
            lacking = [n for n, ms in measured if n != SDPA and ms < sdpa_ms]
            reason = (f"{SDPA_FASTER} as far as it was measured: {best.name}, the backend that would "
                      "run, was not measured there"
                      + (f" ({', '.join(lacking)} measured faster but without an option asked for)"
                         if lacking else "") + f" ({where})")
        elif sdpa_ms < best_ms:
            reason = f"{SDPA_FASTER} ({where})"
        else:
            reason = (f"{SDPA_FASTER} within measurement noise ({best.name} {entry.verb} "
                      f"{sdpa_ms / best_ms - 1:.1%} faster, less than the {CALIBRATION_MIN_SPEEDUP - 1:.0%} "
                      f"a quantized backend must gain; {where})")
        return BackendChoice(SDPA, reason, True, calibrated=True), None
    why = f"fastest {entry.verb} for this shape ({where})"
    unusable = [f"{b.name}: {'; '.join(hard)}" for b, hard, _ in assessed if hard]
    if unusable:
        why += " (not usable here: " + " | ".join(unusable) + ")"
    if best.op == "qk_int8_pv_fp8":  # the table trades accuracy for speed here: say so
        why += (f"; {best.name} runs P.V in FP8, less accurate than the FP16 P.V backends "
                f"({CALIBRATION_ENV_VAR}=off keeps the static order, FP16 P.V first)")
    return _native_choice(best, req, why, options, calibrated=True), None


def _forced_choice(name: str, req: Request, inv: Inventory, candidates) -> BackendChoice:
    source = f"forced by force_backend({name!r}) or {ENV_VAR}"
    if name == SDPA:
        return BackendChoice(SDPA, source, True)
    if candidates is not None and name not in candidates:
        raise BackendUnavailableError(f"backend {name!r} is forced, but this function runs only "
                                      f"{', '.join(candidates)} (or SDPA)")
    b = backends.backend(name)
    hard, options = _misfits(b, req, inv)
    if hard:
        raise BackendUnavailableError(f"backend {name!r} is forced but cannot run this call: "
                                      f"{'; '.join(hard)}. The installed build contains: {inv.contents()}")
    return _native_choice(b, req, source, options)


# --- tensor-level API -----------------------------------------------------------------------

def scale_magnitude(sm_scale: float) -> float:
    """Request.scale_magnitude for this scale: |sm_scale| past backends.MAX_QUANTIZED_SCALE, else 0
    (below the limit the value does not matter, so ordinary scales share one cached choice)."""
    return abs(sm_scale) if abs(sm_scale) > backends.MAX_QUANTIZED_SCALE else 0.0


def request_for(call: AttnCall) -> Request:
    p = call.problem
    # A learned additive mask (a bias that requires grad) needs SDPA's backward as much as q, k, v do.
    mask_grad = (call.attn_mask is not None and call.attn_mask.requires_grad and torch.is_grad_enabled())
    return Request(device_type=p.device.type, capability=device_capability(p.device), dtype=p.dtype,
                   head_dim=p.head_dim, has_mask=call.attn_mask is not None,
                   requires_grad=p.requires_grad or mask_grad,
                   dropout=call.dropout_p > 0, qk_quant_gran=call.qk_quant_gran,
                   pv_accum_dtype=call.pv_accum_dtype, smooth_v=call.smooth_v,
                   batch_heads=p.batch * p.q_heads, batch=p.batch, q_heads=p.q_heads, seq_q=p.q_len, seq_k=p.kv_len, causal=call.is_causal,
                   return_lse=call.return_lse, scale_magnitude=scale_magnitude(call.sm_scale))


def choose_for_call(call: AttnCall, *, candidates=None, allow_fallback=True,
                    request: Request | None = None) -> BackendChoice:
    """The backend for a validated call; `request`: request_for(call), where the caller kept it."""
    req = request_for(call) if request is None else request
    inv = current_inventory(call.problem.device)
    forced = forced_backend()
    # Only the default path reads the table (and SAGEATTENTION_CALIBRATION); choose() enforces it too.
    table = (calibration_for(req.capability, gpu_name=device_name(call.problem.device))
             if _default_path(candidates, allow_fallback, forced) else None)
    return choose(req, inv, candidates=candidates, allow_fallback=allow_fallback, forced=forced,
                  calibration=table)


def select_backend(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False,
                   **kwargs) -> BackendChoice:
    """The backend `sageattn(q, k, v, ...)` would run with these arguments, and why.

    Takes exactly sageattn's arguments; raises the same ValueError/TypeError for bad input.
    """
    return choose_for_call(_parse("select_backend", q, k, v, tensor_layout, is_causal, sm_scale, return_lse,
                                  kwargs))


def _parse(func_name, q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs) -> AttnCall:
    # func_name: the function the user called, which an unknown keyword's warning names
    options = split_kwargs(func_name, kwargs, SAGEATTN_KEYWORDS)
    return parse_call(q, k, v, tensor_layout=tensor_layout, is_causal=is_causal, sm_scale=sm_scale,
                      return_lse=return_lse, options=options)


def explain(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False,
            **kwargs) -> str:
    """A sentence saying which backend sageattn would run for these arguments, and why."""
    call = _parse("explain", q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs)
    if call.problem.empty:   # sageattn returns before any backend is chosen, a forced one included
        return f"sageattn runs no backend: {_empty_words(call.problem)}"
    return f"sageattn {choose_for_call(call).sentence()}"


def _empty_words(p) -> str:
    zero = [what for what, n in (("batch 0", p.batch), ("0 query heads", p.q_heads),
                                 ("0 queries per sequence", p.q_len), ("0 keys per sequence", p.kv_len),
                                 ("head dim 0", p.head_dim)) if n == 0]
    result = "zeros of the queries' shape" if zero == ["0 keys per sequence"] else "an empty result"
    return (f"the call has nothing to attend over ({', '.join(zero)}), so it returns {result} without "
            "choosing one (last_backend() is None after it; a forced backend is not checked)")


_logged: set[str] = set()
_log_lock = threading.Lock()


def log_once(message: str) -> None:
    """Log a fallback reason or an option adjustment once per distinct message: a warning, except
    SDPA chosen because the calibration measured it faster (a speed choice, logged at INFO)."""
    with _log_lock:
        if message in _logged:
            return
        _logged.add(message)
    logger.log(logging.INFO if SDPA_FASTER in message else logging.WARNING, message)
