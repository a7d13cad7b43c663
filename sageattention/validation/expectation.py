"""Which native backends a wheel must run on this GPU, and whether they run natively or from PTX.

Derived from the wheel's build info (its SM targets and families) and the kernel family table
(sageattention/native/families.json), never from a hand-kept list: an sm90 wheel on an H200 runs
its sm80, sm89, sm90 and sm90_fp8 families natively (sm_90 SASS, and sm_90a for the arch-specific
sm90 and sm90_fp8 families, which serve only that SM); an sm75 wheel (``sm75+PTX``) runs the
sm75 family there only as compute_75 PTX compiled by the driver.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TARGET = re.compile(r"^sm_?(?P<sm>\d{2,3})(?P<suffix>[af]?)(?P<ptx>\+ptx)?$", re.IGNORECASE)


class NoNativeCode(RuntimeError):
    """The wheel carries no kernel that can run on this GPU, natively or through PTX."""


@dataclass(frozen=True)
class Target:
    sm: int
    ptx: bool
    text: str


def parse_target(text: str) -> Target:
    """``"sm75+PTX"`` -> Target(75, ptx=True); ``"sm90"``/``"sm90a"`` -> Target(90, ptx=False)."""
    m = _TARGET.match(text.strip())
    if not m:
        raise ValueError(f"unrecognised SM target {text!r}; expected forms like 'sm90', 'sm90a' "
                         f"or 'sm75+PTX'")
    return Target(sm=int(m["sm"]), ptx=bool(m["ptx"]), text=text)


def sass_runs_on(target_sm: int, gpu_sm: int) -> bool:
    """SASS built for ``target_sm`` runs on a GPU of ``gpu_sm``: the same major and an equal or
    higher minor (sm80 code on an sm86 GPU)."""
    return target_sm // 10 == gpu_sm // 10 and target_sm % 10 <= gpu_sm % 10


def ptx_serves(spec: dict, ptx_sm: int) -> frozenset[int] | None:
    """The GPUs on which the dispatcher runs a family's compute_<ptx_sm> PTX (``spec``: the family's
    entry in native/families.json). None: every GPU of ``ptx_sm`` or newer, for the family's own
    ``embed_ptx`` (the sm75 family's compute_75; backends.py gives it a minimum capability and no
    list). Otherwise the SMs it serves from ``ptx_sm`` on, for the PTX of a '+PTX' target it serves
    (sm80+PTX gives the sm80 family compute_80, which runs on sm90, one of its SMs, but not on a
    newer GPU it does not serve); empty where the family carries no such PTX (an arch-specific
    family, or ``ptx_sm`` is not one of its SMs)."""
    embed = spec.get("embed_ptx")
    if embed and int(embed.split("_")[1]) == ptx_sm:
        return None
    serves = {int(s.removeprefix("sm")) for s in spec.get("serves", [])}
    if spec.get("arch_specific") or ptx_sm not in serves:
        return frozenset()
    return frozenset(s for s in serves if s >= ptx_sm)


def wheel_ptx_serves(families: dict, wheel_families, ptx_sm: int) -> frozenset[int] | None:
    """ptx_serves over the families a wheel carries (``families``: families.json's "families"):
    None when one of them runs this PTX on every newer GPU, else the union of their SMs."""
    reach: set[int] = set()
    for name in wheel_families:
        served = ptx_serves(families.get(name, {}), ptx_sm)
        if served is None:
            return None
        reach |= served
    return frozenset(reach)


def ptx_runs_on(reach: frozenset[int] | None, ptx_sm: int, gpu_sm: int) -> bool:
    """Whether PTX for ``ptx_sm`` whose reach (ptx_serves) is ``reach`` runs on ``gpu_sm``: the
    driver JIT-compiles PTX forward only, and the dispatcher uses it only within its reach."""
    return gpu_sm >= ptx_sm and (reach is None or gpu_sm in reach)


def newest_embedded_ptx(embedded_ptx_sms, gpu_sm: int) -> int | None:
    """For a GPU that no family serves (sm120, say): the newest of the families' ``embed_ptx`` SMs
    (ptx_serves: that PTX runs on every GPU of its SM or newer) at or below ``gpu_sm``, the target
    whose wheel runs there; None when there is none."""
    reachable = [sm for sm in embedded_ptx_sms if sm <= gpu_sm]
    return max(reachable) if reachable else None


def backend_name(family: str, op: str) -> str:
    """Backend name of a family's op, as docs/architecture.md spells them: cuda-sm75-fp16 ...

    The name carries the family's SM and the op's PV precision, so a family named for both
    (sm90_fp8) is not named twice: ``backend_name("sm90_fp8", "qk_int8_pv_fp8")`` is cuda-sm90-fp8.
    """
    precision = op.rsplit("_", 1)[-1]  # qk_int8_pv_fp16 -> fp16, qk_int8_pv_fp8 -> fp8
    sm = family.split("_", 1)[0]  # sm90_fp8 -> sm90
    return f"cuda-{sm}-{precision}"


@dataclass(frozen=True)
class NativeBackend:
    name: str
    family: str
    via: str  # "sass" or "ptx" (compute_XY PTX JIT-compiled by the driver)
    ptx_arch: str | None = None


@dataclass(frozen=True)
class Expectation:
    execution: str  # "native" or "ptx-jit"
    gpu_sm: int
    backends: tuple[NativeBackend, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.backends]

    def as_dict(self) -> dict:
        return {
            "execution": self.execution,
            "gpu_sm": f"sm{self.gpu_sm}",
            "native_backends": [
                {"name": b.name, "family": b.family, "via": b.via, "ptx_arch": b.ptx_arch}
                for b in self.backends
            ],
            "notes": list(self.notes),
        }


def expect(*, gpu_sm: int, families_table: dict, build_info: dict | None,
           available: dict[str, str | None]) -> Expectation:
    """The native backends this build must run on a GPU of ``gpu_sm`` (e.g. 90)."""
    families = (families_table or {}).get("families", {})
    if not families:
        raise NoNativeCode("the kernel family table (native/families.json) is empty or missing")
    if build_info is not None:
        wheel_families = list(build_info.get("families") or [])
        try:
            targets = [parse_target(str(t)) for t in build_info.get("sm_targets") or []]
        except ValueError as exc:  # a refusal (exit 2) in words, not a traceback (exit 1: "failed")
            raise NoNativeCode(f"the build info's sm_targets cannot be read, so which kernels this "
                               f"wheel carries for sm{gpu_sm} is unknown: {exc}") from exc
    else:  # source checkout: whatever compiled here, for this GPU only
        wheel_families = [f for f, why in available.items() if why is None]
        targets = [Target(sm=gpu_sm, ptx=False, text=f"sm{gpu_sm}")]
    # SASS runs on the same major and an equal or higher minor (sm80 code on an sm86 GPU).
    sass_ok = any(sass_runs_on(t.sm, gpu_sm) for t in targets)
    ptx_sms = {t.sm for t in targets if t.ptx}
    for arch in (build_info or {}).get("ptx") or []:  # e.g. "compute_75"
        m = re.fullmatch(r"compute_(\d{2,3})[af]?", str(arch))
        if m:
            ptx_sms.add(int(m[1]))
    here = f"sm{gpu_sm}"

    sass, ptx = [], []
    for family, spec in families.items():  # families.json order
        if family not in wheel_families:
            continue
        for op in spec.get("ops", []):
            name = backend_name(family, op)
            if here in spec.get("serves", []) and sass_ok:
                sass.append(NativeBackend(name, family, "sass"))
            else:
                # The family's PTX (its embed_ptx, or a '+PTX' target it serves: sm80+PTX gives
                # the sm80 family compute_80), where ptx_serves says the dispatcher runs it.
                usable = sorted(sm for sm in ptx_sms if ptx_runs_on(ptx_serves(spec, sm), sm, gpu_sm))
                if usable:
                    ptx.append(NativeBackend(name, family, "ptx", f"compute_{usable[-1]}"))
    if sass:
        notes = tuple(f"{b.family} family also embeds PTX; not exercised (SASS present)"
                      for b in ptx)
        return Expectation("native", gpu_sm, tuple(sass), notes)
    if ptx:
        return Expectation("ptx-jit", gpu_sm, tuple(ptx))
    if build_info is None:  # no wheel: nothing was targeted, whatever compiled in place is it
        absent = ", ".join(f for f, r in available.items() if r is not None)
        raise NoNativeCode(
            f"this sageattention has no build info (a source checkout, not an installed wheel) "
            f"and no kernel family built in place runs on {here} (loaded: "
            f"{', '.join(wheel_families) or 'none'}; not built or not loading: {absent or 'none'}). To validate an "
            f"installed wheel, run from outside the checkout (and without it on PYTHONPATH), "
            f"where the checkout does not shadow the wheel; to validate the checkout, build its "
            f"kernels first (SAGEATTENTION_SM_TARGETS={here} pip install --no-build-isolation .)")
    raise NoNativeCode(
        f"this build has no kernel for {here}: families {wheel_families or 'none'}, SM targets "
        f"{[t.text for t in targets] or 'none'}; install the wheel built for {here}")
