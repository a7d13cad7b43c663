"""The speed goals a benchmark run is read against, judged from that run's own figures.

Two goals, both set on design.md's GPU runner (one H200):

- Hopper: over design.md's 20 standard cases, `sageattn` (the default dispatch) at least 0.97x
  SDPA's default backend on every case and 1.3x as a geometric mean, at least 900 TOPS at fp16
  1x32x16384x128 non-causal, and every output within its path's accuracy bar against fp32 SDPA.
- sm80 family: the INT8-QK / FP16-PV mma.sync kernels, in each accumulation mode the run timed,
  at least as fast as upstream SageAttention 1.0.6's Triton kernel (design.md's H200 column) on
  every case of that column.

A goal is "met" or "not met" only where the run holds every case it needs ("not evaluated"
otherwise, with what is missing; a figure that is not a finite number counts as missing, and a run
that forced its headline figures to one backend leaves the Hopper goal, the default dispatch's,
not evaluated), and a run on another GPU than an H200 says so: its verdicts
are indicative, not the goal's measurement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GOAL_GPU = "H200"
MIN_CASE_SPEEDUP = 0.97
MIN_GEOMEAN_SPEEDUP = 1.3
MIN_TOPS = 900.0
TOPS_CASE = ("fp16", 1, 32, 16384, 128, False)  # (dtype, batch, heads, seq_len, head_dim, causal)
SM80_BACKEND = "cuda-sm80-fp16"

# ../shared/design.md, "Baselines measured on the H200": upstream SageAttention 1.0.6's Triton
# kernel, fp16 TOPS end to end, keyed (b, h, n, d, causal). The sm80 family's speed bar.
UPSTREAM_106_TRITON_TOPS = {
    (4, 32, 4096, 128, False): 379, (4, 32, 4096, 128, True): 310,
    (1, 32, 16384, 128, False): 431, (1, 32, 16384, 128, True): 402,
    (4, 32, 4096, 64, False): 358, (1, 32, 16384, 64, False): 403,
    (8, 32, 1024, 128, False): 242, (8, 32, 1024, 128, True): 154,
}

MET, NOT_MET, NOT_EVALUATED = "met", "not met", "not evaluated"
# benchmark.run's primary_backend where the headline figures are sageattn's own dispatch
DEFAULT_DISPATCH = "default dispatch"


@dataclass(frozen=True)
class Verdict:
    goal: str
    status: str  # MET, NOT_MET or NOT_EVALUATED
    detail: str

    def line(self) -> str:
        return f"{self.goal}: **{self.status}** ({self.detail})"


def case_key(row: dict) -> tuple | None:
    """(dtype, batch, heads, seq_len, head_dim, causal) of a benchmark row; None for a
    cross-attention row (kv_len given), which no goal names."""
    if row.get("kv_len") is not None:
        return None
    try:
        return (row["dtype"], row["batch"], row["heads"], row["seq_len"], row["head_dim"],
                bool(row["causal"]))
    except KeyError:
        return None


def standard_keys() -> list[tuple]:
    from .benchmark import standard_cases

    return [(c.dtype, c.batch, c.heads, c.seq_len, c.head_dim, c.causal) for c in standard_cases()]


def _name(key: tuple) -> str:
    dtype, b, h, n, d, causal = key
    return f"{dtype} {b}x{h}x{n}x{d} {'causal' if causal else 'non-causal'}"


def _listing(items: list[str], limit: int = 4) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _missing(needed: list[tuple], have, lacking: str = "not timed") -> str:
    missing = [_name(k) for k in needed if k not in have]
    return f"{len(missing)} of its {len(needed)} cases {lacking} in this run: {_listing(missing)}"


def _figure(x, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "not finite"


def _short_of(value: float, bar: float, digits: int) -> str:
    """``value`` (below ``bar``) with ``digits`` decimals, or more where that many would print it
    at or above the bar: 430.73 against 431 is "430.7", not "431 < 431"."""
    while round(value, digits) >= bar and digits < 6:
        digits += 1
    return f"{value:.{digits}f}"


def _measured(x) -> bool:
    """Whether ``x`` is a figure a goal can be judged on: a finite number above 0. A NaN compares
    below no bar (a NaN speed-up was judged "met" and left out of the geometric mean), an infinity
    above every one, and None, 0 or a bool is no timing."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _forced(perf: dict) -> str | None:
    """The backend a run forced its headline ``sageattn`` figures to (--backend, or the
    environment's override), None for the default dispatch (or a result that does not say)."""
    primary = perf.get("primary_backend")
    return primary if isinstance(primary, str) and primary and primary != DEFAULT_DISPATCH else None


