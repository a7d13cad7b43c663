"""Audit 30 of the Hopper families' host side (csrc/sm90, csrc/sm90_fp8), on the CPU.

A tensor map the driver refuses (cuTensorMapEncodeTiled, csrc/common/attn_wgmma.cuh) made the
launcher return cudaErrorNotSupported before any launch, and the op raised "sageattention_sm90
attention launch failed: operation not supported": nothing said that a tensor map was refused,
which one, or what to do (only a line on stderr did). The sm90 family's V map is the one built on
the caller's strides; the op now runs again on a contiguous copy of V, and a refusal that remains
(both families) is said in words. The bindings need CUDA to run; here their source is read and
compiled with g++ -fsyntax-only against torch's and CUDA's headers (skipped where those are missing).
Also the lookup of cuTensorMapEncodeTiled (csrc/common/sm90_tma.cuh), below.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bindings(family: str) -> str:
    return (ROOT / "csrc" / family / "bindings.cpp").read_text()


def test_sm90_runs_again_on_a_contiguous_v_when_a_tensor_map_is_refused():
    text = _bindings("sm90")
    launch = re.search(r"\[&\]\(const AttnParams& p, cudaStream_t stream\) \{(.*?)\n      \}\);", text, re.S)
    assert launch, "the sm90 op's launch lambda"
    body = launch.group(1)
    # the retry: only after the refusal, only for a V that was passed with its own strides
    assert "err == cudaErrorNotSupported && !v16.is_contiguous()" in body
    assert "v16.contiguous()" in body and "retry.v = vc.data_ptr()" in body
    for field in ("v_sb", "v_sh", "v_sn"):
        assert f"retry.{field} = C." in body
    # and a refusal that remains is said in words, not as "operation not supported"
    assert "TORCH_CHECK(err != cudaErrorNotSupported, kMapRefused)" in body
    message = re.search(r"kMapRefused =\s*((?:\"[^\"]*\"\s*)+);", text).group(1)
    words = "".join(re.findall(r'"([^"]*)"', message))
    assert "refused a tensor map" in words and "cuTensorMapEncodeTiled" in words
    assert "stderr" in words and "force_backend('sdpa')" in words


def test_sm90_fp8_says_a_refused_tensor_map_in_words():
    text = _bindings("sm90_fp8")
    assert "&attn_said<&attn_hd64>, &attn_said<&attn_hd128>" in text
    said = re.search(r"cudaError_t attn_said\(.*?\n\}", text, re.S).group(0)
    assert "TORCH_CHECK(err != cudaErrorNotSupported, kMapRefused)" in said
    message = re.search(r"kMapRefused =\s*((?:\"[^\"]*\"\s*)+);", text).group(1)
    words = "".join(re.findall(r'"([^"]*)"', message))
    assert words.startswith("sageattention_sm90_fp8: ") and "refused a tensor map" in words


def _include_dirs() -> list[str]:
    torch = pytest.importorskip("torch")
    torch_inc = Path(torch.__file__).parent / "include"
    dirs = [torch_inc, torch_inc / "torch" / "csrc" / "api" / "include"]
    cuda = [Path("/usr/local/cuda/include")]
    import site
    for sp in site.getsitepackages():
        cuda += sorted(Path(sp).glob("nvidia/*/include"))
    have = [c for c in cuda if (c / "cuda_runtime_api.h").exists() or (c / "cusparse.h").exists()]
    if not any((c / "cuda_runtime_api.h").exists() for c in have):
        pytest.skip("no CUDA headers (cuda_runtime_api.h) on this host")
    return [str(d) for d in dirs + have] + [sysconfig.get_paths()["include"]]


@pytest.mark.parametrize("family", ["sm90", "sm90_fp8"])
def test_bindings_compile_on_the_host(family):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    args = [cxx, "-std=c++20", "-fsyntax-only"]
    for d in _include_dirs():
        args += ["-I", d]
    res = subprocess.run(args + [str(ROOT / "csrc" / family / "bindings.cpp")], capture_output=True, text=True,
                         timeout=600)
    if res.returncode != 0 and "No such file or directory" in res.stderr and "fatal error" in res.stderr:
        pytest.skip(f"a header is missing on this host: {res.stderr.splitlines()[0]}")
    assert res.returncode == 0, res.stderr[-4000:]


# --- the tensor-map encoder's lookup (csrc/common/sm90_tma.cuh) ------------------------------
# cudaGetDriverEntryPointByVersion exists from CUDA 12.5 on: called unconditionally, a build with
# nvcc 12.4 (families.json's min_nvcc for sm90 and sm90_fp8) did not compile, and a 12.5-12.9
# runtime on an older driver, whose versioned lookup can fail, refused every call of both families
# ("operation not supported"). Now the versioned lookup where the runtime has it, CUDA 12's
# unversioned one where it does not or where it failed.

def _cuda_include() -> Path:
    inc = Path("/usr/local/cuda/include")
    if not (inc / "cuda_runtime_api.h").exists() or not (inc / "cudaTypedefs.h").exists():
        pytest.skip("no CUDA toolkit headers at /usr/local/cuda/include")
    return inc


def _encoder_lookup(tmp_path: Path, cudart_version: int) -> str:
    """tensor_map_encoder()'s body as the preprocessor leaves it for a runtime of that version."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    src = tmp_path / f"lookup_{cudart_version}.cpp"
    src.write_text("#include <cuda_runtime.h>\n#undef CUDART_VERSION\n"
                   f"#define CUDART_VERSION {cudart_version}\n#include \"sm90_tma.cuh\"\n")
    res = subprocess.run([cxx, "-std=c++17", "-E", "-P", "-I", str(ROOT / "csrc" / "common"), "-I",
                          str(_cuda_include()), str(src)], capture_output=True, text=True, check=True)
    text = res.stdout
    start = text.index("tensor_map_encoder() {")
    return text[start:text.index("cached.store(", start)]


