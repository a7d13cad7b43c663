"""Each family's min_nvcc in families.json covers what its sources use (31st session audit).

The sm89 family's "fp32+fp16" mode issues ``mma ... .f16.e4m3.e4m3.f16``, which ptxas accepts only
from PTX ISA 8.7 (CUDA 12.8; ptxas 13.0 says so for PTX 8.4 and 8.6), and the sm80 family calls
``__vimax3_s32``, a CUDA 12.0 intrinsic; families.json said 12.4 and 11.0, so an older cell passed
the matrix check and then failed to compile.
"""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from scripts.factory import arch

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = arch.load_families()

# What a source names -> the first CUDA release whose headers have it. A header name is looked up
# where a template is defined, so any file a family includes needs it, used or not.
NEEDS = [
    (re.compile(r"__vi(?:max|min)3_[su]32"), "12.0", "the DPX three-way integer max/min intrinsics"),
    (re.compile(r"#include\s*<cuda_fp8\.h>"), "11.8", "cuda_fp8.h"),
]
# Inline PTX reaches a family's code only where a kernel instantiates it (csrc/common/ptx.cuh is
# included by every mma family, its FP8 products instantiated by sm89's "fp32+fp16" mode alone: the
# sm80 family's PTX has none), so that one is a rule on what the family runs, checked with ptxas.
FP8_F16_ACCUM = re.compile(r'"(mma\.sync\.aligned\.m16n8k32\.row\.col\.f16\.e4m3\.e4m3\.f16)[^"]*"')


def sources_of(folder: Path) -> set[Path]:
    """The family's own files and every csrc header they include, transitively."""
    todo = [p for p in folder.iterdir() if p.suffix in {".cu", ".cuh", ".h", ".cpp"}]
    seen: set[Path] = set()
    while todo:
        path = todo.pop().resolve()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        for name in re.findall(r'#include\s*"([^"]+)"', path.read_text()):
            todo.append(path.parent / name)
    return seen


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_min_nvcc_covers_what_the_sources_use(name):
    fam = FAMILIES[name]
    text = "\n".join(p.read_text() for p in sources_of(ROOT / fam.sources))
    for pattern, release, what in NEEDS:
        if pattern.search(text):
            assert Version(fam.min_nvcc) >= Version(release), \
                f"family {name} uses {what} (CUDA {release}) but families.json says min_nvcc {fam.min_nvcc}"


def test_the_scan_finds_the_features_it_looks_for():
    # the rule above can fail: the sm80 family does contain both
    sm80 = "\n".join(p.read_text() for p in sources_of(ROOT / FAMILIES["sm80"].sources))
    assert all(pattern.search(sm80) for pattern, _, _ in NEEDS)


def test_a_family_running_fp8_products_with_fp16_accumulation_needs_cuda_12_8():
    specs = json.loads(arch.FAMILIES_JSON.read_text())["families"]
    runs_it = [name for name, spec in specs.items()
               if "qk_int8_pv_fp8" in spec["ops"] and "fp32+fp16" in spec["pv_accum_dtype"]]
    assert runs_it == ["sm89"]
    for name in runs_it:
        assert Version(FAMILIES[name].min_nvcc) >= Version("12.8"), (name, FAMILIES[name].min_nvcc)


PTX_87_FIRST_CUDA = "12.8"   # PTX ISA 8.7 came with CUDA 12.8, 8.6 with 12.7


@pytest.mark.skipif(shutil.which("ptxas") is None and not Path("/usr/local/cuda/bin/ptxas").exists(),
                    reason="needs ptxas (a CUDA toolkit)")
def test_the_fp8_fp16_accumulating_mma_needs_ptx_8_7(tmp_path):
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    (instr,) = set(FP8_F16_ACCUM.findall((ROOT / "csrc/common/ptx.cuh").read_text()))

    def assembles(version: str) -> bool:
        src = tmp_path / f"v{version}.ptx"
        src.write_text(f".version {version}\n.target sm_89\n.address_size 64\n"
                       ".visible .entry k() {\n .reg .b32 r<12>;\n"
                       + "".join(f" mov.b32 r{i}, 0;\n" for i in range(8))
                       + f" {instr} {{r8,r9}}, {{r0,r1,r2,r3}}, {{r4,r5}}, {{r6,r7}};\n ret;\n}}\n")
        proc = subprocess.run([ptxas, "-arch=sm_89", str(src), "-o", str(tmp_path / "k.o")],
                              capture_output=True, text=True)
        return proc.returncode == 0

    assert assembles("8.7") and not assembles("8.6")
    assert Version(FAMILIES["sm89"].min_nvcc) >= Version(PTX_87_FIRST_CUDA)
