"""Kernel developer's GPU driver for the sm80/sm89/sm90/sm90_fp8 families: build, test, measure in
one call.

1. build: compiles csrc/<family>/ (+ csrc/common/) with torch.utils.cpp_extension in child
   processes and copies each extension next to the package as
   ``sageattention/_kernels_<family><EXT_SUFFIX>`` (release wheels are built by setup.py instead);
2. tests: runs tests/gpu/test_native_sm80_sm89.py;
3. accuracy: cosine / relative L1 against fp32 SDPA and against sageattention.reference;
4. timing: the design.md case set (quantization included, median of triton do_bench) for each
   kernel and SDPA's default backend, printed as a table and written as JSON.

    python benchmarks/gpu_dev_native.py --family sm80 --family sm89 --out /tmp/out

The sm90 and sm90_fp8 families (arch_specific in families.json) always build for 9.0a, whatever
--arch says.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Import the checkout's package (or a tuning variant's copy of it, see --variant).
PACKAGE_ROOT = os.environ.get("SAGE_DEV_PACKAGE_ROOT", str(ROOT))
if PACKAGE_ROOT not in sys.path:
    sys.path.insert(0, PACKAGE_ROOT)


def _child_build(family: str, build_dir: str, std: str, defines: str = "",
                 csrc: str = str(ROOT / "csrc")) -> None:
    from torch.utils.cpp_extension import load

    src = Path(csrc) / family
    sources = sorted(glob.glob(str(src / "*.cu"))) + sorted(glob.glob(str(src / "*.cpp")))
    includes = [csrc]
    import torch

    cu13 = Path(torch.__file__).parents[1] / "nvidia" / "cu13" / "include"
    if cu13.is_dir():
        includes.append(str(cu13))
    load(
        name=f"_kernels_{family}",
        sources=sources,
        extra_include_paths=includes,
        # the host side too: the bindings size buffers by knobs such as SAGE_FP8_V_TERMS
        extra_cflags=["-O3", f"-std={std}", *defines.split()],
        extra_cuda_cflags=["-O3", f"-std={std}", "-Xptxas=-v", *defines.split()],
        build_directory=build_dir,
        verbose=False,
        is_python_module=False,
    )


def build(family: str, arch: str, std: str, build_root: Path, variant: str = "",
          defines: str = "", csrc: Path = ROOT / "csrc") -> Path:
    """Build one family for the arch list (TORCH_CUDA_ARCH_LIST syntax); return the copied .so.

    A tuning variant (extra -D defines, or the sources of another csrc/ tree) is copied into a
    private copy of the package under build_root/pkg_<variant> instead of the checkout.
    """
    build_dir = build_root / (f"{family}_{variant}" if variant else family)
    build_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=arch, MAX_JOBS=os.environ.get("MAX_JOBS", "16"))
    code = (
        "import sys; sys.path.insert(0, %r); import gpu_dev_native as b; "
        "b._child_build(%r, %r, %r, %r, %r)"
        % (str(Path(__file__).parent), family, str(build_dir), std, defines, str(csrc))
    )
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    log = build_root / f"build_{family}{'_' + variant if variant else ''}.log"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"build of {family} failed (log: {log}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    so = build_dir / f"_kernels_{family}.so"
    pkg = ROOT / "sageattention"
    if variant:
        copy_root = build_root / f"pkg_{variant}"
        shutil.rmtree(copy_root, ignore_errors=True)
        shutil.copytree(pkg, copy_root / "sageattention",
                        ignore=shutil.ignore_patterns("_kernels_*", "__pycache__"))
        pkg = copy_root / "sageattention"
    dest = pkg / f"_kernels_{family}{sysconfig.get_config_var('EXT_SUFFIX')}"
    shutil.copy2(so, dest)
    print(f"built {family}{' ' + variant if variant else ''} for {arch} in {time.time() - t0:.0f}s -> {dest}")
    return dest


CASES = [  # (batch, heads, tokens, head_dim): design.md's benchmark case set
    (4, 32, 4096, 128), (1, 32, 16384, 128), (4, 32, 4096, 64), (1, 32, 16384, 64),
    (8, 32, 1024, 128),
]
KERNELS = {  # label -> (family, op, pv_accum_dtype)
    "sm80-fp32": ("sm80", "qk_int8_pv_fp16", "fp32"),
    "sm80-fp16+fp32": ("sm80", "qk_int8_pv_fp16", "fp16+fp32"),
    "sm80-fp16": ("sm80", "qk_int8_pv_fp16", "fp16"),
    "sm89-fp32+fp32": ("sm89", "qk_int8_pv_fp8", "fp32+fp32"),
    "sm89-fp32": ("sm89", "qk_int8_pv_fp8", "fp32"),
    "sm90-fp32": ("sm90", "qk_int8_pv_fp16", "fp32"),
    "sm90_fp8-fp32+fp32": ("sm90_fp8", "qk_int8_pv_fp8", "fp32+fp32"),
    "sm90_fp8-fp32": ("sm90_fp8", "qk_int8_pv_fp8", "fp32"),
}
# Families of arch-specific SASS build for their one target (families.json "arch_specific").
FAMILY_ARCH = {"sm90": "9.0a", "sm90_fp8": "9.0a"}
FAMILY_NAMES = ("sm80", "sm89", "sm90", "sm90_fp8")


def parse_variants(defines: list[str], trees: list[str]) -> dict[str, tuple[str, Path]]:
    """--variant NAME=DEFINES and --variant-csrc NAME=DIR -> {name: (defines, csrc tree)}.

    A name may take both; a variant without --variant-csrc builds this checkout's csrc/.
    """
    variants: dict[str, tuple[str, Path]] = {}
    for spec in defines:
        name, sep, value = spec.partition("=")
        if not sep or not re.fullmatch(r"\w+", name):
            raise ValueError(f"--variant {spec!r}: expected NAME=DEFINES (NAME: letters, digits, _)")
        variants[name] = (value, variants.get(name, ("", ROOT / "csrc"))[1])
    for spec in trees:
        name, sep, value = spec.partition("=")
        tree = Path(value).resolve()
        if not sep or not re.fullmatch(r"\w+", name) or not (tree / "sm80").is_dir():
            raise ValueError(f"--variant-csrc {spec!r}: expected NAME=DIR with DIR a csrc/ tree "
                             "(DIR/sm80, DIR/common), e.g. from: git archive REV csrc | tar -x -C OUT")
        variants[name] = (variants.get(name, ("", tree))[0], tree)
    return variants


def run_child(cmd: list[str], env: dict, timeout: float) -> tuple[object, str, str]:
    """Runs cmd, killed after `timeout` seconds: (exit code or "timeout", stdout, stderr), what it
    printed before the kill included, and on a kill stderr says so."""
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        def text(b) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        return "timeout", text(e.stdout), text(e.stderr) + f"\nkilled after {timeout:g} s (a hang?)\n"


def variant_families(specs: list[str], names) -> dict[str, str]:
    """--variant-family [NAME=]FAMILY (repeatable) -> {variant name: family}; a bare FAMILY sets
    the default for every variant not named (sm80 when none is given)."""
    default, named = "sm80", {}
    for spec in specs:
        name, sep, fam = spec.rpartition("=")
        if fam not in FAMILY_NAMES or (sep and not re.fullmatch(r"\w+", name)):
            raise ValueError(f"--variant-family {spec!r}: expected FAMILY or NAME=FAMILY, FAMILY one of "
                             + ", ".join(FAMILY_NAMES))
        if sep:
            named[name] = fam
        else:
            default = fam
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise ValueError(f"--variant-family names variants that no --variant / --variant-csrc defines: {unknown}")
    return {name: named.get(name, default) for name in names}


def reference_pv_dtype(label: str) -> str:
    """The sageattention.reference pv_dtype a kernel label is checked against: its op's PV type."""
    return "fp8" if KERNELS[label][1] == "qk_int8_pv_fp8" else "fp16"


