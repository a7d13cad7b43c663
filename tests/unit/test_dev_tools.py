"""The kernel developers' GPU drivers under benchmarks/: what can be checked without a GPU."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("stem", ["h200-2026-12-03-native-e31541b", "h200-2026-12-03-native-8b38edf",
                                  "h200-2026-12-03-native-addr2-rowvote"])
def test_committed_native_tables_are_what_render_makes(stem):
    native = _load("gpu_dev_native")
    source = f"benchmarks/results/{stem}.json"
    text = native.render_markdown(json.loads((ROOT / source).read_text()), source)
    assert (RESULTS / f"{stem}.md").read_text() == text


def test_render_puts_upstream_ratio_on_fp16_rows_only():
    native = _load("gpu_dev_native")
    row = {"dtype": "float16", "b": 4, "h": 32, "n": 4096, "d": 128, "causal": False,
           "sdpa_tops": 600.0, "k_tops": 379.0 / 2}
    bf16 = dict(row, dtype="bfloat16")
    lines = native.render_markdown({"timing": [row, bf16], "device": "X"}, "f.json").splitlines()
    fp16_cells = [c.strip() for c in lines[-2].strip("|").split("|")]
    bf16_cells = [c.strip() for c in lines[-1].strip("|").split("|")]
    assert fp16_cells[-2:] == ["379", "0.50"]  # upstream 1.0.6 Triton, then k / upstream
    assert bf16_cells[-2:] == ["", ""]


def test_render_needs_no_family_flag(tmp_path, capsys):
    native = _load("gpu_dev_native")
    with pytest.raises(SystemExit):
        native.main(["--skip-build"])  # neither --family nor --render
    out = tmp_path / "t.md"
    assert native.main(["--render", str(RESULTS / "h200-2026-12-03-native-e31541b.json"),
                        "--markdown", str(out)]) == 0
    assert out.read_text() == capsys.readouterr().out


def test_wgmma_variants_check_against_their_softmax_step():
    native = _load("gpu_dev_native")
    assert native.softmax_blocks_of("-DSAGE_HD64_WARPS=8") is None  # mma.sync: the family's own
    assert native.softmax_blocks_of("-DSAGE_WGMMA=1 -DSAGE_WG_WS=1") == {64: 128, 128: 128}
    assert native.softmax_blocks_of("-DSAGE_WGMMA=1 -DSAGE_WG_N64=64") == {64: 64, 128: 128}


def test_variants_combine_defines_and_another_csrc_tree(tmp_path):
    native = _load("gpu_dev_native")
    tree = tmp_path / "csrc"
    (tree / "sm80").mkdir(parents=True)
    variants = native.parse_variants(["a=-DX=1", "b=-DY=2 -DZ=3"], [f"b={tree}", f"c={tree}"])
    assert variants == {"a": ("-DX=1", ROOT / "csrc"), "b": ("-DY=2 -DZ=3", tree.resolve()),
                        "c": ("", tree.resolve())}
    for bad in (["nodir"], [f"x={tmp_path}"], [f"={tree}"]):  # no '=', no sm80/ inside, no name
        with pytest.raises(ValueError, match="--variant-csrc"):
            native.parse_variants([], bad)
    with pytest.raises(ValueError, match="--variant"):
        native.parse_variants(["-DX=1"], [])  # a define without a variant name
    with pytest.raises(SystemExit):  # the command line names the bad value and exits 2
        native.main(["--family", "sm80", "--variant-csrc", f"x={tmp_path}"])


def test_trace_table_turns_clock_stamps_into_phase_cycles():
    profile = _load("gpu_dev_profile")
    text = "\n".join([
        "noise",
        "TRACE sm 3 wg 0 kb 8 100 600 700 1300 650",    # t0 softmax, t1 done, t2 issued, t3 done, t4 K/V
        "TRACE sm 3 wg 1 kb 8 150 640 760 1400 700",
        "TRACE sm 3 wg 0 kb 9 1300 1800 1900 2500 1850",
        "TRACE sm 3 wg 0 kb 8 4294967196 404 504 1104 454",  # a later call wins; the clock wraps
    ])
    table = profile.trace_table(text)
    first = next(line for line in table.splitlines() if line.startswith("8 "))
    assert first.split()[1:6] == ["504", "50", "50", "600", "1400"]  # wg0: wrap handled, period to kb 9
    assert first.split()[6:10] == ["490", "60", "60", "640"]
    assert first.split()[-1] == "250"  # wg1 starts 250 cycles after wg0 (across the wrap)
    assert "no TRACE lines" in profile.trace_table("nothing here")


def test_trace_table_shows_each_traced_tile_phases():
    profile = _load("gpu_dev_profile")
    text = "\n".join([
        # entry, then tile start, Q and first K landed, first QK done, K loop done, output stored
        "TRACE_TILE sm 5 wg 0 it 0 nkb 8 entry 1000 1400 3400 3700 23700 26700",
        "TRACE_TILE sm 5 wg 0 it 1 nkb 4 entry 1000 26710 26810 27110 37110 40110",
    ])
    table = profile.trace_table(text)
    assert "fewer K blocks" in table  # no per-block lines: fewer than 9 K blocks
    first = next(line for line in table.splitlines() if line.startswith("0 "))
    assert first.split() == ["0", "0", "8", "400", "-", "2000", "300", "20000", "2500", "3000", "25300"]
    second = next(line for line in table.splitlines() if line.startswith("1 "))
    assert second.split()[3:9] == ["25710", "10", "100", "300", "10000", "2500"]  # 10 after tile 0's store


def test_a_hanging_variant_run_is_killed_with_what_it_printed():
    native = _load("gpu_dev_native")
    rc, out, err = native.run_child([sys.executable, "-c", "print('ACCURACY ok', flush=True); "
                                     "import time; time.sleep(30)"], dict(os.environ), timeout=2)
    assert rc == "timeout" and "ACCURACY ok" in out and "killed after 2 s" in err
    rc, out, err = native.run_child([sys.executable, "-c", "import sys; print('x'); sys.exit(3)"],
                                    dict(os.environ), timeout=30)
    assert (rc, out, err) == (3, "x\n", "")


def test_variant_families_default_and_per_name():
    native = _load("gpu_dev_native")
    names = {"a": None, "b": None, "c": None}
    assert native.variant_families([], names) == {"a": "sm80", "b": "sm80", "c": "sm80"}
    assert native.variant_families(["sm90", "b=sm90_fp8", "c=sm80"], names) == {
        "a": "sm90", "b": "sm90_fp8", "c": "sm80"}
    for bad in (["sm70"], ["b=sm91"], ["b c=sm90"]):  # unknown family, bad name
        with pytest.raises(ValueError, match="--variant-family"):
            native.variant_families(bad, names)
    with pytest.raises(ValueError, match="no --variant"):
        native.variant_families(["z=sm90"], names)


def test_native_kernel_labels_follow_the_family_table():
    native = _load("gpu_dev_native")
    from sageattention.native import FAMILIES

    for label, (family, op, accum) in native.KERNELS.items():
        spec = FAMILIES[family]
        assert label == f"{family}-{accum}" and op in spec["ops"] and accum in spec["pv_accum_dtype"]
        assert native.reference_pv_dtype(label) == ("fp8" if op == "qk_int8_pv_fp8" else "fp16")
    assert {f for f, _, _ in native.KERNELS.values()} == set(FAMILIES) - {"sm75"}  # sm75: its own driver
    assert [lab for lab, spec in native.KERNELS.items() if spec[0] == "sm90_fp8"] == \
        ["sm90_fp8-fp32+fp32", "sm90_fp8-fp32"]
    assert native.reference_pv_dtype("sm90_fp8-fp32") == "fp8"
    # arch-specific families build for their one arch-specific target
    assert native.FAMILY_ARCH == {f: "9.0a" for f, s in FAMILIES.items() if s.get("arch_specific")}


def test_accuracy_verdict_flags_nan_and_reference_mismatch():
    native = _load("gpu_dev_native")
    good = {"kernel": "sm80-fp32", "n": 4096, "d": 128, "causal": False, "finite": True,
            "cos_reference": 0.9999995}
    assert native.accuracy_verdict([good]).startswith("ACCURACY ok: 1 checks")
    nan = dict(good, finite=False, cos_reference=float("nan"))  # the pipelined wgmma variant's rows
    off = dict(good, d=64, cos_reference=0.99915)
    verdict = native.accuracy_verdict([good, nan, off])
    assert verdict.startswith("ACCURACY FAILED") and "d=128" in verdict and "d=64" in verdict
    assert "cosine 0.999150" in verdict and "finite=False" in verdict


def test_mma_peak_kernel_source_names_every_operand():
    peak = _load("gpu_dev_mma_peak")
    for ptx, na, nb, nc, ctype, _ in peak.SHAPES.values():
        src = peak._source(ptx, na, nb, nc, ctype)
        assert f"mma.sync.aligned.{ptx}" in src
        assert f"%{nc + na + nb - 1}" in src and f"%{nc + na + nb}" not in src
        assert src.count(f'"+{ctype}"(acc[c]') == nc


def test_generated_wgmma_wrappers_are_what_the_generator_writes(tmp_path, monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("gen_wgmma", ROOT / "scripts" / "gen_wgmma.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    monkeypatch.setattr(gen, "OUT", tmp_path / "wgmma_ops.cuh")
    gen.main([])
    committed = (ROOT / "csrc" / "common" / "wgmma_ops.cuh").read_text()
    assert (tmp_path / "wgmma_ops.cuh").read_text() == committed, "run: python scripts/gen_wgmma.py"
    # every shape the kernels call exists, the FP8 P.V ones included
    for name in ("wgmma_m64n128k32_s8", "wgmma_m64n128k16_f16_rs", "wgmma_m64n128k16_bf16_ss",
                 "wgmma_m64n64k32_e4m3_rs", "wgmma_m64n128k32_e4m3_rs"):
        assert f"void {name}(" in committed, name


def test_variant_summary_is_the_decision_table():
    native = _load("gpu_dev_native")

    def row(n, causal, **ms):
        r = {"dtype": "float16", "b": 4, "h": 32, "n": n, "d": 128, "causal": causal}
        for label, t in ms.items():
            r[f"{label}_ms"], r[f"{label}_tops"] = t, 100.0 / t
        return r
    default = [row(4096, False, **{"sm90_fp8-fp32+fp32": 2.0, "sm90-fp32": 3.0}),
               row(1024, False, **{"sm90_fp8-fp32+fp32": 1.0, "sm90-fp32": 1.5})]
    ok = [{"finite": True, "cos_reference": 1.0, "kernel": "x", "n": 1, "d": 1, "causal": False}]
    bad = [dict(ok[0], cos_reference=0.9)]
    variants = {
        "fe8": {"accuracy": ok, "timing": [row(4096, False, **{"sm90_fp8-fp32+fp32": 1.6}),
                                           row(1024, False, **{"sm90_fp8-fp32+fp32": 1.25})]},
        "pp8": {"accuracy": bad, "timing": [row(4096, False, **{"sm89-fp32+fp32": 2.5})]},
        "dead": {},
    }
    text = native.variant_summary(default, variants)
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    fe8 = lines["fe8"].split()
    assert fe8[1] == "sm90_fp8-fp32+fp32" and fe8[2] == "1.250" and fe8[4] == "0.800"
    assert fe8[-2] == "1.000" and fe8[-1] == "ok"  # geomean of 1.25 and 0.8
    pp8 = lines["pp8"].split()  # an sm89 tuning variant is held against the shipped sm90_fp8 kernel
    assert pp8[1].startswith("sm89-fp32+fp32/sm90_fp8") and pp8[2] == "0.800" and pp8[-1] == "FAILED"
    assert "-" in lines["dead"] and lines["dead"].split()[-1] == "none"
    assert "4x32x4096x128" in text.splitlines()[1] and "4x32x1024x128" in text.splitlines()[1]


@pytest.mark.parametrize("skip", [False, True])
def test_tune_call_skips_the_steps_a_short_call_turns_off(tmp_path, skip):
    # python3 and nvidia-smi stand-ins record what the call runs; no GPU, nothing built
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    for tool in ("python3", "nvidia-smi"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n')
        stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"), SKIP_NATIVE="1")
    if skip:
        env.update(MMA_PEAK="0", BREAKDOWN="0")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_dev_tune.sh")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ran = calls.read_text()
    assert "nvidia-smi" in ran
    assert ("gpu_dev_mma_peak.py" in ran) is not skip
    assert ("gpu_dev_profile.py breakdown" in ran) is not skip
    assert (tmp_path / "out" / "tune.tgz").is_file()


def _run_session(tmp_path, cwd, gpu: str, variables: dict, python_more: str = ""):
    """gpu_dev_session.sh run in cwd with stand-ins: nvidia-smi names the card; python3 records its
    arguments in calls.log (then runs python_more, shell); nothing is built or run. variables: the
    environment's additions (None: unset). Returns (the finished process, the log's path)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls.log"
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\necho "{gpu}, 580.0, 9.0"\n')
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "python3 $*" >> "{calls}"\n{python_more}')
    for tool in ("nvidia-smi", "python3"):
        (bin_dir / tool).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"))
    for name, value in variables.items():
        env.pop(name, None)
        if value is not None:
            env[name] = value
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_dev_session.sh")], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    return proc, calls


