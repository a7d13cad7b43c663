// Element-type helpers shared by the sm75 kernels (fp16 and bf16 in and out).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "launchers.h"

namespace sageattention_sm75 {

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Two adjacent output elements written with one 4-byte store.
__device__ __forceinline__ void store_pair(__half* dst, float a, float b) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* dst, float a, float b) {
  __nv_bfloat162 v;
  v.x = __float2bfloat16_rn(a);
  v.y = __float2bfloat16_rn(b);
  *reinterpret_cast<__nv_bfloat162*>(dst) = v;
}

// Runs the statements in __VA_ARGS__ (which must `return` a cudaError_t) with
// `T` (the element type) and `D` (the head dim) bound to compile-time values.
// Only head dims 64 and 128 are instantiated; anything else is an invalid value.
// (A macro rather than a templated lambda: the build stays valid C++17.)
#define SA75_DISPATCH_DTYPE_DIM(DTYPE, HEAD_DIM, ...)                  \
  [&]() -> cudaError_t {                                              \
    if ((DTYPE) == ::sageattention_sm75::ElemType::kFloat16) {        \
      using T = __half;                                               \
      if ((HEAD_DIM) == 64) { constexpr int D = 64; __VA_ARGS__ }     \
      if ((HEAD_DIM) == 128) { constexpr int D = 128; __VA_ARGS__ }   \
    } else if ((DTYPE) == ::sageattention_sm75::ElemType::kBFloat16) { \
      using T = __nv_bfloat16;                                        \
      if ((HEAD_DIM) == 64) { constexpr int D = 64; __VA_ARGS__ }     \
      if ((HEAD_DIM) == 128) { constexpr int D = 128; __VA_ARGS__ }   \
    }                                                                 \
    return cudaErrorInvalidValue;                                     \
  }()

}  // namespace sageattention_sm75
