"""Running checks one by one: each records pass, fail or skip, and none can stop the others."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch

from .accuracy import Bar, Errors, bar_for, errors, worst
from .api import Api
from .expectation import Expectation
from .profile import Profile


class Skip(Exception):
    """Raised by a check body that cannot run here; the message is the reason."""


@dataclass(frozen=True)
class Check:
    name: str  # the seed's wording; the report and the notes use it verbatim
    slug: str  # short id for --only / --skip
    body: Callable[["Context", "Recorder", str | None], None]
    # Native checks run once per native backend of the build, forced with force_backend; a call
    # that ends on another backend (a fallback) fails the check.
    native: bool = True
    needs_cuda: bool = False
    # Whether its comparisons are on normal inputs and count towards the accuracy summary.
    in_accuracy_summary: bool = False


@dataclass
class Context:
    api: Api
    device: torch.device
    profile: Profile
    expectation: Expectation

    @property
    def native_names(self) -> list[str]:
        return self.expectation.names

    def call(self, rec: "Recorder", backend: str | None, *args, **kwargs):
        """Call sageattn, forcing ``backend`` when given; a forced call that ran elsewhere fails."""
        out, ran = self.api.run(backend, *args, **kwargs)
        rec.saw(ran)
        if backend is not None and ran != backend:
            rec.fail(f"forced {backend} but {ran or 'nothing'} ran (a native check that runs a "
                     f"fallback fails)")
        return out, ran

    def default_dispatch(self, rec: "Recorder", label: str, ref, *args, **kwargs):
        """Call plain sageattn and require a native backend of this build. Another backend (SDPA,
        a Triton kernel) is accepted only when the dispatcher says the GPU's calibration measured
        it fastest for this shape; a Triton kernel's output is then held to its bar, and the same
        call is repeated in the static order, which must run native."""
        out, ran = self.call(rec, None, *args, **kwargs)
        if ran in self.native_names:
            rec.compare(label, out, ref, ran=ran)
            return
        choice = self.api.select_backend(*args, **kwargs) if self.api.select_backend else None
        if getattr(choice, "calibrated", False) and ran == getattr(choice, "name", None):
            rec.note(f"{label}: sageattn() ran {ran} by calibration ({choice.reason})")
            if ran != "sdpa":
                rec.compare(f"{label} (calibrated: {ran})", out, ref, ran=ran)
            with self.api.static_dispatch():
                out, ran = self.call(rec, None, *args, **kwargs)
            label += " (static order)"
            if ran in self.native_names:
                rec.compare(label, out, ref, ran=ran)
                return
        rec.fail(f"{label}: sageattn() chose {ran} on this GPU; expected one of this build's "
                 f"native backends {self.native_names}")

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass
class Case:
    label: str
    backend: str | None
    errors: Errors | None
    ok: bool
    detail: str | None = None

    def as_dict(self) -> dict:
        d = {"label": self.label, "backend": self.backend, "ok": self.ok}
        if self.errors is not None:
            d.update(self.errors.as_dict())
        if self.detail:
            d["detail"] = self.detail
        return d


@dataclass
class Recorder:
    """Collects what one check saw: compared cases, failures, notes and the backends that ran."""

    cases: list[Case] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)
    prefix: str = ""

    def saw(self, backend: str | None) -> None:
        if backend and backend not in self.backends:
            self.backends.append(backend)

    def fail(self, message: str) -> None:
        self.failures.append(f"{self.prefix}{message}")

    def require(self, condition: bool, message: str) -> bool:
        if not condition:
            self.fail(message)
        return bool(condition)

    def note(self, message: str) -> None:
        if message not in self.notes:
            self.notes.append(message)

    def compare(self, label: str, out: torch.Tensor, ref: torch.Tensor, *, ran: str | None,
                bar: Bar | None = None) -> Errors:
        """Compare ``out`` with its fp32 reference and hold it to the bar of the backend that ran."""
        bar = bar or bar_for(ran)
        label = f"{self.prefix}{label}"
        try:
            err = errors(out, ref)
        except ValueError as exc:
            self.cases.append(Case(label, ran, None, False, str(exc)))
            self.failures.append(f"{label}: {exc}")
            return Errors(float("nan"), float("inf"), float("inf"), False)
        ok = err.within(bar)
        detail = None
        if not ok:
            detail = ("non-finite fp32 reference (NaN/Inf): the check's inputs are wrong"
                      if not bool(torch.isfinite(ref).all()) else
                      "non-finite output (NaN/Inf)" if not err.finite else
                      f"cosine {err.cosine:.6f} (bar >= {bar.min_cosine}), rel L1 "
                      f"{err.rel_l1:.5f} (bar <= {bar.max_rel_l1}) [{bar.name}]")
            self.failures.append(f"{label}: {detail}")
        self.cases.append(Case(label, ran, err, ok, detail))
        return err


def _status(rec: Recorder, skipped: str | None) -> tuple[str, str | None]:
    if rec.failures:
        more = f" (+{len(rec.failures) - 1} more)" if len(rec.failures) > 1 else ""
        return "fail", rec.failures[0] + more
    if skipped is not None:
        return "skip", skipped
    return "pass", None


def run_check(check: Check, ctx: Context) -> dict:
    """Run one check to completion and return its record; exceptions become failures."""
    rec = Recorder()
    skipped = None
    errors_seen: list[str] = []  # one traceback per backend that raised, in order
    start = time.perf_counter()
    if check.needs_cuda and ctx.device.type != "cuda":
        skipped = "needs a CUDA device"
    else:
        backends = ctx.native_names if check.native else [None]
        for backend in backends:
            rec.prefix = f"[{backend}] " if backend and len(backends) > 1 else ""
            try:
                check.body(ctx, rec, backend)
                ctx.sync()  # surface asynchronous CUDA errors here, not in a later check
            except Skip as exc:
                skipped = str(exc) or "skipped"
                break
            except Exception as exc:  # noqa: BLE001 - one failing check must not end the run
                rec.fail(f"{type(exc).__name__}: {exc}")
                errors_seen.append(rec.prefix + traceback.format_exc(limit=8))
        rec.prefix = ""
    if ctx.device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass
    status, reason = _status(rec, skipped)
    summary = worst([c.errors for c in rec.cases if c.errors is not None])
    record = {
        "name": check.name,
        "id": check.slug,
        "status": status,
        "reason": reason,
        "native": check.native,
        "backend": ", ".join(rec.backends) if rec.backends else None,
        "backends": list(rec.backends),
        "errors": summary.as_dict() if summary else None,
        "cases": [c.as_dict() for c in rec.cases],
        "failures": list(rec.failures),
        "notes": list(rec.notes),
        "duration_s": round(time.perf_counter() - start, 3),
    }
    if errors_seen:
        record["traceback"] = "\n".join(errors_seen)
    return record


def select(checks: list[Check], only: list[str] | None, skip: list[str] | None) -> list[Check]:
    """The checks named by id (``--only``/``--skip``); unknown ids, and ids that leave no check
    (a run of none would pass), are an error."""
    known = {c.slug for c in checks}
    for given in (only or []) + (skip or []):
        if given not in known:
            raise ValueError(f"unknown check id {given!r}; known ids: {', '.join(sorted(known))}")
    chosen = [c for c in checks if not only or c.slug in only]
    chosen = [c for c in chosen if not skip or c.slug not in skip]
    if checks and not chosen:
        given = " ".join(f"{flag} {' '.join(ids)}" for flag, ids in (("--only", only), ("--skip", skip)) if ids)
        raise ValueError(f"{given} leave no check to run")
    return chosen