@pytest.mark.parametrize("gpu, table_source, commit, expected", [
    ("NVIDIA H100 80GB HBM3", None, "2d294685db6e", "h100-{date}-calibration-2d29468.json"),
    ("NVIDIA H200", None, "abc", "h200-{date}-calibration-abc.json"),
    ("NVIDIA A100-SXM4-80GB", None, "", "gpu-{date}-calibration.json"),
    ("NVIDIA H100 80GB HBM3", "mine.json", "abc", "mine.json"),
])
def test_session_table_step_names_the_calibration_after_the_card(tmp_path, gpu, table_source, commit,
                                                                 expected):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    # python3 also creates the files that --benchmark-json and --out name, so the table step can
    # copy them
    proc, calls = _run_session(
        tmp_path, repo, gpu, {"STEPS": "calibrate table", "SOURCE_COMMIT": commit, "TABLE_SOURCE": table_source},
        'prev=""\nfor a in "$@"; do case $prev in --out|--benchmark-json) '
        'mkdir -p "$(dirname "$a")"; echo "{}" > "$a" ;; esac; prev=$a; done\n')
    assert proc.returncode == 0, proc.stderr
    date = subprocess.run(["date", "+%F"], capture_output=True, text=True).stdout.strip()
    written = sorted(p.name for p in (repo / "benchmarks" / "results").iterdir())
    assert written == [expected.format(date=date)]
    assert f"--from-benchmark benchmarks/results/{written[0]}" in calls.read_text()