def _kernel_fn(label, q, k, v, causal):
    import sageattention.native as native

    fam, op, accum = KERNELS[label]
    fn = getattr(native, op)
    return lambda: fn(q, k, v, family=fam, tensor_layout="HND", is_causal=causal,
                      sm_scale=q.shape[-1] ** -0.5, qk_quant_gran="per_thread",
                      pv_accum_dtype=accum, smooth_k=True, smooth_v=False, return_lse=False)


def softmax_blocks_of(defines: str) -> dict[int, int] | None:
    """The online-softmax step per head dim of a variant's kernel: its wgmma K tiles
    (-DSAGE_WG_N64, -DSAGE_WG_N128, default 128 each) when built with -DSAGE_WGMMA=1, else None
    (the family's own)."""
    if not re.search(r"-DSAGE_WGMMA=1\b", defines):
        return None
    tiles = {64: 128, 128: 128}
    for m in re.finditer(r"-DSAGE_WG_N(64|128)=(\d+)", defines):
        tiles[int(m[1])] = int(m[2])
    return tiles


def accuracy(labels, softmax_blocks: dict[int, int] | None = None) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from sageattention import reference

    rows = []
    for n, d, causal in [(4096, 128, False), (4096, 128, True), (4096, 64, False), (1000, 64, True)]:
        g = torch.Generator(device="cuda").manual_seed(n + d)
        q, k, v = (torch.randn(1, 8, n, d, generator=g, device="cuda").half() for _ in range(3))
        k = (k.float() + torch.randn(1, 8, 1, d, device="cuda", generator=g)).half()
        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        for label in labels:
            fam, _, accum = KERNELS[label]
            out, _ = _kernel_fn(label, q, k, v, causal)()
            blocks = dict(reference.FAMILY_BLOCK_SIZES[fam])
            if softmax_blocks:
                blocks["softmax_blkk"] = softmax_blocks[d]
            r = reference.sageattn_reference(
                q, k, v, is_causal=causal, qk_quant_gran="per_thread", smooth_k=True,
                pv_dtype=reference_pv_dtype(label), pv_accum_dtype=accum, **blocks)
            row = {"kernel": label, "n": n, "d": d, "causal": causal,
                   "finite": bool(torch.isfinite(out).all())}
            for name, ref in (("sdpa32", exact), ("reference", r)):
                o, e = out.float().flatten(), ref.float().flatten()
                row[f"cos_{name}"] = F.cosine_similarity(o, e, dim=0).item()
                row[f"rel_l1_{name}"] = ((o - e).abs().sum() / e.abs().sum()).item()
            rows.append(row)
    return rows


