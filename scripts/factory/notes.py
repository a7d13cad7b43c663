"""Per-wheel release notes from validation reports: ``<stem>.report.json`` -> ``<stem>.md`` plus
the speed-up chart ``<stem>.speedup.svg`` beside it.

    nox -s notes
    python -m scripts.factory.notes [REPORT ...] [--check]

A note is structured like shared/seeds/sm75-turing-release-notes.txt and states only what its own
report shows: a Windows wheel's note never carries a Linux run (the report is refused), and a run
of PTX through the driver's JIT is named as such, never as validation on that architecture's
hardware, and names only the code paths whose PTX ran (a multi-SM wheel's others are stated as not
verified). Limitations come from the kernel family table and capability table the report carries
(the wheel's own), falling back to the checkout's sageattention/native/families.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from packaging.version import Version

from scripts.factory import chart as charts
from scripts.factory import report as reports
from scripts.factory.labels import LocalLabel, expectation

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / "release_notes"
FAMILIES_JSON = REPO / "sageattention" / "native" / "families.json"
NOTE_SUFFIX = ".md"

# Architecture names by SM, for titles only.
ARCH_NAMES = {75: "Turing", 80: "Ampere", 86: "Ampere", 87: "Ampere (Orin)",
              89: "Ada Lovelace", 90: "Hopper", 100: "Blackwell", 103: "Blackwell",
              110: "Blackwell (Thor)", 120: "Blackwell", 121: "Blackwell"}
OP_DESCRIPTIONS = {"qk_int8_pv_fp16": "INT8 QK, FP16 PV", "qk_int8_pv_fp8": "INT8 QK, FP8 PV"}
_OS_NAMES = {"Linux": "Linux", "Windows": "Windows", "Darwin": "macOS"}
NOTE_ENVIRONMENT = ("os", "python", "torch", "cuda_runtime", "driver")
MICROBENCHMARK_CAVEAT = ("These are attention-kernel microbenchmarks and should NOT be interpreted "
                         "as equivalent end-to-end application speedups.")


def note_filename(wheel_filename: str) -> str:
    return reports.wheel_stem(wheel_filename) + NOTE_SUFFIX


def _sms(report: dict) -> list[tuple[int, bool]]:
    """(SM, embeds PTX) for each target of the wheel, from its build info or its local label."""
    parse_target = expectation().parse_target
    info = report.get("build_info") or {}
    if info.get("sm_targets"):
        return [(t.sm, t.ptx) for t in map(parse_target, info["sm_targets"])]
    _, version, _, _ = reports.parse_wheel_name(report["wheel"]["filename"])
    try:
        return [(sm, False) for sm in LocalLabel.parse(version.local or "").sms]
    except ValueError:
        return []  # not a factory label: the note says "unknown SM"


def _sm_title(sm: int) -> str:
    return f"SM{sm}/{ARCH_NAMES.get(sm, 'unknown architecture')}"


def _enumerate(words: list[str], conjunction: str) -> str:
    """'A', 'A and B', 'A, B and C'."""
    return words[0] if len(words) == 1 else \
        f"{', '.join(words[:-1])} {conjunction} {words[-1]}"


def _arch_names(sms: list[tuple[int, bool]]) -> list[str]:
    """The architectures of the wheel's SMs, each once, in SM order (sm80 and sm86: Ampere)."""
    names = [ARCH_NAMES.get(sm, f"SM{sm}") for sm, _ in sorted(sms)]
    return list(dict.fromkeys(names))


def _gpu_capability_sm(env: dict) -> int:
    major, minor = env["compute_capability"].split(".")  # validated: '8.6'
    return int(major) * 10 + int(minor)


def _sass_that_ran(sms: list[tuple[int, bool]], gpu_sm: int) -> int | None:
    """The wheel's SM target whose SASS a native run executed: of the targets whose SASS runs on
    the GPU (the suite's rule, sass_runs_on), the newest, which the CUDA loader picks; None when
    the report names no target."""
    fits = [sm for sm, _ in sms if expectation().sass_runs_on(sm, gpu_sm)]
    return max(fits) if fits else None


