"""The capability table: which backend serves which GPU, dtypes, head dims and features. Data only.

Native kernel facts (SMs served, head dims, granularities, accumulators) are read from
`native/families.json`, the table the build reads too, so each rule lives in one place. The Triton
backend's limits come from `sageattention.triton` when it is importable. The dispatcher
(`dispatch.py`) walks `preference_order(capability)` and takes the first backend whose record fits.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

import torch

SDPA = "sdpa"
# CUDA's limit on a launch grid's y and z dims: every quantized kernel (native and Triton) puts the
# query heads and the batch there, so a call with more of either runs on SDPA.
MAX_GRID_YZ = 65535
# Tokens per sequence the native ops take (csrc/common/grid_limits.h kMaxTokens: 32-bit token
# indices); a longer sequence runs on SDPA.
MAX_NATIVE_TOKENS = 2**30
BACKEND_NAMES = ("cuda-sm90-fp16", "cuda-sm90-fp8", "cuda-sm89-fp8", "cuda-sm80-fp16",
                 "cuda-sm75-fp16", "triton-fp16", "triton-fp8", SDPA)


@dataclass(frozen=True)
class Backend:
    """One row of the capability table."""

    name: str
    kind: str                              # "native" | "triton" | "sdpa"
    family: str | None                     # native family in families.json
    op: str | None                         # "qk_int8_pv_fp16" | "qk_int8_pv_fp8" (None: sdpa)
    capabilities: frozenset                # (major, minor) served by compiled code
    min_capability: tuple[int, int] | None  # lowest capability served at all (PTX or portable code)
    dtypes: frozenset
    head_dims: frozenset | range | None    # None: any head dim
    qk_quant_grans: tuple[str, ...]        # first is the default
    pv_accum_dtypes: tuple[str, ...]
    default_pv_accum_dtype: str | None
    takes_mask: bool
    takes_smooth_v: bool
    takes_dropout: bool = False
    takes_grad: bool = False
    max_batch_and_heads: int | None = MAX_GRID_YZ  # None: no limit (SDPA)
    max_tokens: int | None = None          # per sequence, q's and k's; None: none declared
    # The head dims the compiled kernels take (native families: families.json's); a smaller head
    # dim in head_dims runs zero-padded to the next of them. Empty: the backend takes head_dims as is.
    kernel_head_dims: tuple[int, ...] = ()

    def padded_head_dim(self, head_dim: int) -> int:
        """The head dim this backend's kernel runs a call of ``head_dim`` at (itself if none pads).
        Zero channels in q and k add nothing to a score, nor to a quantization block's absolute
        maximum or K's mean, and V's are sliced off the output: the padded call is the same call."""
        return min((d for d in self.kernel_head_dims if d >= head_dim), default=head_dim)

    def serves(self, capability: tuple[int, int] | None) -> bool:
        """Whether this backend runs on a device of this capability (None: CPU)."""
        if self.kind == "sdpa":
            return True
        if capability is None:
            return False
        if capability in self.capabilities:
            return True
        return self.min_capability is not None and capability >= self.min_capability


def _sm(tag: str) -> tuple[int, int]:
    """'sm86' -> (8, 6)."""
    digits = tag.removeprefix("sm")
    return int(digits[:-1]), int(digits[-1])


@functools.cache
def load_families() -> dict:
    """The parsed `native/families.json` (the table the build reads too)."""
    text = resources.files("sageattention.native").joinpath("families.json").read_text()
    return json.loads(text)["families"]


# sageattn's accumulator when the caller names none: full fp32 for FP16 PV, two-level fp32 for FP8 PV
# (an fp16 inner accumulator can overflow with FP8's static P scale of 448).
_DEFAULT_PV_ACCUM = {"qk_int8_pv_fp16": "fp32", "qk_int8_pv_fp8": "fp32+fp32"}
_HALF = frozenset({torch.float16, torch.bfloat16})
_NATIVE = (("cuda-sm90-fp16", "sm90", "qk_int8_pv_fp16"),
           ("cuda-sm90-fp8", "sm90_fp8", "qk_int8_pv_fp8"),
           ("cuda-sm89-fp8", "sm89", "qk_int8_pv_fp8"),
           ("cuda-sm80-fp16", "sm80", "qk_int8_pv_fp16"),
           ("cuda-sm75-fp16", "sm75", "qk_int8_pv_fp16"))


def _triton_limits() -> dict[str, tuple[tuple[int, int], frozenset | range, int | None, tuple[int, ...]]]:
    """(lowest capability, head dims, tokens per sequence, the widths the kernels pad a head dim to)
    of the Triton kernels, per PV dtype. Core does not pad for them (they pad inside); the
    dispatcher's calibration reads the widths."""
    try:
        from sageattention import triton as tb

        def limits(capability, max_head_dim):
            dims = range(1, int(max_head_dim) + 1)
            widths = tuple(sorted({tb.padded_head_dim(d) for d in dims}))
            return tuple(capability), dims, int(tb.MAX_TOKENS), widths
        return {"fp16": limits(tb.MIN_CAPABILITY, tb.MAX_HEAD_DIM),
                "fp8": limits(tb.MIN_CAPABILITY_FP8, tb.MAX_HEAD_DIM_FP8)}
    except Exception:  # package absent or broken: the records stay, availability says why
        return {"fp16": ((8, 0), frozenset({64, 128}), None, ()), "fp8": ((8, 9), frozenset({64, 128}), None, ())}