REFERENCE_COSINE_MIN = 0.99999  # same quantization as sageattention.reference: rounding only


def accuracy_verdict(rows: list[dict]) -> str:
    """One line that a timing table must not be read without: do the outputs match the reference?"""
    bad = [r for r in rows if not r["finite"] or not r["cos_reference"] >= REFERENCE_COSINE_MIN]
    if not bad:
        worst = min(r["cos_reference"] for r in rows) if rows else float("nan")
        return f"ACCURACY ok: {len(rows)} checks, min cosine vs reference {worst:.6f}"
    cases = ", ".join(f"{r['kernel']} n={r['n']} d={r['d']} causal={r['causal']}"
                      f" (cosine {r['cos_reference']:.6f}, finite={r['finite']})" for r in bad)
    return f"ACCURACY FAILED (timings of this build do not count): {cases}"


def timing(labels, dtypes, cases=CASES, causals=(False, True)) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    rows = []
    for dtype in dtypes:
        for b, h, n, d in cases:
            for causal in causals:
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(b, h, n, d, generator=g, device="cuda", dtype=dtype)
                           for _ in range(3))
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                fns = {"sdpa": lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c)}
                for label in labels:
                    fns[label] = _kernel_fn(label, q, k, v, causal)
                row = {"dtype": str(dtype).replace("torch.", ""), "b": b, "h": h, "n": n, "d": d,
                       "causal": causal}
                for name, fn in fns.items():
                    ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    row[f"{name}_ms"] = ms
                    row[f"{name}_tops"] = flops / ms / 1e9
                rows.append(row)
                del q, k, v
    return rows