def _ptx_that_ran(report: dict, ran: list[str],
                  sms: list[tuple[int, bool]]) -> tuple[list[str], list[int]]:
    """The PTX a PTX-JIT run compiled (['compute_75']) and its SMs ([75]): the ptx_arch of the
    expected native backends that ran in a check (all expected ones when none is seen to run;
    every SM the wheel targets when the report names no PTX). Only these code paths were checked,
    not every SM the wheel targets (an sm75+sm80 wheel on an sm_90 GPU runs only its compute_75
    PTX there)."""
    expected = [b for b in (report.get("expectation") or {}).get("native_backends") or []
                if b.get("ptx_arch")]
    seen = [b for b in expected if b.get("name") in ran] or expected
    arches = sorted({b["ptx_arch"] for b in seen})
    ptx_sms = sorted({int(m[1]) for a in arches if (m := re.match(r"compute_(\d+)", a))})
    return arches, ptx_sms or [sm for sm, _ in sms]


def _timer_name(report: dict) -> str:
    """The timer of the performance figures. benchmark.cuda_timer uses triton.testing.do_bench
    when Triton imports and CUDA events otherwise; performance.method names both alternatives,
    so the run's environment.triton (its Triton, or null) says which one timed this run."""
    if report["environment"].get("triton"):
        return "`triton.testing.do_bench`"
    return "CUDA-event timings without Triton"  # the report's method: "CUDA events without Triton"


def _families(report: dict) -> dict:
    fams = report.get("families")
    if isinstance(fams, dict) and fams and all(isinstance(v, dict) for v in fams.values()):
        return fams
    table = json.loads(FAMILIES_JSON.read_text(encoding="utf-8"))["families"]
    wanted = (report.get("build_info") or {}).get("families") or list(table)
    return {f: table[f] for f in wanted if f in table}


def _backend_name(family: str, op: str) -> str:
    return expectation().backend_name(family, op)


def _figures(err: dict | None) -> str:
    if not err:
        return "-", "-", "-"
    if not err.get("finite", True):
        return "NaN/Inf", "-", "-"
    return (f"{err['cosine']:.6f}" if err.get("cosine") is not None else "-",
            f"{err['rel_l1']:.4f}" if err.get("rel_l1") is not None else "-",
            f"{err['max_abs']:.3g}" if err.get("max_abs") is not None else "-")


def _wheel_facts(report: dict) -> dict:
    name = report["wheel"]["filename"]
    _, version, _, tags = reports.parse_wheel_name(name)
    tag = sorted(tags, key=str)[0]
    return {"version": version, "python_tag": tag.interpreter, "platform": tag.platform,
            "os": reports.wheel_os(name) or "unknown OS"}


def _not_verified_verdict(report: dict) -> str | None:
    """The sentence a note states wherever it would otherwise say "verified" (None when the run
    validates the wheel): a run with a failed check, with no passed check, or whose passes did not
    run the wheel's CUDA kernels (reports.unproven, the rule the release applies) verified nothing
    as a whole, and scripts.factory.release does not publish its wheel."""
    failed = [c["name"] for c in report["checks"] if c["status"] == "fail"]
    if failed:
        return (f"**Validation FAILED: {len(failed)} check(s) failed** ({'; '.join(failed)}). "
                "This wheel is not verified for any configuration and is not published "
                "(`scripts.factory.release` refuses a wheel with a failed check); the figures "
                "below describe the failed run only.")
    unproven = reports.unproven(report["checks"], reports.own_backends(report))
    if not unproven:
        return None
    return (f"**Not validated: {'; '.join(unproven)}.** This wheel is not verified for any "
            "configuration and is not published (`scripts.factory.release` refuses such a "
            "report); the figures below describe this run only.")