def _hopper(rows: dict, forced: str | None = None) -> list[Verdict]:
    from .validation.accuracy import Errors, bar_for  # the validation package imports the benchmark

    needed = standard_keys()
    if forced is not None:  # the goal is the default dispatch's: a forced kernel's figures are not it
        why = (f"this run forced the headline `sageattn` figures to {forced}; the goal is the "
               "default dispatch's (run without --backend or the environment's override)")
        return [Verdict(goal, NOT_EVALUATED, why) for goal in (
            f"`sageattn` >= {MIN_CASE_SPEEDUP:.2f}x SDPA on every standard case",
            f"geometric mean >= {MIN_GEOMEAN_SPEEDUP:.2f}x SDPA over the {len(needed)} standard cases",
            f">= {MIN_TOPS:.0f} TOPS at {_name(TOPS_CASE)}",
            "every standard case's output within its path's accuracy bar against fp32 SDPA")]
    timed = {k: r for k, r in rows.items() if _measured(r.get("speedup_vs_sdpa"))}
    verdicts = []

    low_keys = [k for k in needed if k in timed and timed[k]["speedup_vs_sdpa"] < MIN_CASE_SPEEDUP]
    # where sageattn ran SDPA itself, the shortfall is SDPA's spread between two timings of one call
    ran_sdpa = [k for k in low_keys if timed[k].get("backend") == "sdpa"]
    below = [f"{_name(k)} {_short_of(timed[k]['speedup_vs_sdpa'], MIN_CASE_SPEEDUP, 2)}x"
             + (" [sdpa]" if k in ran_sdpa else "") for k in low_keys]
    goal = f"`sageattn` >= {MIN_CASE_SPEEDUP:.2f}x SDPA on every standard case"
    if below:
        spread = ""
        if ran_sdpa:
            which = "each of them" if len(ran_sdpa) == len(below) else f"{len(ran_sdpa)} of them"
            spread = f"; {which} ran SDPA itself ([sdpa]): SDPA timed against SDPA"
        verdicts.append(Verdict(goal, NOT_MET, f"{len(below)} below: {_listing(below)}{spread}"))
    elif all(k in timed for k in needed):
        low = min(needed, key=lambda k: timed[k]["speedup_vs_sdpa"])
        verdicts.append(Verdict(goal, MET, f"lowest {timed[low]['speedup_vs_sdpa']:.2f}x, {_name(low)}"))
    else:
        verdicts.append(Verdict(goal, NOT_EVALUATED, _missing(needed, timed)))

    goal = f"geometric mean >= {MIN_GEOMEAN_SPEEDUP:.2f}x SDPA over the {len(needed)} standard cases"
    if all(k in timed for k in needed):
        from .benchmark import geomean

        g = geomean(timed[k]["speedup_vs_sdpa"] for k in needed)
        verdicts.append(Verdict(goal, MET if g >= MIN_GEOMEAN_SPEEDUP else NOT_MET, f"{g:.3f}x"))
    else:
        verdicts.append(Verdict(goal, NOT_EVALUATED, _missing(needed, timed)))

    goal = f">= {MIN_TOPS:.0f} TOPS at {_name(TOPS_CASE)}"
    row = rows.get(TOPS_CASE)
    if row and _measured(row.get("sageattn_tops")):
        t = row["sageattn_tops"]
        verdicts.append(Verdict(goal, MET if t >= MIN_TOPS else NOT_MET,
                                f"{t:.0f} TOPS [{row.get('backend') or '-'}]"))
    else:
        verdicts.append(Verdict(goal, NOT_EVALUATED, "that case was not timed in this run"))

    goal = "every standard case's output within its path's accuracy bar against fp32 SDPA"
    measured = {k: rows[k] for k in needed if k in rows and rows[k].get("accuracy")}
    outside = []
    for k, r in measured.items():
        bar = bar_for(r.get("backend"))
        a = r["accuracy"]
        if not Errors.from_dict(a).within(bar):
            outside.append(f"{_name(k)} [{r.get('backend')}] cosine {_figure(a.get('cosine'), '.5f')}, "
                           f"relative L1 {_figure(a.get('rel_l1'), '.4f')} (bar {bar.min_cosine} / {bar.max_rel_l1})")
    if outside:
        verdicts.append(Verdict(goal, NOT_MET, f"{len(outside)} outside: {_listing(outside, 2)}"))
    elif len(measured) == len(needed):
        worst = min(measured.values(), key=lambda r: r["accuracy"]["cosine"])
        verdicts.append(Verdict(goal, MET, f"lowest cosine {worst['accuracy']['cosine']:.5f}, highest "
                                f"relative L1 {max(r['accuracy']['rel_l1'] for r in measured.values()):.4f}"))
    else:
        verdicts.append(Verdict(goal, NOT_EVALUATED,
                                _missing(needed, measured, "without an accuracy figure")))
    return verdicts


