"""Which bad calls of a family's raw attention op raise cleanly, and which kill the process.

Each case runs in a child process (a crash must not end the survey) and prints the child's exit
status with the first line of the error it raised. Run on a GPU with the families built:

    python benchmarks/gpu_dev_raw_op_errors.py sm80 sm90

Found on the H200 (2026-12-03): the head-dim-96 cases died with SIGSEGV while the others raised;
cuda-gdb put the crash in the number formatting of the TORCH_CHECK message (docs/kernels.md).
"""
from __future__ import annotations

import argparse
import subprocess
import sys

CASES = {
    "same_qqq_hd96": "q=r(64,96); k=v=q",
    "distinct_hd96": "q=r(64,96); k=r(64,96); v=r(64,96)",
    "same_qqq_hd64_inf_scale": "q=r(64,64); k=v=q; SCALE=float('inf')",
    "hd_mismatch": "q=r(64,64); k=r(64,128); v=r(64,128)",
    "hd96_cpu": "q=r(64,96).cpu(); k=v=q",
    "bad_layout": "q=r(64,64); k=v=q; LAYOUT='XYZ'",
}
CHILD = """
import sys, torch
import sageattention.native as native
fam = sys.argv[1]
native.family_module(fam).load()
def r(n, d): return torch.randn(1, 2, n, d, device="cuda", dtype=torch.float16)
SCALE = 0.1; LAYOUT = "HND"
{setup}
try:
    getattr(torch.ops, "sageattention_" + fam).qk_int8_pv_fp16(
        q, k, v, LAYOUT, False, SCALE, "per_warp", "fp32", True, False)
except RuntimeError as exc:
    print("RAISED", str(exc).splitlines()[0][:150])
else:
    print("RETURNED")
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=["sm80", "sm90"],
                        help="families with a qk_int8_pv_fp16 op (default: sm80 sm90)")
    args = parser.parse_args(argv)
    crashed = 0
    for fam in args.families:
        for name, setup in CASES.items():
            res = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup), fam],
                                 capture_output=True, text=True, timeout=120)
            crashed += res.returncode < 0
            said = res.stdout.strip() or res.stderr.strip()[-300:]
            print(f"{fam} {name}: exit {res.returncode}: {said}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