def render(report: dict, source_name: str) -> str:
    """The Markdown note for one report (``source_name``: the report's file name)."""
    env = report["environment"]
    wheel = report["wheel"]
    facts = _wheel_facts(report)
    info = report.get("build_info") or {}
    sms = _sms(report)
    ptx = report["execution"] == "ptx-jit"
    gpu_sm = env.get("gpu_sm") or "sm" + env["compute_capability"].replace(".", "")
    gpu = f"{env['gpu_name']} ({gpu_sm.replace('sm', 'sm_')})"
    os_name = _OS_NAMES.get(facts["os"], facts["os"])
    sm_title = ", ".join(_sm_title(sm) for sm, _ in sms) or "unknown SM"
    torch_release = Version(info.get("torch") or env.get("torch", "0"))
    torch_v = f"{torch_release.major}.{torch_release.minor}"
    cuda_v = info.get("cuda") or env.get("cuda_runtime") or "?"
    families = _families(report)
    perf = report.get("performance") or {}
    out: list[str] = []
    add = out.append

    add(f"<!-- Generated by scripts/factory/notes.py from {source_name}; do not edit by hand. "
        f"Regenerate: nox -s notes (or python -m scripts.factory.notes). -->")
    add(f"# SageAttention {facts['version'].base_version} {sm_title} — Torch {torch_v} + "
        f"CUDA {cuda_v} — {os_name}")
    add("")
    add(f"Wheel: `{wheel['filename']}`  ")
    add(f"Validation report: [`{source_name}`]({source_name}) (sha256-bound to the wheel)")
    add("")
    add("Linux and Windows wheels are platform-specific. Install only the wheel that matches your "
        "operating system, Python version, PyTorch version, and CUDA stack.")
    add("")
    verdict = _not_verified_verdict(report)
    if verdict:
        add(verdict)
        add("")

    add("## What this build is")
    add("")
    add("This is NOT an unmodified upstream SageAttention 2.2 build. It is this project's own "
        "implementation of the SageAttention 2 algorithm behind the SageAttention 2.2 public "
        "API, with:")
    add("")
    for family, spec in families.items():
        ops = ", ".join(f"`{_backend_name(family, op)}` ({OP_DESCRIPTIONS.get(op, op)})"
                        for op in spec.get("ops", []))
        add(f"- native kernel family `{family}`: {ops}; head dims "
            f"{', '.join(map(str, spec.get('head_dims', [])))}; qk_quant_gran "
            f"{', '.join(spec.get('qk_quant_gran', []))}; pv_accum_dtype "
            f"{', '.join(spec.get('pv_accum_dtype', []))}")
    add("- the public `sageattn()` dispatcher, Triton kernels where the GPU supports them, and a "
        "correctness-first PyTorch SDPA fallback for calls no kernel handles")
    add("- FP16 and BF16 inputs")
    add("")
    built = [f"SM targets {', '.join(info.get('sm_targets', [])) or '?'}"]
    if info.get("compilers"):
        built.append("compilers " + ", ".join(f"{k} {v}" for k, v in info["compilers"].items()))
    for key, label in (("git_commit", "commit"), ("build_date", "built"), ("cell_id", "cell")):
        if info.get(key):
            built.append(f"{label} {info[key]}")
    add("Build: " + "; ".join(built) + ".")
    add("")

    add(f"## Verified environment ({os_name})")
    add("")
    for line in (f"{os_name} {env.get('machine', '')} ({env.get('os_release', '?')})",
                 f"{env.get('python_implementation', 'CPython')} {env.get('python', '?')}",
                 f"PyTorch {env.get('torch', '?')}",
                 f"PyTorch CUDA runtime: {env.get('cuda_runtime', '?')}",
                 f"NVIDIA driver: {env.get('driver') or 'not reported'}",
                 f"Triton: {env.get('triton') or 'not installed'}",
                 f"Validated GPU: {env['gpu_name']}",
                 f"Compute capability: {env['compute_capability']} ({gpu_sm.upper()})",
                 f"Date: {env.get('date', '?')}"):
        add(f"- {line}")
    add("")
    ran = sorted({b for c in report["checks"] for b in reports.ran_backends(c)})
    verdict = _not_verified_verdict(report)
    # A validated run verifies only the code paths whose PTX ran in a check that passed: one that
    # ran only in a skipped or failed check is not verified. (A run that validates nothing names
    # what ran; its verdict says it verified nothing.)
    passed = sorted({b for c in report["checks"] if c["status"] == "pass"
                     for b in reports.ran_backends(c)})
    ran_ptx = _ptx_that_ran(report, ran, sms) if ptx else ([], [])
    ptx_arch, ptx_sms = ran_ptx if verdict or not ptx else _ptx_that_ran(report, passed, sms)
    unpassed_sms = [sm for sm in ran_ptx[1] if sm not in ptx_sms]
    own = reports.own_backends(report)
    if not any(b in own if own else reports.is_native_kernel(b) for b in ran):
        # the execution the report names is how the wheel's kernels would run here; none did
        add(f"**Execution: none of the wheel's CUDA kernels ran.** No check of this run ran one "
            f"on the {gpu} (backends that ran: {', '.join(ran) or 'none'}), so nothing below "
            f"says anything about them.")
    elif ptx:
        ptx_name = ", ".join(ptx_arch) or "embedded"
        # the architectures whose PTX ran (compute_75: Turing), each once
        archs = _arch_names([(sm, True) for sm in ptx_sms])
        code = (f"the {_enumerate(archs, 'and')} code path{'s' if len(archs) > 1 else ''}"
                if archs else "the wheel's code path")
        hardware = f"{_enumerate(archs, 'or')} hardware" if archs else "its target hardware"
        unpassed = [a for a in _arch_names([(sm, True) for sm in unpassed_sms])
                    if a not in archs]
        idle = [a for a in _arch_names(sms) if a not in archs and a not in unpassed]
        add(f"**Execution: PTX JIT.** {'Run' if verdict else 'Validated'} on the {gpu} by running "
            f"the {ptx_name} PTX through the driver's JIT; this checks {code}, not {hardware}. "
            f"No result below was "
            f"measured on an {' or '.join(f'SM{sm}' for sm, _ in sms) or 'SM target'} GPU."
            + (f" The wheel's {_enumerate(unpassed, 'and')} code ran only in checks that did not "
               "pass (skipped or failed) and is not verified." if unpassed else "")
            + (f" The wheel's {_enumerate(idle, 'and')} code did not run in this validation and "
               "is not verified." if idle else ""))
    else:
        # name the wheel's target whose SASS ran, not the GPU's SM (sm80 SASS runs on an 8.6 GPU)
        sass = _sass_that_ran(sms, _gpu_capability_sm(env))
        where = f"on the {env['gpu_name']} (compute capability {env['compute_capability']})"
        add(f"**Execution: native.** The kernels ran as compiled machine code: the wheel's "
            f"sm_{sass} SASS {where}." if sass is not None else
            f"**Execution: native.** The kernels ran as compiled machine code (SASS) {where}; "
            f"the report does not name the wheel's SM targets.")
    add("")

    _validation_section(report, gpu, ptx, add)
    _performance_section(report, perf, ptx, gpu, add)
    _accuracy_section(report, add)
    _limitations_section(report, sms, families, add)
    _compatibility_section(report, facts, os_name, sms, gpu, ptx, ptx_sms, add, unpassed_sms)

    add("## Wheel")
    add("")
    add(f"`{wheel['filename']}`")
    add("")
    add(f"sha256 `{wheel['sha256']}`")
    add("")
    add("```")
    add(f"pip install {wheel['filename']}")
    add("```")
    add("")
    add(f"_Generated from `{source_name}` by `scripts/factory/notes.py`. Regenerate with "
        f"`nox -s notes` or `python -m scripts.factory.notes`._")
    return "\n".join(out) + "\n"


