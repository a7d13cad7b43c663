// The bulk tensor copy engine (TMA) for the warp-specialized sm_90a kernel (attn_wgmma.cuh,
// SAGE_WG_TMA): host-side tensor maps of our own quantized layouts, and the device-side copy that
// one producer thread issues per tile. A TMA copy writes the tile through the async proxy, already
// in the 64B / 128B swizzle the wgmma descriptors read, fills rows past the tensor's end with
// zeros, and completes by transaction count on an mbarrier: no per-thread cp.async, no
// generic-to-async proxy fence before the wgmmas.
#pragma once
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // CUtensorMap and the driver entry point's type; no libcuda link

#include <atomic>
#include <cstdint>

namespace sage::sm90 {

// ---- device (the mbarrier side is in sm90_sync.cuh) ----

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
#ifdef SAGE_HAS_WGMMA
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// The box of `map` at element coordinates (c0, c1, c2) into shared memory at `dst`; its bytes
// complete on `bar`. `map` must live in kernel parameter space (__grid_constant__).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                            uint32_t bar) {
#ifdef SAGE_HAS_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
#endif
}

// The same for a 4-D map (16-bit V as the caller gave it: channels, tokens, heads, batches).
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
#ifdef SAGE_HAS_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
#endif
}

// The box of `map` at (c0, c1, c2, c3) written from shared memory at `src` (the 4-D map of an
// output, encode_v16_map), in this thread's bulk group; rows past the map's end are not written.
// `src` must be visible to the async proxy (fence.proxy.async.shared::cta after the stores).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
#ifdef SAGE_HAS_WGMMA
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
#endif
}
__device__ __forceinline__ void tma_store_commit() {
#ifdef SAGE_HAS_WGMMA
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Until this thread's bulk groups have read their shared memory (READ) or are done (else).
template <bool READ>
__device__ __forceinline__ void tma_store_wait_all() {
#ifdef SAGE_HAS_WGMMA
  if constexpr (READ) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
  else asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

// ---- host ----

// cuTensorMapEncodeTiled from the driver the runtime already loaded (null if it has none). Only a
// found entry point is cached: a failed lookup is asked again on the next call.
// cudaGetDriverEntryPointByVersion exists from CUDA 12.5 on, and a 12.5-12.9 runtime's may fail on
// an older driver (minor version compatibility, e.g. an R535 driver); CUDA 12's unversioned lookup
// then finds the function (its only ABI, 12.0). Before audit 30 the versioned call alone: a build
// with nvcc 12.4 (families.json's min_nvcc) did not compile, and such a driver refused every call.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static std::atomic<PFN_cuTensorMapEncodeTiled_v12000> cached{nullptr};
  PFN_cuTensorMapEncodeTiled_v12000 fn = cached.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  void* f = nullptr;
  cudaDriverEntryPointQueryResult found{};
  bool ok = false;
#if CUDART_VERSION >= 12050
  ok = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) ==
           cudaSuccess &&
       found == cudaDriverEntryPointSuccess && f != nullptr;
  if (!ok) (void)cudaGetLastError();  // not left for the next launch's cudaGetLastError to report
#endif
#if CUDART_VERSION < 13000
  if (!ok) {
    f = nullptr;
    found = cudaDriverEntryPointQueryResult{};
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    ok = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &found) == cudaSuccess &&
         found == cudaDriverEntryPointSuccess && f != nullptr;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    if (!ok) (void)cudaGetLastError();
  }
#endif
  if (!ok) return nullptr;
  fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  cached.store(fn, std::memory_order_release);
  return fn;
}

// A 3-D map of bytes [outer][rows][row_bytes] (row_bytes contiguous, then rows, then outer) read
// as boxes of box_rows x box_row_bytes, swizzled as the wgmma tiles are: 128B for 128-byte box
// rows, 64B for 64-byte ones. Returns the driver's result; CUDA_ERROR_NOT_FOUND when the driver
// has no cuTensorMapEncodeTiled, CUDA_ERROR_INVALID_VALUE for a box row that is neither width.
inline CUresult encode_byte_map(CUtensorMap* map, const void* base, uint64_t row_bytes, uint64_t rows,
                                uint64_t outer, uint32_t box_row_bytes, uint32_t box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  if (box_row_bytes != 64 && box_row_bytes != 128) return CUDA_ERROR_INVALID_VALUE;
  const cuuint64_t dims[3] = {row_bytes, rows, outer};
  const cuuint64_t strides[2] = {row_bytes, row_bytes * rows};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {box_row_bytes, box_rows, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                box_row_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// A 4-D map of 16-bit V [batch][heads][tokens][head_dim] with the caller's element strides (the
// head dim contiguous; torch_glue.h guarantees 16-byte strides and base), read as boxes of 64
// channels (128 bytes, 128B swizzle: one MN-major atom of the wgmma B tile) x box_rows tokens.
// (Also the output's map for SAGE_WG_TMA_STORE: 64 channels x 64 rows per box.)
// Tokens past `tokens` arrive as zeros (P is 0 there, and V must not be NaN). The strides need not
// grow with the dimension (NHD: the head stride is the smallest), but a dimension of extent > 1
// must not have stride 0 (torch_glue.h's tma_friendly copies such a V).
inline CUresult encode_v16_map(CUtensorMap* map, const void* base, uint64_t head_dim, uint64_t tokens, uint64_t heads,
                               uint64_t batch, int64_t s_token, int64_t s_head, int64_t s_batch, uint32_t box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return CUDA_ERROR_NOT_FOUND;
  const cuuint64_t dims[4] = {head_dim, tokens, heads, batch};
  // bytes, dims 1-3; a dimension of extent 1 is only ever read at 0, so its stride (which torch
  // leaves arbitrary, 0 included) is replaced by one the encoder accepts
  const int64_t given[3] = {s_token, s_head, s_batch};
  cuuint64_t strides[3];
  for (int i = 0; i < 3; ++i)
    strides[i] = dims[i + 1] == 1 ? head_dim * 2 : static_cast<cuuint64_t>(given[i]) * 2;
  const cuuint32_t box[4] = {64, box_rows, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace sage::sm90
