"""How well a calibration table picks for shapes it did not measure: each entry left out in turn and
predicted from the others, through the dispatcher's own choice (sageattention.dispatch.choose), for
several neighbour counts of the estimate off the grid (calibration.Table.estimate_from; 1 is the
nearest entry alone). No GPU: it reads the table's measured times only.

    python benchmarks/calibration_holdout.py                      # the packaged sm90.json
    python benchmarks/calibration_holdout.py TABLE.json --neighbours 1 3 4 6

For each count it prints the geometric mean and the lowest of SDPA's measured time over the picked
backend's at the left-out entries, and the entries where that pick measured below --loss (0.97)
times SDPA; last, the same mean with every entry in the table (each decides for itself: the best
the dispatcher can do with its margin).
Every backend the table timed counts as installed; the GPU is the table's capability.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import torch

from sageattention import calibration, dispatch
from sageattention.backends import SDPA
from sageattention.dispatch import Inventory, Request

FAMILIES_ALL = ("sm75", "sm80", "sm89", "sm90", "sm90_fp8")


def request_for(entry: calibration.Entry, capability) -> Request:
    return Request(device_type="cuda", capability=tuple(capability), dtype=calibration.DTYPES[entry.dtype],
                   head_dim=entry.head_dim, batch_heads=entry.batch * entry.heads, seq_q=entry.seq_len,
                   seq_k=entry.case.keys, causal=entry.causal)


# Every family installed: the table's own timings decide which backends compete.
INVENTORY = Inventory(native={f: None for f in FAMILIES_ALL}, triton=(True, "ok"))


def speedup_of_pick(entry: calibration.Entry, table: calibration.Table) -> tuple[str, float | None]:
    """The backend dispatch.choose picks for entry's shape with ``table``, and SDPA's time over that
    backend's as the entry measured them (None where it did not time both)."""
    pick = dispatch.choose(request_for(entry, table.capability), INVENTORY, calibration=table).name
    if entry.time(pick) is None or entry.time(SDPA) is None:
        return pick, None
    return pick, entry.time(SDPA) / entry.time(pick)


def holdout(table: calibration.Table, neighbours: int, loss: float):
    """(speed-ups over SDPA at each left-out entry, [(entry name, pick, speed-up) below loss])."""
    ratios, losses = [], []
    for i, entry in enumerate(table.entries):
        rest = dataclasses.replace(table, entries=table.entries[:i] + table.entries[i + 1:],
                                   estimate_from=neighbours)
        pick, ratio = speedup_of_pick(entry, rest)
        if ratio is None:
            continue   # the left-out entry did not time the pick (or SDPA): nothing to judge
        ratios.append(ratio)
        if ratio < loss:
            losses.append((entry.name, pick, ratio))
    return ratios, losses


def in_table(table: calibration.Table) -> list[float]:
    """Speed-ups over SDPA of the dispatcher's pick at each entry with the entry in the table."""
    ratios = (speedup_of_pick(entry, table)[1] for entry in table.entries)
    return [r for r in ratios if r is not None]


def geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", nargs="?", type=Path, help="a calibration table (default: the packaged sm90.json)")
    p.add_argument("--neighbours", nargs="+", type=int, default=[1, 3, 4, 6], metavar="N",
                   help="neighbour counts to compare (default: 1 3 4 6)")
    p.add_argument("--loss", type=float, default=0.97, help="a pick below this speed-up is a loss (0.97)")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.neighbours):
        p.error(f"--neighbours takes counts of 1 or more, got {args.neighbours}")
    try:
        table = (calibration.load(args.table) if args.table else calibration.for_gpu((9, 0)))
    except (OSError, calibration.CalibrationError) as exc:
        print(f"calibration_holdout: {exc}", file=sys.stderr)
        return 2
    if table is None or len(table.entries) < 2:
        print("calibration_holdout: the table needs two entries or more", file=sys.stderr)
        return 2
    print(f"table: {table.source} ({len(table.entries)} entries, {table.gpu_name}, {table.date}); "
          f"torch {torch.__version__}")
    for n in args.neighbours:
        ratios, losses = holdout(table, n, args.loss)
        said = "; ".join(f"{name} {pick} {r:.2f}x" for name, pick, r in losses) or "none"
        print(f"neighbours {n}: geomean {geomean(ratios):.3f}x, lowest {min(ratios):.2f}x over {len(ratios)} "
              f"entries; below {args.loss}x: {said}")
    print(f"in the table (each entry decides for itself): geomean {geomean(in_table(table)):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