def _validation_section(report, gpu, ptx, add) -> None:
    checks = report["checks"]
    counts = {s: sum(c["status"] == s for c in checks) for s in ("pass", "fail", "skip")}
    add("## Verified validation")
    add("")
    where = f"by PTX JIT on the {gpu}" if ptx else f"on the {gpu}"
    add(f"Run {where} with `{report.get('run', {}).get('command', '?')}`: {counts['pass']} "
        f"passed, {counts['fail']} failed, {counts['skip']} skipped of {len(checks)} checks. "
        f"Error figures are against fp32 PyTorch SDPA on the same inputs (masked checks: with "
        f"the same mask).")
    add("")
    elsewhere = _backends_not_on_targets(report)
    for c in checks:
        backend = f" ({c['backend']})" if c.get("backend") else ""
        reason = f": {c['reason']}" if c["status"] != "pass" and c.get("reason") else ""
        foreign = [b for b in reports.ran_backends(c) if b in elsewhere]
        if foreign:
            reason += "".join(f"; `{b}` does not run on {elsewhere[b]}: its part of this "
                              f"result says nothing about {elsewhere[b]}" for b in foreign)
        add(f"- {c['name']}: {c['status'].upper()}{backend}{reason}")
    add("")
    verdict = _not_verified_verdict(report)
    if verdict:
        add(verdict)
    elif counts["pass"]:
        add("All checks that ran passed." + (" Skipped checks were not run and are not "
                                             "verified." if counts["skip"] else ""))
    add("")
    add("| Check | Result | Backend that ran | Cosine (min) | Rel. L1 (max) | Max abs |")
    add("|---|---|---|---|---|---|")
    for c in checks:
        cos, l1, mx = _figures(c.get("errors"))
        add(f"| {c['name']} | {c['status'].upper()} | {c.get('backend') or '-'} | {cos} | {l1} "
            f"| {mx} |")
    add("")


