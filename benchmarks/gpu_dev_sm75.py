"""Dev driver for the sm75 (Turing) kernel family: build, inspect, test and time in one call.

    python benchmarks/gpu_dev_sm75.py --out "$OUT"

1. builds csrc/sm75 as `_kernels_sm75` with only `-gencode arch=compute_75,code=sm_75` and
   `-gencode arch=compute_75,code=compute_75` (torch's JIT builder, in a subprocess);
2. lists the .so's ELF and PTX entries with cuobjdump: sm_75 SASS and compute_75 PTX only;
3. assembles an isolated `sageattention` package (native/sm75.py, families.json, reference.py and
   the .so) so the run does not depend on the rest of a working tree in progress;
4. runs tests/gpu/test_native_sm75.py against it;
5. times the design.md benchmark cases (information only: on a GPU other than Turing the kernels
   run as driver-compiled compute_75 PTX, which says nothing about Turing speed).
Logs go under --out; a short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "csrc" / "sm75"
GENCODE = ["-gencode=arch=compute_75,code=sm_75", "-gencode=arch=compute_75,code=compute_75"]
EXT_NAME = "_kernels_sm75"
# design.md "The benchmark case set": b, h, n, d (x fp16/bf16 x causal/not).
CASES = [
    (4, 32, 4096, 128),
    (1, 32, 16384, 128),
    (4, 32, 4096, 64),
    (1, 32, 16384, 64),
    (8, 32, 1024, 128),
]

BUILD_SNIPPET = """
import sys, torch.utils.cpp_extension as ce
m = ce.load(name={name!r}, sources={sources!r}, extra_include_paths=[{inc!r}],
            extra_cflags=["-O3"], extra_cuda_cflags={cuda_flags!r},
            build_directory={build!r}, verbose=True)
print("SO_PATH=" + m.__file__)
"""


def build(out: Path, build_dir: Path) -> Path:
    build_dir.mkdir(parents=True, exist_ok=True)
    sources = [str(p) for p in sorted(SRC.glob("*.cpp")) + sorted(SRC.glob("*.cu"))]
    cuda_flags = ["-O3", "--expt-relaxed-constexpr", "-Xptxas=-v", *GENCODE]
    code = BUILD_SNIPPET.format(
        name=EXT_NAME, sources=sources, inc=str(SRC), cuda_flags=cuda_flags, build=str(build_dir)
    )
    env = dict(os.environ, MAX_JOBS=str(os.cpu_count() or 4))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    (out / "build.log").write_text(proc.stdout + proc.stderr)
    print(f"[build] rc={proc.returncode} in {time.monotonic() - started:.1f}s", flush=True)
    match = re.search(r"^SO_PATH=(.+)$", proc.stdout, re.M)
    if proc.returncode != 0 or not match:
        print((proc.stdout + proc.stderr)[-6000:])
        raise SystemExit("build failed")
    return Path(match.group(1))


def find_cuobjdump() -> str | None:
    candidates = [shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"]
    try:  # Triton wheels carry their own copy
        import triton

        candidates.append(
            str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
        )
    except ImportError:
        pass
    return next((c for c in candidates if c and Path(c).is_file()), None)


def inspect_binary(so: Path, out: Path) -> dict:
    """ELF and PTX entries embedded in the extension (expect sm_75 ELF + compute_75 PTX only)."""
    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        print("[cuobjdump] not found (CUDA bin, PATH, triton's copy): binary not inspected")
        return {"elf": ["?"], "ptx": ["?"], "ok": False}
    text = {}
    for flag in ("--list-elf", "--list-ptx"):
        proc = subprocess.run([cuobjdump, flag, str(so)], capture_output=True, text=True)
        text[flag] = proc.stdout + proc.stderr
    (out / "cuobjdump.txt").write_text("\n".join(f"$ cuobjdump {k}\n{v}" for k, v in text.items()))
    elf_arches = sorted(set(re.findall(r"\.(sm_\d+a?)\.cubin", text["--list-elf"])))
    ptx_arches = sorted(set(re.findall(r"\.(sm_\d+a?)\.ptx", text["--list-ptx"])))
    ok = elf_arches == ["sm_75"] and ptx_arches == ["sm_75"]
    print(
        f"[cuobjdump] ELF {elf_arches}, PTX {ptx_arches} -> {'OK' if ok else 'UNEXPECTED'}",
        flush=True,
    )
    return {"elf": elf_arches, "ptx": ptx_arches, "ok": ok}


def isolated_package(so: Path, where: Path) -> Path:
    pkg = where / "sageattention"
    if where.exists():
        shutil.rmtree(where)
    (pkg / "native").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Isolated copy for the sm75 dev run."""\n')
    (pkg / "native" / "__init__.py").write_text("")
    for rel in ("native/sm75.py", "native/families.json", "reference.py"):
        shutil.copy(ROOT / "sageattention" / rel, pkg / rel)
    shutil.copy(so, pkg / (EXT_NAME + sysconfig.get_config_var("EXT_SUFFIX")))
    return where


def run_tests(pkg_root: Path, out: Path, extra: list[str]) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(pkg_root))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(ROOT / "tests" / "gpu" / "test_native_sm75.py"),
        "-q",
        "-rs",
        "--noconftest",
        "-p",
        "no:cacheprovider",
        f"--rootdir={pkg_root}",
        "--durations=5",
        *extra,
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=pkg_root)
    (out / "pytest.log").write_text(proc.stdout + proc.stderr)
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    summary = tail[-1] if tail else "(no output)"
    print(
        f"[pytest] rc={proc.returncode} in {time.monotonic() - started:.1f}s: {summary}", flush=True
    )
    if proc.returncode != 0:
        print((proc.stdout + proc.stderr)[-7000:], flush=True)
    return proc.returncode, summary