def _print_timing(rows, labels) -> None:
    import math

    head = f"{'dtype':5} {'b*h':6} {'n':>6} {'d':>4} {'causal':6} {'sdpa':>6}" + "".join(
        f" {lab:>15}" for lab in labels)
    print(head)
    speedups = {lab: [] for lab in labels}
    for r in rows:
        line = (f"{r['dtype'][:5]:5} {r['b']}x{r['h']:<4} {r['n']:>6} {r['d']:>4} "
                f"{str(r['causal']):6} {r['sdpa_tops']:6.0f}")
        for lab in labels:
            line += f" {r[lab + '_tops']:9.0f} TOPS"
            speedups[lab].append(r["sdpa_ms"] / r[lab + "_ms"])
        print(line)
    for lab in labels:
        gm = math.exp(sum(math.log(x) for x in speedups[lab]) / len(speedups[lab]))
        print(f"geomean speed-up over SDPA, {lab}: {gm:.2f}x")


# A wgmma tuning variant built as the sm80 / sm89 family runs the shipped Hopper families' kernel
# with other knobs: its baseline is that family's kernel in the default build.
BASELINE_OF = {"sm89-fp32+fp32": "sm90_fp8-fp32+fp32", "sm89-fp32": "sm90_fp8-fp32", "sm80-fp32": "sm90-fp32"}


def variant_summary(default_rows: list[dict], variants: dict[str, dict]) -> str:
    """The decision table of a tuning call: per variant and case, the default build's time over the
    variant's for the same kernel (or its BASELINE_OF), their geomean, and the variant's ACCURACY
    verdict (a timing without "ok" does not count). variants: name -> that variant's native_dev.json
    ({} when it wrote none: killed or failed to build)."""
    import math

    def key(r):
        return (r["dtype"], r["b"], r["h"], r["n"], r["d"], r["causal"])

    base = {key(r): r for r in default_rows}
    cases = [key(r) for r in default_rows]
    names = [f"{b}x{h}x{n}x{d}{' c' if c else ''}" for _, b, h, n, d, c in cases]
    lines = ["== variants against the default build (default time / variant time, same case and kernel; "
             "separate processes, so about 1-2% is noise)",
             f"{'variant':10} {'kernel':33} " + " ".join(f"{n:>15}" for n in names) + f" {'geomean':>8}  accuracy"]
    for name, res in variants.items():
        verdict = ("ok" if accuracy_verdict(res["accuracy"]).startswith("ACCURACY ok") else "FAILED") \
            if res.get("accuracy") else "none"
        rows = {key(r): r for r in res.get("timing", [])}
        labels = sorted({k[:-len("_ms")] for r in rows.values() for k in r if k.endswith("_ms") and k != "sdpa_ms"})
        if not labels:
            lines.append(f"{name:10} {'(no timing)':33} " + " ".join(f"{'-':>15}" for _ in names) +
                         f" {'-':>8}  {verdict}")
        for label in labels:
            ref = label if any(f"{label}_ms" in r for r in default_rows) else BASELINE_OF.get(label)
            cells, ratios = [], []
            for c in cases:
                v, d = rows.get(c), base.get(c)
                if v is None or d is None or ref is None or f"{ref}_ms" not in d or f"{label}_ms" not in v:
                    cells.append(f"{'-':>15}")
                    continue
                ratio = d[f"{ref}_ms"] / v[f"{label}_ms"]
                ratios.append(ratio)
                cells.append(f"{ratio:.3f} ({v[label + '_tops']:.0f})".rjust(15))
            gm = f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):8.3f}" if ratios else f"{'-':>8}"
            shown = label if ref == label else f"{label}/{ref}"
            lines.append(f"{name:10} {shown:33} " + " ".join(cells) + f" {gm}  {verdict}")
    return "\n".join(lines) + "\n"