def _backends_not_on_targets(report: dict) -> dict[str, str]:
    """Backends that ran in the checks but, by the report's capability table, run on none of the
    wheel's SMs (the Triton kernels, compute capability 8.0+, on an sm75 wheel validated on a
    newer GPU): backend -> the SMs, e.g. 'SM75'. A pass on them says nothing about those SMs."""
    sms = [sm for sm, _ in _sms(report)]
    table = report.get("backends_table") if isinstance(report.get("backends_table"), list) else []
    out = {}
    for row in table:
        low = row.get("min_capability") if isinstance(row, dict) else None
        if isinstance(low, list) and len(low) == 2 and sms and \
                all(sm < low[0] * 10 + low[1] for sm in sms):
            out[row.get("name")] = "/".join(f"SM{sm}" for sm in sms)
    return out


def _performance_section(report, perf, ptx, gpu, add) -> None:
    add("## Performance")
    add("")
    cases = perf.get("cases") or []
    if not cases:
        why = perf.get("error") or perf.get("skipped") or "the run had no performance section"
        add(f"No performance figures in this report ({why}).")
        add("")
        return
    geo = perf.get("geomean_speedup_vs_sdpa")
    speeds = [c["speedup_vs_sdpa"] for c in cases if c.get("speedup_vs_sdpa") is not None]
    rounds = perf.get("rounds") or 1
    timer = perf.get("timer") or {}
    add(f"Measured on the {gpu}, end to end (quantization included), against PyTorch SDPA's "
        f"default backend on the same inputs in the same process; median of "
        f"{_timer_name(report)}"
        + (f" (each timing after {timer['warmup_ms']:g} ms of warm-up, over {timer['rep_ms']:g} ms)"
           if timer.get("warmup_ms") is not None and timer.get("rep_ms") is not None else "")
        + (f", then the median of {rounds} interleaved rounds" if rounds > 1 else "")
        + "; TOPS = 4·b·h·n²·d / time (halved for causal).")
    add("")
    if speeds:
        add(f"- {min(speeds):.2f}x to {max(speeds):.2f}x speed-up over SDPA across "
            f"{len(speeds)} cases")
    add(f"- geometric-mean speed-up: {geo:.2f}x" if geo is not None else
        "- geometric-mean speed-up: not available (some cases did not run)")
    for name, value in (perf.get("geomean_speedup_vs_sdpa_by_backend") or {}).items():
        add(f"- `{name}` forced: " + (f"{value:.2f}x geometric mean" if value else "did not run"))
    on_sdpa = sum(1 for c in cases if c.get("backend") == "sdpa")
    if on_sdpa:
        add(f"- in {on_sdpa} of {len(cases)} cases `sageattn` ran PyTorch SDPA itself (the GPU's "
            "calibration table measured it faster there); the quantized kernels' own speed is in "
            "the forced lines above")
    for name in sorted({c.get("backend") for c in cases} - {None, "sdpa"}):
        if name.startswith("triton-"):
            n = sum(1 for c in cases if c.get("backend") == name)
            add(f"- in {n} of {len(cases)} cases `sageattn` ran the Triton kernel `{name}` (the "
                "GPU's calibration table measured it fastest there)")
    add("")
    add(MICROBENCHMARK_CAVEAT)
    if ptx:
        add("These figures come from PTX JIT-compiled for the validating GPU; they say nothing "
            "about speed on the architecture the wheel targets.")
    add("")
    add(f"![Speed-up vs SDPA per case]({charts.chart_filename(report['wheel']['filename'])})")
    add("")
    add("| Case | SDPA TOPS | sageattn TOPS | Speed-up | Backend |")
    add("|---|---|---|---|---|")
    for c in cases:
        def num(x, f):
            return format(x, f) if isinstance(x, (int, float)) else "-"
        add(f"| {c.get('name')} | {num(c.get('sdpa_tops'), '.1f')} | "
            f"{num(c.get('sageattn_tops'), '.1f')} | "
            f"{num(c.get('speedup_vs_sdpa'), '.2f') + 'x' if c.get('speedup_vs_sdpa') else '-'}"
            f" | {c.get('backend') or c.get('error') or '-'} |")
    add("")


