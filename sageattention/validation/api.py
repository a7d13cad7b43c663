"""The part of the sageattention API the suite exercises, behind one small object.

The suite imports the package only through ``Api.from_package()``, so the CPU unit tests can hand
it a fake implementation and exercise the checks' own logic without kernels or a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, ContextManager

# docs/architecture.md: the public API, re-exported by the package.
PUBLIC_FUNCTIONS = (
    "sageattn",
    "sageattn_varlen",
    "sageattn_qk_int8_pv_fp16_triton",
    "sageattn_qk_int8_pv_fp16_cuda",
    "sageattn_qk_int8_pv_fp8_cuda",
    "sageattn_qk_int8_pv_fp8_cuda_sm90",
)


@dataclass
class Api:
    sageattn: Callable[..., Any]
    force_backend: Callable[[str], ContextManager]
    last_backend: Callable[[], str | None]
    module: ModuleType | Any | None = None
    # Forgets the last call's backend (sageattention.dispatch.record_backend(None)), so that a
    # call which records none reads as None rather than as the backend of the call before it.
    clear_last_backend: Callable[[], None] = field(default=lambda: None)
    # family -> None when loaded, else why not (sageattention.native.available_families()).
    available_families: Callable[[], dict[str, str | None]] = field(default=lambda: {})
    # The wheel's _build_info.json as a dict, or None in a source checkout.
    build_info: Callable[[], dict | None] = field(default=lambda: None)
    # The families.json the package carries.
    families_table: Callable[[], dict] = field(default=lambda: {})
    backends_table: Callable[[], Any] = field(default=lambda: None)
    # sageattention.select_backend (the dispatcher's choice and why), or None where unavailable.
    select_backend: Callable[..., Any] | None = None
    # A context in which sageattn walks the static preference order, not the calibration table.
    static_dispatch: Callable[[], ContextManager] = field(default=contextlib.nullcontext)

    def call(self, fn: Callable, backend: str | None, *args, **kwargs) -> tuple[Any, str | None]:
        """Call ``fn`` (forcing ``backend`` when given); return the result and what ran: None when
        the call recorded no backend, never the backend of the call before it."""
        ctx = self.force_backend(backend) if backend else contextlib.nullcontext()
        self.clear_last_backend()
        with ctx:
            out = fn(*args, **kwargs)
        return out, self.last_backend()

    def run(self, backend: str | None, *args, **kwargs) -> tuple[Any, str | None]:
        """Call sageattn (forcing ``backend`` when given); return the result and what ran."""
        return self.call(self.sageattn, backend, *args, **kwargs)

    @classmethod
    def from_package(cls) -> "Api":
        pkg = importlib.import_module("sageattention")

        def _optional(modname: str, attr: str, default):
            try:
                return getattr(importlib.import_module(modname), attr)
            except (ImportError, AttributeError):
                return default

        record = _optional("sageattention.dispatch", "record_backend", None)
        return cls(
            sageattn=pkg.sageattn,
            force_backend=pkg.force_backend,
            last_backend=pkg.last_backend,
            module=pkg,
            clear_last_backend=(lambda: record(None)) if callable(record) else (lambda: None),
            available_families=_optional("sageattention.native", "available_families",
                                         lambda: {}),
            build_info=_optional("sageattention.build_info", "load", lambda: None),
            families_table=_families_json,
            backends_table=lambda: _backends_snapshot(),
            select_backend=getattr(pkg, "select_backend", None),
            static_dispatch=(lambda: pkg.use_calibration(False)) if hasattr(pkg, "use_calibration")
            else contextlib.nullcontext,
        )


def _families_json() -> dict:
    import json
    from importlib import resources

    try:
        text = resources.files("sageattention.native").joinpath("families.json").read_text()
    except (FileNotFoundError, ModuleNotFoundError):
        return {}
    return json.loads(text)


def _backends_snapshot() -> Any:
    """The capability table of sageattention.backends, made JSON-safe, or None if unreadable.

    The table's exact shape belongs to the core; the suite only copies it into the report so the
    notes can read the limitations from the wheel that was validated.
    """
    try:
        mod = importlib.import_module("sageattention.backends")
    except ImportError:
        return None
    table = getattr(mod, "capability_table", None)
    if not callable(table):
        return None
    try:
        return _jsonable(list(table()))
    except Exception as exc:  # noqa: BLE001 - a broken table is reported, not fatal here
        return {"error": f"{type(exc).__name__}: {exc}"}


def _jsonable(obj: Any, depth: int = 0) -> Any:
    import dataclasses

    if depth > 6:
        return repr(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _jsonable(dataclasses.asdict(obj), depth + 1)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, range) and obj.step == 1 and len(obj):   # a backend's head dims, 1..128
        return {"min": obj.start, "max": obj.stop - 1}
    if isinstance(obj, (list, tuple, set, frozenset, range)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [_jsonable(v, depth + 1) for v in items]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)
