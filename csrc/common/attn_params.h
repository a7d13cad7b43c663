// Plain parameter structs passed from the torch bindings to the CUDA launchers. No torch and no
// CUDA types here, so both sides of the build split can include it.
#pragma once
#include <cstdint>

namespace sage {

enum class DType : int { kFloat16 = 0, kBFloat16 = 1 };

// qk_quant_gran: which tokens share a scale (docs/architecture.md, "Granularity").
enum class QuantGran : int { kPerBlock = 0, kPerWarp = 1, kPerThread = 2 };

// PV accumulation. FP16 PV (sm80 family): kF32 ("fp32"), kF16F32 ("fp16+fp32"), kF16 ("fp16").
// FP8 PV (sm89 family): kF32 ("fp32"), kF32F32 ("fp32+fp32"), kF32F16 ("fp32+fp16").
enum class PvAccum : int { kF32 = 0, kF16F32 = 1, kF16 = 2, kF32F32 = 3, kF32F16 = 4 };

// FP16-PV families: bfloat16 inputs with fp32 accumulation run P.V in bf16 on V as given (no
// conversion pass, no fp16 overflow for |V| > 65504); the fp16-accumulating modes need fp16
// operands, so bfloat16 V is converted to fp16 for them. Bindings and dispatch both ask this.
inline bool pv_in_bf16(DType dtype, PvAccum accum) {
  return dtype == DType::kBFloat16 && accum == PvAccum::kF32;
}

// FP8 P.V takes V as kFp8VTerms e4m3 terms per value: hi = e4m3(x) and lo = e4m3(x - hi), x = V /
// scale, both multiplied by the same e4m3 P. One term (upstream's recipe) leaves a 3-bit mantissa
// on V as well as on P: cosine about 0.99929 against fp32 SDPA on normal inputs, under the 0.9993
// bar; the second term takes V's error out (about 0.9996) for twice the P.V tensor work. The
// quantized V^T is [B, H, kFp8VTerms * D, padded_tokens]: the hi rows, then the lo rows.
// sageattention/reference.py (FP8_V_TERMS) and the Triton FP8 kernel use the same number.
// SAGE_FP8_V_TERMS=1 builds the one-term kernels for measurement (host and device alike).
#ifndef SAGE_FP8_V_TERMS
#define SAGE_FP8_V_TERMS 2
#endif
constexpr int kFp8VTerms = SAGE_FP8_V_TERMS;
static_assert(kFp8VTerms == 1 || kFp8VTerms == 2, "FP8 V takes one or two e4m3 terms");

// V's per-channel FP8 scale floor, 2^-100 (as csrc/sm75/v16_scale.h's kV16MinScale), apart from
// the INT8 Q/K scales' 1e-8 (quant_kernels.cuh kScaleFloor): 1e-8 put a channel with max |V| near
// 1e-10 or below (a bfloat16 or fp16 V holds such values) into e4m3's subnormals or onto 0
// (relative L1 0.06 at 1e-10, 0.56 at 1e-11, zeros below). 2^-100 is a normal float whose
// reciprocal (2^100) is finite: quant_v_fp8_kernel's ExactDivisor (rcp.approx.ftz) and the
// epilogue's fp32 multiply by the scale stay exact, and a channel of zeros still gives zeros.
// sageattention/reference.py (FP8_V_SCALE_FLOOR) and the Triton FP8 kernel use the same number.
constexpr float kFp8VScaleFloor = 7.8886090522101181e-31f;  // 2^-100

struct QuantInt8Params {
  const void* x;           // fp16/bf16, element strides below, last dim contiguous
  int64_t x_sb, x_sh, x_sn;
  const float* mean;       // [B, H, D] fp32 or null (K smoothing)
  int8_t* out;             // [B, H, padded_tokens, D] contiguous
  float* scale_out;        // [B, H, scale_groups]
  int heads, tokens, padded_tokens, head_dim;
  int block_tokens;        // tokens per CTA (one scale block)
  int groups_per_block;    // 1, 4 (K per_thread) or 8 (Q per_thread)
  int scale_groups;        // groups per (batch, head) = padded_tokens / block_tokens * groups_per_block
  float scale_mult;        // x is multiplied by this before quantizing: sm_scale * log2(e) for Q, 1 for K
};

struct QuantFp8Params {
  const void* x;           // V, fp16/bf16
  int64_t x_sb, x_sh, x_sn;
  const float* scale;      // [B, H, D]: max(amax / 448, 2^-100)
  const float* mean;       // [B, H, D] or null (V smoothing)
  uint8_t* out;            // e4m3 [B, H, kFp8VTerms * D, padded_tokens], permuted in 16-token groups
  int heads, tokens, padded_tokens, head_dim;
};

// V's per-channel FP8 scale max(amax / scale_max, 2^-100), amax = max |v| over the tokens or, with
// V smoothing, max |v - mean| (and the mean itself). Each CTA reduces a chunk of tokens into a
// partial result; the last CTA of a (batch, head) to finish reduces the partials in chunk order
// (the same result on every run) and writes the outputs.
constexpr int kVScaleThreads = 256;
constexpr int kVScaleRowsPerThread = 8;  // 16-byte loads in flight per thread
// Each thread keeps 8 fixed channels: D / 8 must divide the thread count.
inline bool v_scale_kernel_supported(int head_dim) {
  return head_dim % 8 == 0 && head_dim > 0 && head_dim <= 256 && kVScaleThreads % (head_dim / 8) == 0;
}
// Tokens per CTA: each pass of the CTA reads kVScaleThreads / (D / 8) tokens.
inline int v_scale_chunk_tokens(int head_dim) {
  return kVScaleRowsPerThread * (kVScaleThreads / (head_dim / 8));
}
// Partial results per chunk: max |v|, or with smoothing the sum, min and max.
inline int v_scale_partials(bool smooth) { return smooth ? 3 : 1; }
struct VScaleParams {
  const void* v;           // fp16/bf16, element strides below, last dim contiguous
  int64_t v_sb, v_sh, v_sn;
  int heads, tokens, head_dim;
  int chunks;              // ceil(tokens / v_scale_chunk_tokens(head_dim))
  float* partial;          // scratch [B, H, chunks, v_scale_partials(smooth), D]
  int* arrivals;           // [B, H], zero at launch: CTAs of each (batch, head) done so far
  float* scale;            // [B, H, D] out
  float* mean;             // [B, H, D] out with smoothing, else null
  float scale_max;         // the value amax maps to (e4m3's 448, or less)
};

struct AttnParams {
  const int8_t* q;         // [B, Hq, q_pad, D] int8
  const int8_t* k;         // [B, Hkv, k_pad, D] int8
  const void* v;           // FP16 PV: fp16 V with element strides v_s*; FP8 PV: [B, Hkv, kFp8VTerms * D, k_pad]
  int64_t v_sb, v_sh, v_sn;
  const float* q_scale;    // [B, Hq, q_groups]
  const float* k_scale;    // [B, Hkv, k_groups]
  const float* v_scale;    // FP8 only: [B, Hkv, D]
  const float* v_mean;     // FP8 only, may be null: [B, Hkv, D] added back to the output
  void* out;               // q dtype, element strides o_s*
  int64_t o_sb, o_sh, o_sn;
  float* lse;              // [B, Hq, Nq] fp32 or null
  int batch, q_heads, kv_heads, q_len, kv_len, q_pad, k_pad, head_dim;
  int q_groups, k_groups;
  QuantGran gran;
  bool causal;
};

}  // namespace sage