def _accuracy_section(report, add) -> None:
    add("## Numerical accuracy")
    add("")
    acc = report.get("accuracy") or {}
    if not acc:
        add("This report has no accuracy summary.")
    for backend, a in acc.items():
        add(f"- `{backend}`: cosine similarity at least {a['min_cosine']:.6f} (median "
            f"{a['median_cosine']:.6f}) and relative L1 error at most {a['max_rel_l1']:.4f} "
            f"(median {a['median_rel_l1']:.4f}) against fp32 SDPA over {a['cases']} "
            f"normal-input comparisons.")
    pacc = (report.get("performance") or {}).get("accuracy") or {}
    if pacc.get("min_cosine") is not None:
        add(f"- On the benchmark cases: cosine at least {pacc['min_cosine']:.6f}, relative L1 at "
            f"most {pacc['max_rel_l1']:.4f}.")
    masked = sorted({b for c in report["checks"] if "mask" in c["name"].lower()
                     and "unmasked" not in c["name"].lower() for b in reports.ran_backends(c)})
    if masked:
        add(f"- Attention-mask calls ran on: {', '.join(f'`{b}`' for b in masked)}"
            + (" (the correctness-first PyTorch SDPA fallback)." if masked == ["sdpa"] else "."))
    add("")
    add("Bars (design): INT8 QK + FP16 PV cosine >= 0.9998, relative L1 <= 0.02; INT8 QK + FP8 PV "
        "cosine >= 0.9993, relative L1 <= 0.04.")
    add("")


def _native_head_dims_line(table, serving, dims) -> str:
    """What the validated wheel's dispatcher does with head dims: its backends table says whether
    it runs the ones between the kernels' widths zero-padded (head_dims {"min", "max"} beside
    kernel_head_dims); a wheel whose table does not say so sent them elsewhere."""
    rows = [row for row in table if isinstance(row, dict) and row.get("kind") == "native"
            and row.get("family") in serving]
    spans = [row.get("head_dims") for row in rows]
    if rows and all(isinstance(s, dict) and isinstance(s.get("min"), int)
                    and isinstance(s.get("max"), int) and row.get("kernel_head_dims")
                    for s, row in zip(spans, rows)):
        low, high = min(s["min"] for s in spans), max(s["max"] for s in spans)
        return (f"- Native head dimensions: kernels for {', '.join(map(str, dims))}; head dims "
                f"{low} to {high} run on the next of them with zero-padded Q, K and V; larger "
                f"head dims use the Triton or SDPA path.")
    return (f"- Native head dimensions: {', '.join(map(str, dims))}; other head dims use the "
            f"Triton or SDPA path.")