@pytest.mark.parametrize("step", ["sm75", "sm80", "sm89"])
def test_session_ptx_step_builds_and_validates_that_sms_wheel(tmp_path, step):
    repo = tmp_path / "repo"
    repo.mkdir()
    # python3 also drops a wheel into the folder a build's --out names, as the factory would
    proc, calls = _run_session(
        tmp_path, repo, "NVIDIA H100 80GB HBM3", {"STEPS": step, "CELL": None},
        'prev=""\nfor a in "$@"; do [ "$prev" = --out ] && mkdir -p "$a" && '
        ': > "$a/sageattention-2.2.0+x-cp312-cp312-linux_x86_64.whl"; prev=$a; done\n')
    assert proc.returncode == 0, proc.stderr
    sm = step[2:]
    ran = calls.read_text().splitlines()
    builds = [line for line in ran if "scripts.factory build" in line]
    assert [line.split("--cell ")[1].split()[0] for line in builds] == [
        "linux-cp312-torch2.11-cu130-sm90", f"linux-cp312-torch2.11-cu130-{step}"]
    assert f"/wheel{sm} " in builds[1] + " "
    validated = [line for line in ran if "scripts.factory.validate" in line]
    assert len(validated) == 1 and f"/wheel{sm}/sageattention-2.2.0+x-" in validated[0]
    assert f"validate{sm}: exit 0" in proc.stdout