@pytest.mark.parametrize("version,versioned,unversioned", [
    (12040, False, True),    # nvcc 12.4: no ...ByVersion in its headers
    (12080, True, True),     # 12.5-12.9: versioned, then CUDA 12's lookup if it failed
    (13000, True, False)])   # 13: the versioned lookup only (the unversioned one is deprecated)
def test_the_encoder_lookup_fits_the_runtime_version(tmp_path, version, versioned, unversioned):
    body = _encoder_lookup(tmp_path, version)
    assert ("cudaGetDriverEntryPointByVersion(" in body) == versioned, body
    assert (re.search(r"cudaGetDriverEntryPoint\(", body) is not None) == unversioned, body
    # a failed lookup's error is cleared: the next launch's cudaGetLastError must not report it
    assert body.count("(void)cudaGetLastError()") == int(versioned) + int(unversioned)


def test_the_header_compiles_and_runs_without_a_driver_for_a_12_4_runtime(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    inc = _cuda_include()
    lib = inc.parent / "lib64"
    if not any(lib.glob("libcudart.so*")):
        pytest.skip("no libcudart to link")
    src = tmp_path / "run.cpp"
    # declared in every CUDA 12 header, but a 12.4 runtime has no ...ByVersion: the lookup must not use it
    src.write_text("#include <cuda_runtime.h>\n#undef CUDART_VERSION\n#define CUDART_VERSION 12040\n"
                   "#define cudaGetDriverEntryPointByVersion no_such_function_in_cuda_12_4\n"
                   "#include \"sm90_tma.cuh\"\n#include <cstdio>\n"
                   "int main() { std::printf(\"%d\\n\", sage::sm90::tensor_map_encoder() != nullptr); }\n")
    exe = tmp_path / "run"
    subprocess.run([cxx, "-std=c++17", "-I", str(ROOT / "csrc" / "common"), "-I", str(inc), str(src), "-o",
                    str(exe), "-L", str(lib), "-lcudart", f"-Wl,-rpath,{lib}"], check=True, capture_output=True,
                   text=True)
    res = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() in ("0", "1"), (res.returncode, res.stdout, res.stderr)