def _limitations_section(report, sms, families, add) -> None:
    table = report.get("backends_table") if isinstance(report.get("backends_table"), list) else []
    for sm, _ in sms:
        tag = f"sm{sm}"
        add(f"## Known SM{sm} limitations")
        add("")
        serving = {f: s for f, s in families.items() if tag in s.get("serves", [])}
        if not serving:
            add(f"- No native kernel family of this build serves SM{sm}.")
            add("")
            continue
        ops = {op for s in serving.values() for op in s.get("ops", [])}
        grans = {g for s in serving.values() for g in s.get("qk_quant_gran", [])}
        accums = sorted({a for s in serving.values() for a in s.get("pv_accum_dtype", [])})
        dims = sorted({d for s in serving.values() for d in s.get("head_dims", [])})
        if "qk_int8_pv_fp8" not in ops:
            add(f"- Native FP8 attention (INT8 QK + FP8 PV) is not supported on SM{sm} in this "
                f"build.")
        if "per_thread" not in grans:
            add(f"- `qk_quant_gran=\"per_thread\"` is not supported by the native SM{sm} path; "
                f"it uses {', '.join(sorted(grans))}.")
        add(f"- Native PV accumulation: {', '.join(accums)}.")
        add(_native_head_dims_line(table, serving, dims))
        add("- The native kernels take no attention mask: masked calls use the Triton mask "
            "kernels where the GPU supports them, else the PyTorch SDPA fallback.")
        limits = {row.get("max_batch_and_heads") for row in table
                  if isinstance(row, dict) and row.get("kind") != "sdpa"} - {None}
        if limits:  # CUDA's grid limit (sageattention/backends.py, MAX_GRID_YZ)
            add(f"- The quantized kernels take at most {min(limits)} batch entries and at most "
                f"as many query heads; larger calls run on the PyTorch SDPA fallback.")
        for row in table:
            low = row.get("min_capability") if isinstance(row, dict) else None
            if row.get("kind") == "triton" and isinstance(low, list) and len(low) == 2 \
                    and sm < low[0] * 10 + low[1]:
                add(f"- The Triton backend `{row.get('name', '?')}` needs compute capability "
                    f"{low[0]}.{low[1]} or newer; it does not run on SM{sm}.")
        add("")


def _compatibility_section(report, facts, os_name, sms, gpu, ptx, ptx_sms, add,
                           unpassed_sms=()) -> None:
    env = report["environment"]
    add(f"## {os_name} compatibility")
    add("")
    verdict = _not_verified_verdict(report)
    if verdict:
        add(verdict)
        add("")
        add("The failed run was made on:" if any(c["status"] == "fail" for c in report["checks"])
            else "The run was made on:")
    else:
        add(f"Treat this {os_name} wheel as verified only for:")
    add("")
    add(f"- {os_name} {facts['platform']}")
    add(f"- {env.get('python_implementation', 'CPython')} {env.get('python', '?')} "
        f"(wheel tag {facts['python_tag']})")
    add(f"- PyTorch {env.get('torch', '?')}")
    add(f"- CUDA {env.get('cuda_runtime', '?')}")
    if ptx:
        names = ", ".join(_sm_title(sm) for sm in ptx_sms)
        add(f"- the {names} code path as PTX JIT-compiled on the {gpu}; NOT verified on "
            f"{names} hardware")
        unpassed = [_sm_title(sm) for sm, _ in sms if sm in unpassed_sms and sm not in ptx_sms]
        if unpassed:
            add(f"- NOT verified: the {', '.join(unpassed)} code (it ran only in checks that did "
                "not pass)")
        idle = [_sm_title(sm) for sm, _ in sms if sm not in ptx_sms and sm not in unpassed_sms]
        if idle:
            add(f"- NOT verified at all: the {', '.join(idle)} code (it did not run)")
    else:
        add(f"- {gpu}")
    add("")
    add("Compatibility with other Python versions, PyTorch versions, CUDA versions, operating "
        "systems, or GPU architectures should NOT be assumed unless separately tested.")
    add("")
    if facts["os"] == "Windows":
        add("This is a Windows wheel and these results come from its own run on Windows. Linux "
            "results do not apply to it, and Linux wheels are not interchangeable with it.")
    elif facts["os"] == "Linux":
        add("Windows wheels are separate builds and are NOT interchangeable with this Linux wheel. "
            "Do NOT install this wheel on Windows, and do NOT assume this Linux validation "
            "covers a Windows build: each Windows wheel carries its own report.")
    add("")