@functools.cache
def capability_table() -> tuple[Backend, ...]:
    """All backends, one record each, in BACKEND_NAMES order."""
    families = load_families()
    rows = []
    for name, family, op in _NATIVE:
        spec = families[family]
        # Exactly these capabilities; an arch_specific family (sm90, sm90_fp8: sm_90a SASS) runs
        # nowhere else.
        served = frozenset(_sm(s) for s in spec["serves"])
        # A family that embeds PTX (sm75: compute_75) also runs, JIT-compiled, on every newer GPU.
        ptx_floor = _sm("sm" + spec["embed_ptx"].split("_")[1]) if spec.get("embed_ptx") else None
        grans = tuple(spec["qk_quant_gran"])
        rows.append(Backend(
            name=name, kind="native", family=family, op=op, capabilities=served,
            # every head dim up to the widest kernel's, the others zero-padded (as upstream does)
            min_capability=ptx_floor, dtypes=_HALF, head_dims=range(1, max(spec["head_dims"]) + 1),
            kernel_head_dims=tuple(sorted(spec["head_dims"])),
            qk_quant_grans=("per_thread",) + tuple(g for g in grans if g != "per_thread")
            if "per_thread" in grans else grans,
            pv_accum_dtypes=tuple(spec["pv_accum_dtype"]), default_pv_accum_dtype=_DEFAULT_PV_ACCUM[op],
            takes_mask=False, takes_smooth_v=True, max_tokens=MAX_NATIVE_TOKENS))
    limits = _triton_limits()
    rows.append(Backend(
        name="triton-fp16", kind="triton", family=None, op="qk_int8_pv_fp16", capabilities=frozenset(),
        min_capability=limits["fp16"][0], dtypes=_HALF, head_dims=limits["fp16"][1],
        kernel_head_dims=limits["fp16"][3],
        max_tokens=limits["fp16"][2],
        qk_quant_grans=("per_block",), pv_accum_dtypes=("fp32",), default_pv_accum_dtype="fp32",
        # smooth_v: with fp32 accumulation taking V's mean out and adding it back is an identity,
        # which the native "fp32" modes skip too; it is the FP8 and fp16 accumulators it helps
        takes_mask=True, takes_smooth_v=True))
    # FP8 e4m3 P and V; each K block's product is added to the fp32 output on the CUDA cores.
    rows.append(Backend(
        name="triton-fp8", kind="triton", family=None, op="qk_int8_pv_fp8", capabilities=frozenset(),
        min_capability=limits["fp8"][0], dtypes=_HALF, head_dims=limits["fp8"][1],
        kernel_head_dims=limits["fp8"][3],
        max_tokens=limits["fp8"][2],
        qk_quant_grans=("per_block",), pv_accum_dtypes=("fp32+fp32",), default_pv_accum_dtype="fp32+fp32",
        takes_mask=False, takes_smooth_v=False))
    rows.append(Backend(
        name=SDPA, kind="sdpa", family=None, op=None, capabilities=frozenset(), min_capability=None,
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}), head_dims=None,
        qk_quant_grans=(), pv_accum_dtypes=(), default_pv_accum_dtype=None, takes_mask=True, takes_smooth_v=True,
        takes_dropout=True, takes_grad=True, max_batch_and_heads=None))
    assert tuple(r.name for r in rows) == BACKEND_NAMES
    return tuple(rows)


def backend(name: str) -> Backend:
    for row in capability_table():
        if row.name == name:
            return row
    raise ValueError(f"unknown backend {name!r}; the backends are: {', '.join(BACKEND_NAMES)}")