def upstream_tops(row: dict) -> int | None:
    """design.md's upstream 1.0.6 Triton TOPS for a benchmark row's case, None where the column
    has none (bf16, cross-attention, other shapes)."""
    key = case_key(row)
    return UPSTREAM_106_TRITON_TOPS.get(key[1:]) if key and key[0] == "fp16" else None


def _sm80(rows: dict) -> list[Verdict]:
    from .benchmark import split_timed_name

    needed = [("fp16", b, h, n, d, c) for (b, h, n, d, c) in UPSTREAM_106_TRITON_TOPS]
    timed_names = sorted({name for r in rows.values() for name in r.get("backends", {})
                          if split_timed_name(name)[0] == SM80_BACKEND})
    verdicts = []
    for name in timed_names:
        goal = f"`{name}` >= upstream 1.0.6 Triton on each of its {len(needed)} fp16 cases"
        tops = {k: rows[k]["backends"].get(name, {}).get("tops") for k in needed if k in rows}
        tops = {k: t for k, t in tops.items() if _measured(t)}
        below = [f"{_name(k)} {_short_of(tops[k], UPSTREAM_106_TRITON_TOPS[k[1:]], 0)} < "
                 f"{UPSTREAM_106_TRITON_TOPS[k[1:]]}" for k in needed
                 if k in tops and tops[k] < UPSTREAM_106_TRITON_TOPS[k[1:]]]
        if below:
            verdicts.append(Verdict(goal, NOT_MET, f"{len(below)} below: {_listing(below)}"))
        elif len(tops) == len(needed):
            ratios = [tops[k] / UPSTREAM_106_TRITON_TOPS[k[1:]] for k in needed]
            verdicts.append(Verdict(goal, MET, f"{min(ratios):.2f}-{max(ratios):.2f}x of the column"))
        else:
            verdicts.append(Verdict(goal, NOT_EVALUATED, _missing(needed, tops)))
    return verdicts


def evaluate(perf: dict) -> list[Verdict]:
    """Every goal's verdict from a benchmark result (a ``--json`` file, or a validation report's
    ``performance`` section). The sm80-family goal appears once per sm80 backend or mode timed."""
    rows = {}
    for row in perf.get("cases") or []:
        key = case_key(row) if isinstance(row, dict) else None
        if key is not None:
            rows[key] = row
    return _hopper(rows, _forced(perf)) + _sm80(rows)


def section(perf: dict, gpu_name: str | None) -> list[str]:
    """The goals' verdicts as markdown lines, headed by which GPU measured them."""
    gpu = gpu_name or "an unnamed GPU"
    where = (f"measured on {gpu}, the goals' GPU" if GOAL_GPU in gpu else
             f"measured on {gpu}; the goals are set for an {GOAL_GPU}, so these verdicts are "
             "indicative only")
    return [f"Speed goals (judged from this run's figures; {where}):"] + \
        [f"- {v.line()}" for v in evaluate(perf)]