def generate(report_path: Path, out_dir: Path | None = None) -> tuple[Path, Path, str, str]:
    """Load one report; return (note path, chart path, note text, chart text) without writing."""
    doc = reports.load_report(report_path)
    # A note states what the wheel is verified for (OS, Python, torch, CUDA, driver of the run):
    # from a report that does not record them it would state '?' or, without the OS, skip the
    # rule that a Windows wheel never carries a Linux run.
    missing = [k for k in NOTE_ENVIRONMENT if not doc["environment"].get(k)]
    if missing:
        raise reports.ReportError(f"{report_path}: environment lacks {', '.join(missing)}; a "
                                  "note states only what its report recorded: validate again")
    reports.check_report_name(report_path, doc)
    out_dir = out_dir or report_path.parent
    return (out_dir / note_filename(doc["wheel"]["filename"]),
            out_dir / charts.chart_filename(doc["wheel"]["filename"]),
            render(doc, report_path.name), charts.speedup_svg(doc, report_path.name))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m scripts.factory.notes",
        description="Write <stem>.md and <stem>.speedup.svg beside each <stem>.report.json "
                    "(default: every report in release_notes/).",
        epilog="exit codes: 0 written (with --check: all up to date); 1 --check found a note or "
               "chart missing or out of date; 2 a report is missing or invalid (nothing "
               "written), bad arguments, or a note or chart could not be written")
    p.add_argument("reports", nargs="*", type=Path, help="report files (default: all in "
                                                         "release_notes/)")
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                   help="where to look for reports when none are named (default: release_notes/)")
    p.add_argument("--out-dir", type=reports.output_dir,
                   help="write here instead of beside each report")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if any note or chart is missing or out of date")
    args = p.parse_args(argv)
    if args.reports and args.dir != DEFAULT_DIR:
        p.error("--dir is where to look for reports when none are named; name the report files "
                "or --dir, not both")
    if not args.reports and not args.dir.is_dir():
        print(f"error: --dir {args.dir} is not a folder; name the folder of the "
              f"{reports.REPORT_SUFFIX} files (default: {DEFAULT_DIR})", file=sys.stderr)
        return 2
    paths = args.reports or sorted(args.dir.glob("*" + reports.REPORT_SUFFIX))
    if not paths:
        orphans = _orphans(args.out_dir or args.dir, set()) if args.check else []
        if orphans:
            print("out of date (their report is gone; delete them or restore the report): "
                  + ", ".join(map(str, orphans)), file=sys.stderr)
            return 1
        print(f"no reports ({reports.REPORT_SUFFIX}) in {args.dir}: nothing to do")
        return 0
    stale, generated = [], []
    for path in paths:  # every report is read before the first note is written
        try:
            generated.append(generate(path, args.out_dir))
        except reports.ReportError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    try:
        reports.refuse_shared_targets([g[0] for g in generated])
        reports.refuse_folder_targets([t for g in generated for t in g[:2]])
    except reports.ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note_path, chart_path, note, svg in generated:
        for target, text in ((note_path, note), (chart_path, svg)):
            if args.check:
                if not target.exists() or target.read_text(encoding="utf-8", errors="replace") != text:
                    stale.append(target)
            else:
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    reports.atomic_write_text(target, text)
                except OSError as exc:  # a read-only folder or a full disk: no traceback
                    print(f"error: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
                    return 2
                print(f"wrote {target}")
    # Scanning a folder, --check also finds the notes and charts there whose report is gone: a
    # note states a run; without its report nothing backs what it says.
    orphans = (_orphans(args.out_dir or args.dir, {t for g in generated for t in g[:2]})
               if args.check and not args.reports else [])
    if orphans:
        print("out of date (their report is gone; delete them or restore the report): "
              + ", ".join(map(str, orphans)), file=sys.stderr)
    if stale:
        print("out of date (run nox -s notes): " + ", ".join(map(str, stale)), file=sys.stderr)
    return 1 if stale or orphans else 0


_NOTE_HEADER = "<!-- Generated by scripts/factory/notes.py from "


def _orphans(folder: Path, expected: set[Path]) -> list[Path]:
    """The generated notes and speed-up charts in ``folder`` that no report there generates."""
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        if path in expected or not path.is_file():
            continue
        if path.name.endswith(charts.CHART_SUFFIX):
            found.append(path)
        elif path.name.endswith(NOTE_SUFFIX):
            try:
                with path.open(encoding="utf-8", errors="replace") as fh:
                    head = fh.read(len(_NOTE_HEADER))
            except OSError:
                continue
            if head == _NOTE_HEADER:
                found.append(path)
    return found


if __name__ == "__main__":
    sys.exit(main())
