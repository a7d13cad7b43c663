"""Where one kernel's warps stall, per SASS instruction, from Nsight Compute's source page.

    ncu --clock-control none -k regex:attn_wgmma -c 1 --section SourceCounters -o rep python3 ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > src.csv
    python benchmarks/ncu_source_summary.py src.csv [--top 40] [--bucket 48]

Prints the sampled columns it found, the instructions with the most warp-stall samples (with
each one's stall reasons where the CSV has them), the samples per opcode, and the samples along
the kernel in buckets of consecutive instructions (to find the softmax, the products and the
epilogue by their opcodes). Runs anywhere: it only reads the CSV.
"""
from __future__ import annotations

import argparse
import collections
import csv
import re
import sys
from pathlib import Path

ALL_SAMPLES = "Warp Stall Sampling (All Samples)"
NOT_ISSUED = "Warp Stall Sampling (Not-issued Samples)"


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The source page's header and rows (ncu may print notes before the header)."""
    lines = path.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if '"Source"' in line or line.startswith("Address")), None)
    if start is None:
        raise SystemExit(f"{path}: no header row with a \"Source\" column (is this `--page source --csv`?)")
    reader = csv.DictReader(lines[start:])
    rows = [row for row in reader if row.get("Source")]
    return list(reader.fieldnames or []), rows


def opcode(sass: str) -> str:
    """The instruction's opcode: its first word after an optional predicate (@P0, @!PT)."""
    words = sass.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";") if words else "?"


def summarize(path: Path, top: int, bucket: int) -> str:
    fields, rows = read_rows(path)
    numeric = [f for f in fields if f not in ("Address", "Source", "#")
               and any(_number(r.get(f, "")) is not None for r in rows[:200])]
    samples_col = ALL_SAMPLES if ALL_SAMPLES in fields else next(
        (f for f in numeric if "Sampling" in f and "All" in f), None)
    if samples_col is None:
        return f"columns: {fields}\nno warp-stall sampling column: run ncu with --section SourceCounters\n"
    # per-reason columns: sampled stall reasons ("stall_*" or "... Stall ...") other than the totals
    reasons = [f for f in numeric if f not in (samples_col, NOT_ISSUED)
               and re.search(r"stall", f, re.IGNORECASE)]
    samples = [_number(r.get(samples_col, "")) or 0.0 for r in rows]
    total = sum(samples) or 1.0
    out = [f"{path.name}: {len(rows)} SASS lines, {total:.0f} warp-stall samples ({samples_col})",
           f"numeric columns: {', '.join(numeric)}", ""]

    out.append(f"top {top} instructions by samples (index, address, % of samples, instruction"
               + (", top reasons" if reasons else "") + "):")
    order = sorted(range(len(rows)), key=lambda i: -samples[i])[:top]
    for i in sorted(order):
        row = rows[i]
        line = f"{i:5d} {row.get('Address', ''):>8} {100 * samples[i] / total:6.2f}%  {row['Source'].strip()[:70]}"
        if reasons:
            top_r = sorted(((_number(row.get(f, "")) or 0.0, f) for f in reasons), reverse=True)[:3]
            line += "  [" + ", ".join(f"{f} {v:.0f}" for v, f in top_r if v > 0) + "]"
        out.append(line)

    out += ["", "samples per opcode (% of all):"]
    per_op: dict[str, float] = collections.defaultdict(float)
    count_op: dict[str, int] = collections.defaultdict(int)
    for row, s in zip(rows, samples):
        per_op[opcode(row["Source"])] += s
        count_op[opcode(row["Source"])] += 1
    for op, s in sorted(per_op.items(), key=lambda kv: -kv[1])[:25]:
        out.append(f"  {op:<28} {100 * s / total:6.2f}%  ({count_op[op]} instructions)")

    if reasons:
        out += ["", "samples per reason (% of all):"]
        for f in sorted(reasons, key=lambda f: -sum(_number(r.get(f, "")) or 0.0 for r in rows)):
            s = sum(_number(r.get(f, "")) or 0.0 for r in rows)
            if s:
                out.append(f"  {f:<50} {100 * s / total:6.2f}%")

    out += ["", f"along the kernel, {bucket} instructions a bucket (first index, % of samples, most sampled opcodes):"]
    for b0 in range(0, len(rows), bucket):
        chunk = range(b0, min(b0 + bucket, len(rows)))
        s = sum(samples[i] for i in chunk)
        if s < 0.002 * total:
            continue
        ops: dict[str, float] = collections.defaultdict(float)
        for i in chunk:
            ops[opcode(rows[i]["Source"])] += samples[i]
        top_ops = sorted(ops.items(), key=lambda kv: -kv[1])[:4]
        out.append(f"  {b0:5d} {100 * s / total:6.2f}%  " + " ".join(f"{op}:{100 * v / total:.1f}" for op, v in top_ops))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, help="ncu -i REPORT --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=40, help="instructions to list (default 40)")
    parser.add_argument("--bucket", type=int, default=48, help="instructions per bucket (default 48)")
    args = parser.parse_args(argv)
    if not args.csv.is_file():
        parser.error(f"{args.csv}: no such file (the CSV of ncu -i REPORT --page source --csv --print-source sass)")
    if args.top < 1 or args.bucket < 1:
        parser.error(f"--top and --bucket must be at least 1, got {args.top} and {args.bucket}")
    sys.stdout.write(summarize(args.csv, args.top, args.bucket))
    return 0


if __name__ == "__main__":
    sys.exit(main())