def test_call_overhead_prints_every_path_against_torch(capsys):
    overhead = _load("cpu_call_overhead")
    assert overhead.main(["--calls", "3", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    timed = [line for line in lines if " us" in line and not line.startswith("#")]
    assert [line.split("  ")[0] for line in timed] == [
        "torch SDPA", "sageattn(q, k, v)", "sageattn(q, k, v, dropout_p=0.0)",
        "sageattention.scaled_dot_product_attention"]
    assert "over torch SDPA" not in timed[0] and all("over torch SDPA" in line for line in timed[1:])
    with pytest.raises(SystemExit):
        overhead.main(["--calls", "0"])


def test_lazy_rescale_emulation_keeps_the_output_and_bounds_p(capsys):
    emulation = _load("lazy_rescale_emulation")
    assert emulation.main(["--block", "512"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "cosine" in line]
    assert [row.split("  ")[0].strip() for row in rows] == ["rule off", "threshold 0", "threshold 8"]
    cosines = [float(row.split("cosine ")[1].split()[0]) for row in rows]
    p_max = [float(row.split("max P")[1].split()[0]) for row in rows]
    assert min(cosines) > 0.9999999 and p_max[0] == p_max[1] == 1.0 and 1.0 < p_max[2] <= 256.0
    with pytest.raises(SystemExit):
        emulation.main(["--block", "0"])


def test_order_diagnostic_times_every_entry_after_sdpa_and_otherwise(capsys, monkeypatch):
    """benchmarks/gpu_dev_order.py on CPU tensors with a stand-in for the package and the timer:
    every order of the four entries is timed, and each entry other than SDPA itself is timed
    right after SDPA in some of them."""
    import argparse
    import contextlib

    import torch

    order = _load("gpu_dev_order")
    assert order.parse_case("4x32x4096x64c") == (4, 32, 4096, 64, True)
    with pytest.raises(argparse.ArgumentTypeError, match="expected BxHxNxD"):
        order.parse_case("4x32x64")
    with pytest.raises(SystemExit):  # argparse: "--rounds: must be a whole number of at least 1"
        order.main(["--rounds", "0"])

    class Package:
        ran = None
        force_backend = staticmethod(lambda name: contextlib.nullcontext())
        last_backend = staticmethod(lambda: Package.ran)

        @staticmethod
        def sageattn(q, k, v, is_causal=False):
            Package.ran = "sdpa"
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda *shape, device=None, dtype=None, generator=None: real_randn(*shape))

    class Generator:  # the script seeds a CUDA generator; the stand-in randn takes none
        def __init__(self, device=None):
            pass

        def manual_seed(self, seed):
            return self

    monkeypatch.setattr(torch, "Generator", Generator)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    timed = []
    order.time_case(Package, lambda fn: timed.append(fn) or 1.0, "cuda-sm90-fp16", (1, 2, 64, 32, True), 24)
    out = capsys.readouterr().out
    assert len(timed) == 24 * 4
    assert "default dispatch ran sdpa" in out
    lines = {line.split("after sdpa")[0].strip(): line for line in out.splitlines() if "after sdpa" in line}
    assert set(lines) == {"sdpa direct", "sageattn default", "sageattn forced sdpa",
                          "sageattn forced cuda-sm90-fp16"}
    assert "(n=0)" in lines["sdpa direct"]  # SDPA never follows itself
    for name in ("sageattn default", "sageattn forced sdpa", "sageattn forced cuda-sm90-fp16"):
        assert "(n=0)" not in lines[name], lines[name]


def test_ncu_source_summary_ranks_instructions_opcodes_and_reasons(tmp_path):
    summary = _load("ncu_source_summary")
    csv_text = "\n".join([
        '"Kernel Name","void k<128>(P)"',  # ncu's line above the header
        '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
        '"Instructions Executed","stall_barrier","stall_mio"',
        '"0x10","MUFU.EX2 R3, R4","30","20","100","0","25"',
        '"0x20","@!P0 MUFU.EX2 R5, R6","10","5","100","0","8"',
        '"0x30","WARPGROUP.DEPBAR.LE gsb0, 0x0","60","40","10","55","0"',
    ])
    path = tmp_path / "src.csv"
    path.write_text(csv_text + "\n")
    text = summary.summarize(path, top=2, bucket=2)
    assert "3 SASS lines, 100 warp-stall samples" in text
    top = text.split("top 2 instructions")[1].split("samples per opcode")[0]
    assert "WARPGROUP.DEPBAR" in top and "60.00%" in top and "[stall_barrier 55]" in top
    assert "R5, R6" not in top  # the third by samples is not listed
    opcodes = text.split("samples per opcode")[1].split("\n")
    assert "WARPGROUP.DEPBAR.LE" in opcodes[1]
    # both EX2s count as one opcode: the predicate @!P0 is not the opcode
    assert "MUFU.EX2" in opcodes[2] and "40.00%" in opcodes[2] and "(2 instructions)" in opcodes[2]
    assert "stall_barrier" in text.split("samples per reason")[1].split("\n")[1]


def test_ncu_source_summary_says_when_the_samples_are_missing(tmp_path):
    summary = _load("ncu_source_summary")
    path = tmp_path / "src.csv"
    path.write_text('"Address","Source","Instructions Executed"\n"0x10","FADD R1, R2, R3","5"\n')
    assert "no warp-stall sampling column" in summary.summarize(path, top=5, bucket=8)
    path.write_text("no table here\n")
    with pytest.raises(SystemExit, match="no header row"):
        summary.summarize(path, top=5, bucket=8)


def test_ncu_source_summary_cli_names_a_missing_file_and_bad_counts(tmp_path, capsys):
    summary = _load("ncu_source_summary")
    with pytest.raises(SystemExit) as exc:
        summary.main([str(tmp_path / "absent.csv")])
    assert exc.value.code == 2 and "absent.csv: no such file" in capsys.readouterr().err
    path = tmp_path / "src.csv"
    path.write_text('"Address","Source","Warp Stall Sampling (All Samples)"\n"0x10","FADD R1, R2, R3","5"\n')
    with pytest.raises(SystemExit) as exc:
        summary.main([str(path), "--bucket", "0"])
    assert exc.value.code == 2 and "--top and --bucket must be at least 1" in capsys.readouterr().err
    assert summary.main([str(path), "--top", "1"]) == 0
    assert "1 SASS lines, 5 warp-stall samples" in capsys.readouterr().out


def test_clocks_diagnostic_summarises_nvml_samples(monkeypatch):
    """benchmarks/gpu_dev_clocks.py without a GPU: a stand-in NVML whose clock alternates and whose
    only clock-event reason is the power cap, and a stand-in for the timed stretch. The row gives
    TOPS from the flops and time, the median clock and power, each reason's share of the samples,
    and TOPS per GHz of the median clock."""
    import time
    import types

    clocks = _load("gpu_dev_clocks")
    readings = iter(range(10**6))
    nvml = types.SimpleNamespace(
        NVML_CLOCK_SM=0,
        nvmlDeviceGetClockInfo=lambda handle, kind: 1500 if next(readings) % 2 else 1700,
        nvmlDeviceGetPowerUsage=lambda handle: 690_000,  # milliwatts
        nvmlDeviceGetCurrentClocksEventReasons=lambda handle: 0x4,
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    def run_for(fn, seconds):  # the sampler thread reads NVML meanwhile
        time.sleep(0.05)
        return 10, 2.0  # 10 calls, 2 ms each
    monkeypatch.setattr(clocks, "run_for", run_for)
    row = clocks.measure("x", None, 1e12, handle=None, seconds=1, interval_s=0.002)
    assert row["samples"] >= 2
    assert row["tops"] == pytest.approx(500.0)  # 1e12 flops in 2 ms
    assert row["sm_mhz_min"] == 1500 and row["sm_mhz_max"] == 1700
    assert 1500 <= row["sm_mhz_median"] <= 1700
    assert row["power_w_median"] == pytest.approx(690.0)
    assert row["reasons"] == {"sw_power_cap": 1.0}
    assert row["tops_per_ghz"] == pytest.approx(500.0 / (row["sm_mhz_median"] / 1000.0))


def test_triton_mma_probe_names_the_mma_each_target_gets(capsys):
    """benchmarks/triton_mma_probe.py compiles for a named target without a GPU: Hopper gets the
    warpgroup MMA, Ampere the warp MMA the sm80 family uses (docs/kernels.md, Known limits)."""
    pytest.importorskip("triton", reason="Triton is not installed here")
    probe = _load("triton_mma_probe")
    hopper, warps = probe.mma_instructions(90, 64)
    assert warps == 4 and hopper and all(op.startswith("wgmma.mma_async") for op in hopper)
    assert any(".s8.s8" in op for op in hopper) and any(".f16.f16" in op for op in hopper)
    ampere, _ = probe.mma_instructions(80, 64)
    assert ampere and all(op.startswith("mma.sync") for op in ampere)
    assert probe.main(["--arch", "80", "--head-dim", "128"]) == 0
    assert "sm_80 d=128 (8 warps): mma.sync" in capsys.readouterr().out
    # without the Hopper lowering sm_90 gets the warp MMA; the setting ends with the call
    hopper_warp, _ = probe.mma_instructions(90, 64, wgmma=False)
    assert hopper_warp == ampere
    assert "DISABLE_MMA_V3" not in os.environ
    assert probe.mma_instructions(90, 64) == (hopper, 4)


def test_triton_mma_probe_reads_predicated_and_blackwell_mma_and_refuses_old_targets(capsys):
    """Blackwell's tcgen05.mma comes predicated ("@%p9 ..."): it must count, not read as "no MMA";
    a target without int8 tl.dot is refused by name before Triton prints pages of IR."""
    probe = _load("triton_mma_probe")
    ptx = """
    @%p9 tcgen05.mma.cta_group::1.kind::i8 [ %r768 + 0 ], %rd172, %rd173, %r1, %p2;
    	wgmma.mma_async.sync.aligned.m64n64k16.f16.f16.f16 {%r1}, %rd97, %rd98, 0, 1, 1, 0, 1;
    mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 { %r121, %r122 }, { %r97 }, { %r101 }, { %r121 };
    // mma.sync in a comment
    ld.shared.u32 %r5, [%r6];
    """
    assert probe.mma_opcodes(ptx) == {"tcgen05.mma.cta_group::1.kind::i8",
                                      "wgmma.mma_async.sync.aligned.m64n64k16.f16.f16.f16",
                                      "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"}
    with pytest.raises(SystemExit) as refused:
        probe.main(["--arch", "90", "75"])
    assert refused.value.code == 2
    assert "--arch 75" in capsys.readouterr().err


def test_calibration_holdout_finds_the_loss_the_nearest_entry_makes_and_three_neighbours_avoid():
    # Left out, 2x32x2048 (SDPA faster: the kernel 1.2x its time) is nearest to 2x32x2900 (squared
    # log2 distance 0.5), where the kernel was faster (0.8x): alone that entry sends it to the
    # kernel, a loss of 1/1.2. With 1x32x2048 and 4x32x2048 (distance 1 each, kernel 1.5x) the
    # estimate is above SDPA's time, and no left-out entry loses.
    from sageattention import calibration

    holdout = _load("calibration_holdout")

    def entry(b, n, kernel_ms):
        return {"dtype": "fp16", "batch": b, "heads": 32, "seq_len": n, "head_dim": 128, "causal": False,
                "ms": {"sdpa": 1.0, "cuda-sm90-fp16": kernel_ms}}

    data = {"_generated": "test", "schema_version": 1, "capability": [9, 0], "gpu_name": "Test GPU",
            "torch": "2.11.0", "triton": None, "date": "2026-12-07", "command": "test", "method": "test",
            "entries": [entry(1, 2048, 1.5), entry(4, 2048, 1.5), entry(2, 2900, 0.8), entry(2, 2048, 1.2)]}
    table = calibration.parse(data, source="test")
    ratios1, losses1 = holdout.holdout(table, 1, 0.97)
    assert [(name, pick) for name, pick, _ in losses1] == [("fp16 2x32x2048x128 non-causal", "cuda-sm90-fp16")]
    assert losses1[0][2] == pytest.approx(1 / 1.2)
    ratios3, losses3 = holdout.holdout(table, 3, 0.97)
    assert losses3 == [] and len(ratios3) == 4
    assert holdout.geomean(ratios3) > holdout.geomean(ratios1)


@pytest.mark.parametrize("files, expected", [
    (None, ["tests/gpu"]),
    ("tests/gpu/test_triton.py  tests/gpu/test_compile_gpu.py", ["tests/gpu/test_triton.py", "tests/gpu/test_compile_gpu.py"]),
])
def test_session_tests_step_runs_what_test_files_names(tmp_path, files, expected):
    proc, calls = _run_session(tmp_path, tmp_path, "NVIDIA H100 80GB HBM3", {"STEPS": "tests", "TEST_FILES": files})
    assert proc.returncode == 0, proc.stderr
    (pytest_call,) = [line for line in calls.read_text().splitlines() if " -m pytest " in line]
    args = pytest_call.split(" -m pytest ")[1].split()
    # paths from the directory the script was started in (the repository root on the device)
    assert args[:len(expected)] == [str(tmp_path / f) for f in expected] and args[len(expected)] == "-q"
