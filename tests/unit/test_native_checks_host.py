"""The raw ops' argument checks (csrc/common/op_checks.h) compiled on the host against torch's
headers, meta tensors standing in for CUDA ones, case by case against their Python mirror
(sageattention/native/checks.py, what the fakes run): the same calls refused with the same words.

One table of cases drives both sides: each case is written out as a C++ call into a driver.
Skipped without a C++ compiler or torch's headers (one compile, about a minute on 2 cores).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from sageattention.native import checks

ROOT = Path(__file__).resolve().parents[2]
META, CPU = "meta", "cpu"
F16, BF16, F32, I32 = "float16", "bfloat16", "float32", "int32"
BIG = (1 << 30) + 1


def t(shape, dtype=F16, device=META, strides=None):
    return ("t", tuple(shape), dtype, device, strides)


Q = t((1, 2, 70, 64))
KV = t((1, 1, 33, 64))
X = t((1, 3, 70, 64))

# name -> (check, args): check_qkv(q, k, v, layout, v_fp16_with_bf16), check_quant_int8_args(x, mean,
# layout, scale_mult), check_quant_v_fp8_args(v, layout), check_finite(value, name), parse_layout,
# parse_gran
CASES = {
    "qkv_ok": ("qkv", (Q, KV, KV, "HND", False)),
    "qkv_3d": ("qkv", (Q, t((1, 33, 64)), KV, "HND", False)),
    "qkv_cpu_k": ("qkv", (Q, t((1, 1, 33, 64), device=CPU), KV, "HND", False)),
    "qkv_f32_v": ("qkv", (Q, KV, t((1, 1, 33, 64), F32), "HND", False)),
    "qkv_mixed": ("qkv", (Q, KV, t((1, 1, 33, 64), BF16), "HND", False)),
    "qkv_mixed_v16": ("qkv", (t((1, 2, 70, 64), F16), t((1, 1, 33, 64), F16), t((1, 1, 33, 64), BF16), "HND", True)),
    "qkv_v16_ok": ("qkv", (t((1, 2, 70, 64), BF16), t((1, 1, 33, 64), BF16), KV, "HND", True)),
    "qkv_hd96": ("qkv", (t((1, 2, 70, 96)), t((1, 1, 33, 96)), t((1, 1, 33, 96)), "HND", False)),
    "qkv_hd_differ": ("qkv", (Q, t((1, 1, 33, 128)), KV, "HND", False)),
    "qkv_batch": ("qkv", (Q, t((2, 1, 33, 64)), t((2, 1, 33, 64)), "HND", False)),
    "qkv_kv_tokens": ("qkv", (Q, KV, t((1, 1, 34, 64)), "HND", False)),
    "qkv_batch0": ("qkv", (t((0, 2, 70, 64)), t((0, 1, 33, 64)), t((0, 1, 33, 64)), "HND", False)),
    "qkv_qheads0": ("qkv", (t((1, 0, 70, 64)), KV, KV, "HND", False)),
    "qkv_kvheads0": ("qkv", (Q, t((1, 0, 33, 64)), t((1, 0, 33, 64)), "HND", False)),
    "qkv_q_tokens0": ("qkv", (t((1, 2, 0, 64)), KV, KV, "HND", False)),
    "qkv_gqa": ("qkv", (t((1, 3, 70, 64)), t((1, 2, 33, 64)), t((1, 2, 33, 64)), "HND", False)),
    "qkv_nhd_ok": ("qkv", (t((1, 70, 2, 64)), t((1, 33, 1, 64)), t((1, 33, 1, 64)), "NHD", False)),
    "qkv_tokens": ("qkv", (t((1, 1, BIG, 64), strides=(0, 0, 0, 1)), KV, KV, "HND", False)),
    "qkv_kv_tokens_big": ("qkv", (Q, t((1, 1, BIG, 64), strides=(0, 0, 0, 1)),
                                  t((1, 1, BIG, 64), strides=(0, 0, 0, 1)), "HND", False)),
    "qkv_grid": ("qkv", (t((65536, 1, 70, 64), strides=(0, 0, 64, 1)), t((65536, 1, 33, 64), strides=(0, 0, 64, 1)),
                         t((65536, 1, 33, 64), strides=(0, 0, 64, 1)), "HND", False)),
    "quant_ok": ("quant_int8", (X, None, "HND", 1.0)),
    "quant_hd0": ("quant_int8", (t((1, 3, 70, 0)), None, "HND", 1.0)),
    "quant_hd12": ("quant_int8", (t((1, 3, 70, 12)), None, "HND", 1.0)),
    "quant_hd264": ("quant_int8", (t((1, 3, 70, 264)), None, "HND", 1.0)),
    "quant_f32": ("quant_int8", (t((1, 3, 70, 64), F32), None, "HND", 1.0)),
    "quant_cpu": ("quant_int8", (t((1, 3, 70, 64), device=CPU), None, "HND", 1.0)),
    "quant_empty_ok": ("quant_int8", (t((0, 3, 0, 64)), None, "NHD", 1.0)),
    "quant_nan_mult": ("quant_int8", (X, None, "HND", float("nan"))),
    "quant_inf_mult": ("quant_int8", (X, None, "HND", float("-inf"))),
    "quant_tokens": ("quant_int8", (t((1, 1, BIG, 8), strides=(0, 0, 0, 1)), None, "HND", 1.0)),
    "quant_grid": ("quant_int8", (t((1, 65536, 70, 64), strides=(0, 0, 64, 1)), None, "HND", 1.0)),
    "mean_ok": ("quant_int8", (X, t((1, 3, 64), F32), "HND", 1.0)),
    "mean_bf16_ok": ("quant_int8", (t((1, 70, 3, 64)), t((1, 3, 64), BF16), "NHD", 1.0)),
    "mean_cpu": ("quant_int8", (X, t((1, 3, 64), F32, CPU), "HND", 1.0)),
    "mean_int": ("quant_int8", (X, t((1, 3, 64), I32), "HND", 1.0)),
    "mean_order": ("quant_int8", (X, t((1, 64, 3), F32), "HND", 1.0)),
    "mean_flat": ("quant_int8", (X, t((192,), F32), "HND", 1.0)),
    "mean_4d": ("quant_int8", (X, t((1, 3, 1, 64), F32), "HND", 1.0)),
    "mean_nhd_order": ("quant_int8", (t((1, 70, 3, 64)), t((1, 70, 64), F32), "NHD", 1.0)),
    "v8_ok": ("quant_v_fp8", (t((1, 2, 70, 128)), "HND")),
    "v8_hd0": ("quant_v_fp8", (t((1, 2, 70, 0)), "HND")),
    "v8_hd256": ("quant_v_fp8", (t((1, 2, 70, 256)), "HND")),
    "v8_tokens0": ("quant_v_fp8", (t((1, 0, 2, 64)), "NHD")),
    "v8_empty_batch_ok": ("quant_v_fp8", (t((0, 2, 70, 64)), "HND")),
    "v8_bf16_3d": ("quant_v_fp8", (t((2, 70, 64), BF16), "HND")),
    "v8_i32": ("quant_v_fp8", (t((1, 2, 70, 64), I32), "HND")),
    "finite_ok": ("finite", (-0.5, "sm_scale")),
    "finite_nan": ("finite", (float("nan"), "sm_scale")),
    "finite_inf": ("finite", (float("inf"), "sm_scale")),
    "layout": ("layout", ("BHND",)),
    "gran": ("gran", ("per_token",)),
    "gran_ok": ("gran", ("per_block",)),
}


# --- the Python side ---------------------------------------------------------------------------

def _tensor(spec):
    _, shape, dtype, device, strides = spec
    dt = getattr(torch, dtype)
    if strides is None:
        return torch.empty(shape, dtype=dt, device=device)
    return torch.empty_strided(shape, strides, dtype=dt, device=device)


def _py(arg):
    return _tensor(arg) if isinstance(arg, tuple) and arg and arg[0] == "t" else arg


def python_message(check, args):
    args = [_py(a) for a in args]
    calls = {"qkv": lambda q, k, v, lay, v16: checks.check_qkv(q, k, v, lay, v_fp16_with_bf16=v16),
             "quant_int8": checks.check_quant_int8_args, "quant_v_fp8": checks.check_quant_v_fp8_args,
             "finite": checks.check_finite, "layout": checks.parse_layout, "gran": checks.parse_gran}
    try:
        calls[check](*args)
    except checks.OpArgumentError as exc:
        return str(exc)
    return "OK"


# --- the C++ side ------------------------------------------------------------------------------

_CPP_DTYPES = {F16: "at::kHalf", BF16: "at::kBFloat16", F32: "at::kFloat", I32: "at::kInt"}


def _cpp(arg):
    if isinstance(arg, tuple) and arg and arg[0] == "t":
        _, shape, dtype, device, strides = arg
        sizes = "{" + ", ".join(f"{s}LL" for s in shape) + "}"
        dev = "at::kMeta" if device == META else "at::kCPU"
        if strides is None:
            return f"T({sizes}, {_CPP_DTYPES[dtype]}, {dev})"
        return f"S({sizes}, {{{', '.join(f'{s}LL' for s in strides)}}}, {_CPP_DTYPES[dtype]}, {dev})"
    if arg is None:
        return "c10::nullopt"
    if isinstance(arg, bool):
        return "true" if arg else "false"
    if isinstance(arg, float):
        return {"nan": "NAN", "inf": "INFINITY", "-inf": "-INFINITY"}.get(repr(arg), repr(arg))
    return f'std::string("{arg}")'


def _cpp_call(check, args):
    a = [_cpp(x) for x in args]
    if check == "qkv":
        return f'check_qkv({a[0]}, {a[1]}, {a[2]}, {a[3]} == "HND", {a[4]})'
    if check == "quant_int8":
        mean = a[1] if args[1] is None else f"c10::optional<at::Tensor>({a[1]})"
        return f'check_quant_int8_args({a[0]}, {mean}, {a[2]} == "HND", {a[3]})'
    if check == "quant_v_fp8":
        return f'check_quant_v_fp8_args({a[0]}, {a[1]} == "HND")'
    if check == "finite":
        return f'check_finite({a[0]}, "{args[1]}")'
    return {"layout": "parse_layout", "gran": "parse_gran"}[check] + f"({a[0]})"


DRIVER = """#include <cmath>
#include <iostream>
#include "op_checks.h"
using namespace sage::glue;
static at::Tensor T(std::vector<int64_t> s, at::ScalarType d, at::DeviceType dev) {
  return at::empty(s, at::TensorOptions().dtype(d).device(dev));
}
static at::Tensor S(std::vector<int64_t> s, std::vector<int64_t> st, at::ScalarType d, at::DeviceType dev) {
  return at::empty_strided(s, st, at::TensorOptions().dtype(d).device(dev));
}
template <class F> static void run(const char* name, F f) {
  std::string m = "OK";
  try { f(); } catch (const c10::Error& e) { m = e.what_without_backtrace(); m = m.substr(0, m.find('\\n')); }
  std::cout << name << '\\t' << m << '\\n';
}
int main() {
"""


@pytest.fixture(scope="module")
def cpp_messages(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH (g++ or c++)")
    torch_dir = Path(torch.__file__).parent
    include, lib = torch_dir / "include", torch_dir / "lib"
    if not (include / "ATen" / "ATen.h").exists():
        pytest.skip(f"torch's C++ headers are not in {include}")
    body = "".join(f'  run("{name}", [&] {{ {_cpp_call(check, args)}; }});\n'
                   for name, (check, args) in CASES.items())
    folder = tmp_path_factory.mktemp("op_checks")
    cpp = folder / "driver.cpp"
    cpp.write_text(DRIVER + body + "}\n")
    exe = folder / "driver"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    subprocess.run([cxx, "-O0", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                    "-DSAGE_OP_DEVICE_TYPE=c10::DeviceType::Meta", "-I", str(ROOT / "csrc" / "common"),
                    "-isystem", str(include), "-isystem", str(include / "torch" / "csrc" / "api" / "include"),
                    str(cpp), "-o", str(exe), f"-L{lib}", f"-Wl,-rpath,{lib}", "-ltorch_cpu", "-lc10"],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                         env=dict(os.environ, TORCH_SHOW_CPP_STACKTRACES="0")).stdout
    return dict(line.split("\t", 1) for line in out.splitlines())


@pytest.mark.parametrize("name", list(CASES))
def test_cpp_check_and_its_python_mirror_say_the_same(cpp_messages, name):
    check, args = CASES[name]
    expected = python_message(check, args)
    assert cpp_messages[name] == expected
    assert (expected == "OK") == name.endswith("ok")


def test_the_messages_name_what_is_wrong_and_what_is_accepted():
    # a few of the refusals spelled out (the others are held to these by the test above)
    said = {name: python_message(*CASES[name]) for name in CASES}
    assert said["mean_cpu"] == "mean is on cpu but x is on meta; pass K's mean on x's device"
    assert said["mean_order"] == ("mean must be a floating-point [B, H, D] = [1, 3, 64] tensor (x's mean over "
                                  "its tokens), got shape (1, 64, 3) (torch.float32)")
    assert said["mean_flat"].endswith("got shape (192,) (torch.float32)")
    assert said["quant_hd0"] == "head dim must be a multiple of 8 from 8 to 256, got 0"
    assert said["qkv_qheads0"].startswith("q, k and v need a batch, heads and tokens (at least one of each)")
    assert said["qkv_cpu_k"] == "k must be a CUDA tensor, got one on cpu"
    assert said["quant_tokens"] == f"x has {BIG} tokens; the kernels take at most {1 << 30} (split the sequence)"
    assert said["finite_nan"] == "sm_scale must be finite, got nan"
    assert said["qkv_mixed"] == "q, k and v must have one dtype, got torch.float16, torch.float16, torch.bfloat16"


def test_the_python_limits_are_the_headers():
    header = (ROOT / "csrc" / "common" / "grid_limits.h").read_text()
    assert f"constexpr int64_t kMaxGridYZ = {checks.MAX_GRID_YZ};" in header
    assert checks.MAX_TOKENS == 1 << 30 and "constexpr int64_t kMaxTokens = int64_t{1} << 30;" in header