def bench(pkg_root: Path, out: Path, quick: bool) -> list[dict]:
    sys.path.insert(0, str(pkg_root))
    import torch
    import torch.nn.functional as F
    from sageattention.native import sm75

    try:
        from triton.testing import do_bench
    except ImportError:  # events, median of 20

        def do_bench(fn, warmup=25, rep=100, return_mode="median"):
            fn()
            times = []
            for _ in range(20):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            return sorted(times)[len(times) // 2]

    sm75.load()
    t0 = time.monotonic()
    x = torch.randn(1, 1, 64, 64, device="cuda", dtype=torch.float16)
    sm75.qk_int8_pv_fp16(
        x,
        x,
        x,
        tensor_layout="HND",
        is_causal=False,
        sm_scale=0.125,
        qk_quant_gran="per_warp",
        pv_accum_dtype="fp32",
        smooth_k=True,
        smooth_v=False,
        return_lse=False,
    )
    torch.cuda.synchronize()
    print(f"[bench] first call (module load + PTX JIT) {time.monotonic() - t0:.2f}s", flush=True)
    rows = []
    cases = CASES[:1] + CASES[4:] if quick else CASES
    for dtype in (torch.float16, torch.bfloat16):
        for b, h, n, d in cases:
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
            for causal in (False, True):

                def ours(q=q, k=k, v=v, causal=causal, d=d):
                    return sm75.qk_int8_pv_fp16(
                        q,
                        k,
                        v,
                        tensor_layout="HND",
                        is_causal=causal,
                        sm_scale=d**-0.5,
                        qk_quant_gran="per_warp",
                        pv_accum_dtype="fp32",
                        smooth_k=True,
                        smooth_v=False,
                        return_lse=False,
                    )[0]

                def sdpa(q=q, k=k, v=v, causal=causal):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                got = ours()
                exact = F.scaled_dot_product_attention(
                    q.float(), k.float(), v.float(), is_causal=causal
                )
                cos = F.cosine_similarity(
                    got.double().flatten(), exact.double().flatten(), dim=0
                ).item()
                l1 = (
                    (got.double() - exact.double()).abs().sum() / exact.double().abs().sum()
                ).item()
                finite = bool(torch.isfinite(got).all())
                del exact, got
                t_ours = do_bench(ours, warmup=25, rep=100, return_mode="median")
                t_sdpa = do_bench(sdpa, warmup=25, rep=100, return_mode="median")
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                rows.append(
                    {
                        "dtype": str(dtype).replace("torch.", ""),
                        "b": b,
                        "h": h,
                        "n": n,
                        "d": d,
                        "causal": causal,
                        "ms": t_ours,
                        "tops": flops / t_ours / 1e9,
                        "sdpa_ms": t_sdpa,
                        "sdpa_tops": flops / t_sdpa / 1e9,
                        "speedup": t_sdpa / t_ours,
                        "cosine": cos,
                        "rel_l1": l1,
                        "finite": finite,
                    }
                )
            del q, k, v
            torch.cuda.empty_cache()
    speedups = [r["speedup"] for r in rows]
    geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    (out / "bench.json").write_text(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "note": "sm75 kernels as driver-compiled compute_75 PTX on this GPU; not Turing speed",
                "geomean_speedup_vs_sdpa": geo,
                "cases": rows,
            },
            indent=1,
        )
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT", "sm75-dev-out")),
        help="folder for build.log, cuobjdump.txt, pytest.log, bench.json",
    )
    parser.add_argument("--build-dir", type=Path, default=Path("/tmp/sm75_build"))
    parser.add_argument("--skip-tests", action="store_true", help="build and time only")
    parser.add_argument("--skip-bench", action="store_true", help="build and test only")
    parser.add_argument("--quick-bench", action="store_true", help="time 2 of the 5 shapes")
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, one string")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    so = build(args.out, args.build_dir)
    binary = inspect_binary(so, args.out)
    pkg_root = isolated_package(so, Path("/tmp/sm75_iso"))
    rc, summary = (0, "skipped")
    if not args.skip_tests:
        rc, summary = run_tests(pkg_root, args.out, args.pytest_args.split())
    rows = [] if args.skip_bench else bench(pkg_root, args.out, args.quick_bench)

    print(
        "\n== sm75 dev run (compute_75 PTX JIT on this GPU: Turing code path, not Turing hardware) =="
    )
    print(
        f"binary: ELF {binary['elf']} PTX {binary['ptx']} ({'OK' if binary['ok'] else 'UNEXPECTED'})"
    )
    print(f"tests: {summary}")
    if rows:
        print(
            f"{'dtype':8} {'b':>2} {'h':>3} {'n':>6} {'d':>4} {'causal':>6} {'ms':>8} {'TOPS':>6} "
            f"{'sdpa':>6} {'x':>5} {'cosine':>9} {'relL1':>7}"
        )
        for r in rows:
            print(
                f"{r['dtype']:8} {r['b']:>2} {r['h']:>3} {r['n']:>6} {r['d']:>4} {str(r['causal']):>6} "
                f"{r['ms']:8.3f} {r['tops']:6.1f} {r['sdpa_tops']:6.1f} {r['speedup']:5.2f} "
                f"{r['cosine']:9.6f} {r['rel_l1']:7.4f}{'' if r['finite'] else ' NaN!'}"
            )
        geo = math.exp(sum(math.log(r["speedup"]) for r in rows) / len(rows))
        print(f"geomean speed-up vs SDPA default (information only): {geo:.2f}x")
    return 0 if rc == 0 and binary["ok"] and all(r["finite"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