def render_markdown(results: dict, source: str) -> str:
    """The timing rows of a native_dev.json as a markdown table, with design.md's upstream 1.0.6
    Triton column (fp16) and, per label, the share of it reached."""
    from sageattention.benchmark import UPSTREAM_106_TRITON_TOPS

    rows = results["timing"]
    labels = [k[:-len("_tops")] for k in rows[0] if k.endswith("_tops") and k != "sdpa_tops"]
    lines = [f"<!-- generated by: python benchmarks/gpu_dev_native.py --render {source} --markdown OUT -->",
             f"Device: {results.get('device', '?')}. TOPS = 4*b*h*n*n*d / time (halved for causal), "
             "quantization included, median of triton.testing.do_bench; SDPA = PyTorch's default backend, "
             "same inputs, same process.", "",
             "| dtype | b x h x n x d | causal | SDPA | " + " | ".join(labels)
             + " | upstream 1.0.6 Triton | " + " | ".join(f"{lab} / upstream" for lab in labels) + " |",
             "|---" * (5 + 2 * len(labels)) + "|"]
    for r in rows:
        up = UPSTREAM_106_TRITON_TOPS.get((r["b"], r["h"], r["n"], r["d"], r["causal"])) \
            if r["dtype"] == "float16" else None
        cells = [r["dtype"], f"{r['b']}x{r['h']}x{r['n']}x{r['d']}", "yes" if r["causal"] else "no",
                 f"{r['sdpa_tops']:.0f}"] + [f"{r[lab + '_tops']:.0f}" for lab in labels]
        cells.append(f"{up}" if up else "")
        cells += [f"{r[lab + '_tops'] / up:.2f}" if up else "" for lab in labels]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--render", metavar="JSON",
                        help="only print a stored native_dev.json's timing as a markdown table")
    parser.add_argument("--markdown", metavar="OUT", help="with --render: also write the table here")
    parser.add_argument("--family", action="append", choices=FAMILY_NAMES,
                        help="family to build and measure (repeatable)")
    parser.add_argument("--arch", default="9.0", help="TORCH_CUDA_ARCH_LIST value (default 9.0)")
    parser.add_argument("--std", default="c++17", help="C++ standard (torch 2.14 needs c++20)")
    parser.add_argument("--build-root", default=str(ROOT / "build" / "native_dev"))
    parser.add_argument("--out", default=str(ROOT / "build" / "native_dev_out"),
                        help="folder for logs and the JSON results")
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--dtypes", default="float16,bfloat16", help="timing dtypes")
    parser.add_argument("--cases", default="", metavar="BxHxNxD,...",
                        help="timing cases (default: design.md's five shapes)")
    parser.add_argument("--causal", choices=["both", "no", "yes"], default="both")
    parser.add_argument("--labels", default="",
                        help="kernels to check and time, comma-separated (default: every label of "
                             "the built families: " + ", ".join(KERNELS) + ")")
    parser.add_argument("--variant-family", action="append", default=[], metavar="[NAME=]FAMILY",
                        help="the family the variants build: FAMILY for all (default sm80; sm89 for "
                             "the FP8 wgmma variant: -DSAGE_WGMMA=1 -DSAGE_WG_WS=1 with --arch 9.0a; "
                             "sm90 / sm90_fp8 build for 9.0a with their own tiles), NAME=FAMILY for "
                             "one variant; repeatable")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=DEFINES",
                        help="also build the variant family with these -D defines (tile shapes, see "
                             "csrc/common/attn_dispatch.cuh), check it against the reference and "
                             "time it (fp16 cases); repeatable")
    parser.add_argument("--variant-csrc", action="append", default=[], metavar="NAME=DIR",
                        help="build variant NAME's sm80 family from the csrc/ tree DIR (another "
                             "commit's kernels: git archive REV csrc | tar -x -C OUT, DIR=OUT/csrc; "
                             "the Python side stays this checkout's, so the tree's ops must match "
                             "its bindings); combines with --variant NAME=DEFINES; repeatable")
    parser.add_argument("--variant-timeout", type=float, default=150, metavar="SECONDS",
                        help="each variant's check and timing run (a child process) is killed after "
                             "this long, so one hanging build costs only its own results (default 150)")
    parser.add_argument("--softmax-blocks", default="", metavar="D64,D128",
                        help="the kernels' online-softmax step (keys) at head dim 64 and 128 for "
                             "the reference (default: the family's; variants built with "
                             "-DSAGE_WGMMA=1 pass their K tiles)")
    args = parser.parse_args(argv)
    if not args.render and not args.family:
        parser.error("--family is required (or --render JSON)")
    if args.render:
        text = render_markdown(json.loads(Path(args.render).read_text()), args.render)
        if args.markdown:
            Path(args.markdown).write_text(text)
        print(text, end="")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"families": args.family}
    try:
        variants = parse_variants(args.variant, args.variant_csrc)
        family_of = variant_families(args.variant_family, variants)
        softmax_blocks = {name: softmax_blocks_of(d) for name, (d, _) in variants.items()}
    except ValueError as exc:
        parser.error(str(exc))
    if not args.skip_build:
        jobs = [(f, "", "", ROOT / "csrc") for f in args.family] + \
               [(family_of[n], n, d, tree) for n, (d, tree) in variants.items()]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            futures = {pool.submit(build, f, FAMILY_ARCH.get(f, args.arch), args.std,
                                   Path(args.build_root), n, d, t): (f, n)
                       for f, n, d, t in jobs}
            for fut, (fam, name) in futures.items():
                try:
                    fut.result()
                except RuntimeError as exc:
                    print(exc)
                    results.setdefault("build_errors", {})[f"{fam} {name}"] = str(exc)[-3000:]
    import sageattention.native as native

    status = native.available_families()
    print("families:", status)
    fams = [f for f in args.family if status.get(f) is None]
    if not args.skip_tests:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q",
                               str(ROOT / "tests" / "gpu" / "test_native_sm80_sm89.py"),
                               "-p", "no:cacheprovider", "--tb=short"],
                              capture_output=True, text=True, cwd=ROOT)
        (out / "pytest.log").write_text(proc.stdout + proc.stderr)
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        print("\n".join(line for line in tail if line.startswith(("FAILED", "ERROR")))[:6000])
        print("pytest:", tail[-1] if tail else "(no output)")
        results["pytest_rc"] = proc.returncode
    labels = [lab for lab, spec in KERNELS.items() if spec[0] in fams]
    if args.labels:
        labels = [lab for lab in args.labels.split(",") if lab in labels]
    cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",") if c] or CASES
    causals = {"both": (False, True), "no": (False,), "yes": (True,)}[args.causal]
    import torch

    if labels and not torch.cuda.is_available():
        print("no CUDA device here: built only; accuracy and timing need a GPU")
        labels = []
    if labels:
        steps = dict(zip((64, 128), map(int, args.softmax_blocks.split(",")))) if args.softmax_blocks else None
        results["accuracy"] = accuracy(labels, steps)
        for r in results["accuracy"]:
            print({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()})
        print(accuracy_verdict(results["accuracy"]))
        (out / "native_dev.json").write_text(json.dumps(results, indent=1))
        if not args.skip_timing:
            results["device"] = torch.cuda.get_device_name()
            results["timing"] = timing(labels, [getattr(torch, x) for x in args.dtypes.split(",")],
                                       cases, causals)
            (out / "native_dev.json").write_text(json.dumps(results, indent=1))
            _print_timing(results["timing"], labels)
    for name, (defines, tree) in variants.items():
        if f"{family_of[name]} {name}" in results.get("build_errors", {}):
            continue
        vout = out / f"variant_{name}"
        env = dict(os.environ, SAGE_DEV_PACKAGE_ROOT=str(Path(args.build_root) / f"pkg_{name}"))
        rc, stdout, stderr = run_child([sys.executable, __file__, "--family", family_of[name], "--skip-build",
                                        "--skip-tests", "--dtypes", "float16", "--out", str(vout),
                                        "--cases", args.cases, "--causal", args.causal, "--labels", args.labels]
                                       + (["--softmax-blocks", f"{sb[64]},{sb[128]}"] if (sb := softmax_blocks[name])
                                          else []), env, args.variant_timeout)
        source = "" if tree == ROOT / "csrc" else f" [csrc {tree}]"
        print(f"== variant {name} ({family_of[name]}): {defines}{source}")
        print("\n".join(line for line in stdout.splitlines() if "cos_reference" in line or "TOPS" in line or "ACCURACY" in line
                        or "geomean" in line)[-3000:] or stderr[-2000:])
        results.setdefault("variants", {})[name] = {"family": family_of[name], "defines": defines, "csrc": str(tree),
                                                    "rc": rc}
    (out / "native_dev.json").write_text(json.dumps(results, indent=1))
    if variants and results.get("timing"):
        found = {}
        for name in variants:
            path = out / f"variant_{name}" / "native_dev.json"
            found[name] = json.loads(path.read_text()) if path.is_file() else {}
        print(variant_summary(results["timing"], found), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