# Preference per GPU generation, best first. Rules are checked top to bottom; the first whose
# capability range holds the device applies. The sm75 family reaches newer GPUs only as PTX, so it
# comes after every backend compiled for them. triton-fp8 comes last: on the H200 it measured slower
# than triton-fp16 at d=128 and only level at d=64 (benchmarks/results/h200-2026-12-03-bench-e3ad302.md),
# with FP8 accuracy, so it runs when forced, or where a calibration table measured it fastest.
# triton-fp16 measured 1.6-1.8x faster than cuda-sm80-fp16 there, but the static order (return_lse,
# calibration off) keeps the native family first: it is what the wheel exists to carry and validate.
# sm90: cuda-sm90-fp16 (the sm_90a wgmma kernel, same contract as cuda-sm80-fp16's "fp32" mode) first:
# on the H200 it measured 522/429/605/566 TOPS at d=128 against mma.sync's 392/334/439/414, and
# 351/294/408/375 against 335/286/372/344 at d=64 (benchmarks/results/h200-2026-12-03-wgmma-ws2.log).
# It serves only (9, 0), so on newer GPUs that take this rule `Backend.serves` drops it (so does
# cuda-sm90-fp8). Then cuda-sm80-fp16 before the FP8 backends: FP16 PV is the more accurate path
# (cosine >= 0.9998 against FP8's ~0.9996 with V's two e4m3 terms, ~0.9993 with one), on the H200 it measured faster than cuda-sm89-fp8 in all
# 10 cases (release_notes/...+sm90...report.json: 0.44x vs 0.33x SDPA), and it takes the
# accumulation modes cuda-sm90-fp16 lacks. cuda-sm90-fp8 (the wgmma kernel with FP8 PV) before
# cuda-sm89-fp8: on the H200, fp16, non-causal/causal TOPS with "fp32+fp32", it measured 514/379 at
# 4x32x4096x128, 691/620 at 1x32x16384x128, 339/262 and 429/385 at d=64 (n=4096, 16384) and 234/139
# at 8x32x1024x128 (benchmarks/results/h200-2026-12-03-wgmma-fp8-maskbranch.log), where the
# mma.sync cuda-sm89-fp8 measured ~246-293 at d=128. With one e4m3 V term it beat cuda-sm90-fp16
# only at 1x32x16384x128 (691/620 against 670/597); with two it is slower everywhere. A per-shape
# speed choice is the calibration table's job. This order applies where the table does not
# (return_lse, masks, calibration off); where it does, the shipped table
# (benchmarks/results/h100-2026-12-05-calibration-7b16d71.json) runs cuda-sm90-fp16 at long
# sequences, head dim 128, and SDPA elsewhere.
# sm89 (Ada): cuda-sm80-fp16 before cuda-sm89-fp8, by arithmetic, not measured on Ada (we have no
# Ada runner). Since V is two e4m3 terms (FP8_V_TERMS), FP8 P.V issues twice the FP8 mmas; Ada's
# FP8 mma runs at twice its FP16 rate with the same accumulator (NVIDIA's Ada whitepaper: RTX 4090
# 330 against 165 dense TFLOPS with fp32 accumulation, L40S 733 against 362), so the two-term P.V
# costs what FP16 P.V costs, plus V's quantization pass, at lower accuracy (cosine ~0.9996 against
# >= 0.9998). FP16 P.V is therefore at least as fast and more accurate; cuda-sm89-fp8 runs when
# forced, through the FP8 functions, or where the FP16 family is not in the build.
# Fewest queries and keys per sequence for which plain `sageattn` runs a quantized backend when no
# calibration measurement decides (a GPU without a table, a mask, calibration off; not with
# return_lse, whose SDPA path is costlier); below it the call runs SDPA. Such a call fills under
# half of one kernel tile (64-128 queries, 64-128 keys) and is bound by memory, where the
# quantized path reads Q, K and V more than once (quantizing Q and K, K's mean) to save tensor
# work that is not the limit. Measured on an H100 at d=64/128
# (benchmarks/results/h100-2026-12-05-calibration-7b16d71.json): on a decoding step 8x32x1/8192
# no quantized backend reached half of SDPA's speed (at most 0.48x; the sm80 family, the mma.sync
# kernel an A100 runs, 0.39-0.45x).
# Forced backends and the kernel-specific functions do not use it.
MIN_QUANTIZED_TOKENS = 64

# Largest |sm_scale| the quantized backends take; larger ones run SDPA (forcing one is an error).
# On an H100 every quantized backend gave finite outputs at 8 and 1000 (cosine 0.997 and 0.97-0.99
# against fp64, a near one-hot softmax) and NaN at 1e30, where SDPA was right
# (benchmarks/results/h100-2026-12-05-scales-84edb06.txt). Zero and negative scales are folded
# into q (core._positive_scale) and need no limit.
MAX_QUANTIZED_SCALE = 1000.0

PREFERENCE = (
    ((9, 0), ("cuda-sm90-fp16", "cuda-sm80-fp16", "cuda-sm90-fp8", "cuda-sm89-fp8", "triton-fp16",
              "cuda-sm75-fp16", "triton-fp8", SDPA)),
    ((8, 9), ("cuda-sm80-fp16", "cuda-sm89-fp8", "triton-fp16", "cuda-sm75-fp16", "triton-fp8", SDPA)),
    ((8, 0), ("cuda-sm80-fp16", "triton-fp16", "cuda-sm75-fp16", SDPA)),
    ((7, 5), ("cuda-sm75-fp16", SDPA)),
    ((0, 0), (SDPA,)),
)


def preference_order(capability: tuple[int, int] | None) -> tuple[str, ...]:
    """Backends to try, best first, for a device of this capability (None: CPU)."""
    if capability is None:
        return (SDPA,)
    for floor, order in PREFERENCE:
        if capability >= floor:
            # Newer GPUs than any rule names: keep the order; `Backend.serves` drops what cannot run.
            return order
    return (SDPA,)
