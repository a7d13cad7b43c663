// INT8 QK^T + 16-bit PV attention on Hopper's warpgroup MMA (wgmma, sm_90a only).
//
// Same contract, inputs and quantization as attn_kernel.cuh (the sm80 family's INT8 Q/K with
// per_block / per_warp / per_thread scales, K smoothing done by the caller, 16-bit V as given,
// "fp32" accumulation): only the matrix products move from mma.sync to wgmma.
//   - A CTA is NWG warpgroups; warpgroup w owns 64 query rows (warp i of it: rows 16i..16i+15,
//     the same rows and register layout as one mma.sync m-tile, so per_thread/per_warp Q scales
//     index exactly as in attn_kernel.cuh).
//   - K/V walk in BLOCK_N-key blocks, double-buffered with cp.async into 1024-byte-aligned,
//     XOR-swizzled shared memory in the canonical layouts wgmma reads through descriptors:
//     Q and K K-major (rows of HEAD_DIM bytes, 128B swizzle for 128, 64B for 64); V MN-major
//     (64-column atoms of 128 bytes, each its own block of BLOCK_N key rows, 128B swizzle).
//   - S = Q K^T: wgmma m64nBLOCK_Nk32 s8 from shared memory. P (fp32 -> fp16/bf16) stays in
//     registers: the S accumulator fragments of two n8 tiles are the A fragment of
//     wgmma m64nHEAD_DIMk16 (A from registers), B = V tile (imm-trans-b: N contiguous).
//   - Each warpgroup waits for its own wgmma groups; a CTA barrier per K block guards the buffers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "attn_kernel.cuh"
#include "sm90_sync.cuh"
#include "sm90_tma.cuh"
#include "wgmma_ops.cuh"
#include "ws_ring.h"

namespace sage {

// 1: P goes through shared memory (SS wgmma) instead of registers, so an in-flight P.V holds no
// register but its accumulators (the register-A form's operands were overwritten, see below).
#ifndef SAGE_WG_P_SMEM
#define SAGE_WG_P_SMEM 0
#endif
// 1: the softmax of S_{j+1} runs while P_j V_j is in flight. Measured wrong (NaN at n=4096,
// docs/kernels.md): in the SASS, the softmax's temporaries reuse the physical registers of P_j,
// the A operand of the in-flight wgmma. 0 (default): wait for P_j V_j before the softmax.
#ifndef SAGE_WG_PV_SPLIT
// WS kernel, 16-bit P.V, plain loop: each block's P.V is issued in this many parts during the
// softmax (wg::softmax_in_parts), each part as soon as its exponentials are packed, so that it
// runs on the tensor cores while the next part's exponentials run. 1 (default): off, the whole
// P.V is issued after the softmax, with the next S. Two consumer warpgroups only. H100,
// 2026-12-06 (benchmarks/results/h100-2026-12-06-tune-06ead25-native.log): 2 parts 0.90-0.99x,
// 4 parts 0.92-1.01x at d=128; ncu saw the wait for the products halve and the exponentials stall
// more (docs/kernels.md).
#define SAGE_WG_PV_SPLIT 1
#endif
#ifndef SAGE_WG_WS_P_SMEM
// WS kernel, 16-bit P.V, plain loop, at most two consumer warpgroups: P goes to a shared-memory
// tile of the warpgroup (stmatrix, 128B-swizzled K-major) and P.V reads it there (an SS wgmma),
// so an in-flight P.V holds no register operand. With SAGE_WG_PV_SPLIT, part by part. 0: off.
// H100, 2026-12-06 (benchmarks/results/h100-2026-12-06-tune-2ccd861-native.log, d=128): alone
// 0.91x, with 2 parts 0.95x, 4 parts 0.91x: the proxy fence and the barrier per part cost more
// than the overlap gains.
// 2: P through the tile, and the softmax of block kb runs while P_{kb-1} V_{kb-1} is on the tensor
// cores (one fence and barrier a block; a stage's K is released once its S is done, its V once
// its P.V is, so the next K is not held back by the P.V in flight). H100, 2026-12-06
// (benchmarks/results/h100-2026-12-06-tune-ed90a99-native.log, d=128, variant po): 0.871-0.952x,
// 0.919x geomean; correct (the sm90 GPU tests on it: 65 passed).
#define SAGE_WG_WS_P_SMEM 0
#endif
#ifndef SAGE_WG_PV_OVERLAP
#define SAGE_WG_PV_OVERLAP 0
#endif
// SAGE_WG_PRODUCER_REGS (WS kernel, two consumer warpgroups): the producer's registers; default
// 56 with 16-bit V, 40 with FP8 V (its two-level d=128 consumer spilled 28 bytes with 56).
#ifndef SAGE_WG_WS_MINB
#define SAGE_WG_WS_MINB 0  // WS kernel: CTAs per SM to leave registers for (0: 2 with one consumer warpgroup, else 1)
#endif
#ifndef SAGE_WG_STAGED_STORE
// WS kernel: each consumer warpgroup's output tile goes through shared memory and out as 16-byte
// stores (wg::store_rows_staged), instead of 4-byte stores straight from the accumulators.
// 0: never; 1: always; 2 (default): where the CTA has at most two consumer warpgroups. H100,
// 2026-12-06 (benchmarks/results/h100-2026-12-06-tune-5c93194-native.log): the sm90_fp8 family
// 1.067x geomean over ten cases (0.985-1.155), the sm90 family 1.00-1.07x at d=128 (two
// warpgroups) but 0.92 / 0.94x at d=64, where it runs three.
#define SAGE_WG_STAGED_STORE 2
#endif
#ifndef SAGE_WG_TMA_STORE
// With SAGE_WG_TMA and the staged store: the warpgroup's output tile leaves shared memory by the
// bulk tensor copy engine (one thread issues it, the warpgroup goes on) instead of 16-byte stores
// by every thread. 0: off. On an H100 (benchmarks/results/h100-2026-12-06-tune-ae9f72f-native.log):
// the sm90 family 1.01-1.04x at d=128 but for 0.98x at 1x32x16384x128, the sm90_fp8 family
// 0.96-1.05x (and 4 spilled bytes in its two-level d=128 kernels). 0 here; the sm90 family turns
// it on (csrc/sm90/tiles.cuh), the sm90_fp8 family leaves it off.
#define SAGE_WG_TMA_STORE 0
#endif
#ifndef SAGE_WG_TILE_SLOT
// Dynamic scheduler (SAGE_WG_PERSISTENT 2): 1, the producer decodes each tile and hands its fields
// to the consumers; 0 (default), it hands over the tile's index and every role decodes it. On an
// H100 1 was level at d=128 (0.98-1.01x) and 7-11% slower at d=64, three consumer warpgroups
// (benchmarks/results/h100-2026-12-06-tune-knobs-f3f2291-native.log, variant ns).
#define SAGE_WG_TILE_SLOT 0
#endif
#ifndef SAGE_WG_KS_PREFETCH
#define SAGE_WG_KS_PREFETCH 1  // WS kernel: load the next block's K scales while this block's products run
#endif
#ifndef SAGE_WG_KS_FIRST_EARLY
// WS kernel: a tile's first K block's scales are loaded before its Q / K wait and first QK, instead
// of after (where each tile start waited a global load's latency before its first softmax). 0: off.
// H100, 2026-12-06 (benchmarks/results/h100-2026-12-06-tune-3a5ec42-native.log, variant ke): 0.992x
// geomean, 0.971-1.008x per case; with three stages (kst3) 1.025x against three stages alone 1.036x.
#define SAGE_WG_KS_FIRST_EARLY 0
#endif
#ifndef SAGE_WG_NEXT_TILE_QK
// WS kernel, dynamic persistent scheduler (SAGE_WG_PERSISTENT 2), plain loop: a tile's last K block
// issues the next tile's first S = Q' K'_0 (its Q and K_0 are in shared memory by then) where it
// issued an unused S on its own K, so the next tile starts at its softmax: its first QK and its
// Q / K wait leave the tile start (about 420 and 1000-1400 cycles a tile in the 6f496e1 traces).
// The consumer reads the next tile's slot a block earlier. 0: off. H100, 2026-12-06
// (benchmarks/results/h100-2026-12-06-tune-a4a5c67-native.log, variant nt): 0.980x geomean,
// 0.932-1.035x; its trace took the first QK off the tile start (~420 -> ~53 cycles) but left the
// ~1000 cycles before it, and the K loop ran slower (2760-2890 cycles a block against 2600-2690 at
// n=1024, benchmarks/results/h100-2026-12-06-tune-a4a5c67-trace.log).
#define SAGE_WG_NEXT_TILE_QK 0
#endif
#ifndef SAGE_WG_TILE_DECODE32
// Persistent kernel: a tile index decoded with 32-bit divisions when the launch has fewer than
// 2^31 tiles (always, in practice), instead of the int64 ones (two calls of the compiler's 64-bit
// division routine per decode, by role and tile). The nt trace above spent ~1000 cycles between a
// tile's start and its first softmax with no Q or K left to wait for; the decode is part of what
// runs there. 0: off. H100, 2026-12-06 (h100-2026-12-06-tune-b097707-native.log, variant d32):
// that stretch shrank to 770-970 cycles, the time did not move (0.995x geomean, 0.965-1.018x).
#define SAGE_WG_TILE_DECODE32 0
#endif
#ifndef SAGE_WG_MASK_BRANCH
// Blocks that need no mask for any of the warp's rows take a softmax without mask code
// (wg::softmax_probs).
#define SAGE_WG_MASK_BRANCH 1
#endif
#ifndef SAGE_WG_FP8_P_FOLD
// FP8 P.V: P * 448 as exp2(x + log2 448) (the scale folded into the exponent's constant) instead
// of a multiply per score; the row sum then carries the 448, which the epilogue divides out.
#define SAGE_WG_FP8_P_FOLD 1
#endif
#ifndef SAGE_WG_FP8_P_VIA_F16
// FP8 P.V (with SAGE_WG_FP8_P_FOLD): P's e4m3 bytes come from fp16 pairs of P * 448 / 256 by an
// add and a byte permute (e4m3x4_from_f16x2_scaled), not from cvt...e4m3x2.f32 (the
// F2FP.SATFINITE.E4M3 pack, 32 a thread per 128-key block); the row sum then carries 448 / 256.
// Tuning knob, 0: off.
#define SAGE_WG_FP8_P_VIA_F16 0
#endif
#if SAGE_WG_FP8_P_VIA_F16 && !SAGE_WG_FP8_P_FOLD
#error "SAGE_WG_FP8_P_VIA_F16 builds on SAGE_WG_FP8_P_FOLD (the 2^-8 rides on the exp2's constant)"
#endif
#ifndef SAGE_WG_RESCALE_SKIP
#define SAGE_WG_RESCALE_SKIP 1  // WS kernel: a warp whose row maxima did not move skips the O rescale
#endif
#ifndef SAGE_WG_LAZY_RESCALE
// 16-bit P.V: the row maximum the exponents are taken against moves only when a block's maximum
// passes it by more than this many powers of two (0: whenever it passes it). P then reaches up to
// 2^N, which fp16/bf16 P and the fp32 sums hold, and O / l comes out the same; most blocks then
// keep every row's maximum, so SAGE_WG_RESCALE_SKIP skips their O rescale. Not for FP8 P (448).
#define SAGE_WG_LAZY_RESCALE 0
#endif
#ifndef SAGE_WG_FUSED_UPDATE
// WS kernel, plain loop: the O update joins the softmax's basic block, so ptxas can schedule its
// 64 FMUL / FFMA (and the FP8 packing) between the MUFU.EX2s, which otherwise run back to back
// while the other pipes idle: the rescale O *= alpha right after alpha is known, and with two-level
// accumulation O = alpha O + P V of the previous block (its P.V done by then). The same operations
// on the same values, so the results do not change; the rescale is never skipped.
#define SAGE_WG_FUSED_UPDATE 0
#endif
#ifndef SAGE_WG_EARLY_PRESET
// With SAGE_WG_FUSED_UPDATE: the next S's accumulators are preset to the score bias (one move per
// score) inside the mask arm, right after P is packed, where ptxas can put the moves between the
// MUFU.EX2s, instead of between the K/V wait and the products' wgmmas, where (shipped SASS, two-level
// FP8 d=128) 64 moves per thread delay the first wgmma.
#define SAGE_WG_EARLY_PRESET 0
#endif
#ifndef SAGE_WG_TMA
// WS kernel with FP8 P.V: Q, K and V^T come by the bulk tensor copy engine (sm90_tma.cuh), one
// producer thread issuing a copy per tile, instead of cp.async by the producer's 128 threads.
#define SAGE_WG_TMA 0
#endif
#ifndef SAGE_WG_PERSISTENT
// WS kernel (plain loop), non-causal calls: one CTA per SM walks the tiles (launch_persistent); the
// producer loads the next tile's Q (a second Q buffer) and first K/V blocks while the consumers
// finish the current tile, instead of every tile paying a CTA launch and a cold start. Causal
// calls keep a CTA per tile: their tiles' work differs, and the hardware's dynamic placement
// balances it where a fixed stride over the tiles would not (at n=1024, 2x between CTAs).
// 2: every call, causal too, with a dynamic tile scheduler: the producer takes the CTA's next tile
// from a per-call atomic counter (in the order a CTA per tile would run: causal heaviest query
// block first within each head) and hands it to the consumers in a shared-memory slot beside its
// Q buffer; the tile after the last is -1, which ends both roles.
#define SAGE_WG_PERSISTENT 0
#endif
#ifndef SAGE_WG_TILE_ORDER
// Persistent kernel: the order of the tiles. 0: query blocks within a head, then heads, then
// batches (as a CTA per tile runs them: the CTAs running at once share a few heads' K/V in L2);
// 1: the query block outermost (causal: every head's heaviest block first, which a list-scheduling
// model balances within 0.3% of ideal where order 0 leaves a tail of 3.5-7.4%, at the cost of that
// L2 sharing).
#define SAGE_WG_TILE_ORDER 0
#endif
#ifndef SAGE_WG_WS_OVERLAP
#define SAGE_WG_WS_OVERLAP 0  // WS kernel: the softmax of S_{kb+1} while P_kb V_kb runs
#endif
#ifndef SAGE_WG_SOFTMAX_ILP
// 1: the softmax's row max and row sum as independent chains (2 of 4 VIMNMX3, 4 of 8 FADD per row
// instead of 1 of 8 and 1 of 32), for a warpgroup whose softmax waits on its own latencies. The
// sum is then added in another order (a rounding-level change).
#define SAGE_WG_SOFTMAX_ILP 0
#endif
#ifndef SAGE_WG_QK_AHEAD
// WS kernel, plain loop with SAGE_WG_FUSED_UPDATE: S_{kb+1} = Q K_{kb+1} is issued before the
// softmax of S_kb and runs on the tensor cores during it, into a second set of S registers; P_kb
// V_kb follows the softmax. Unlike SAGE_WG_WS_OVERLAP, the wgmma in flight across the softmax
// reads both operands from shared memory, so no register the softmax writes can be its operand;
// ptxas keeps its accumulator out of the softmax's way. K_{kb+1} is wanted a softmax earlier, so
// it pairs with a third K/V stage (the family's SAGE_WG_STAGES). Costs 64 registers at 128 keys.
#define SAGE_WG_QK_AHEAD 0
#endif
#ifndef SAGE_WG_MINB
#define SAGE_WG_MINB 1  // CTAs per SM the register allocation must leave room for
#endif
#ifndef SAGE_WG_TRACE
// Tuning build only: >= 0 makes CTA number SAGE_WG_TRACE (linear block index) of the WS kernel
// record the SM clock at each phase of K blocks SAGE_WG_TRACE_FIRST.. (default 8..23) of its first
// tile for the first thread of each consumer warpgroup, and at the phases of its first
// SAGE_WG_TRACE_TILES tiles (default 2; persistent: the CTA's first ones; else its only one): K/V
// and Q landed, first QK done, K loop done, output stored. The launcher then
// prints them from a second kernel (wg_trace::print_kernel; benchmarks/gpu_dev_profile.py trace
// reads the lines): a printf in the attention kernel itself made ptxas serialize every wgmma
// (warning C7510, "wgmma pipeline crossing function boundary"). -1: off.
#define SAGE_WG_TRACE -1
#endif
#ifndef SAGE_WG_TRACE_FIRST
#define SAGE_WG_TRACE_FIRST 8  // the first traced K block (0 for short rows, e.g. n=1024: 8 blocks)
#endif
#ifndef SAGE_WG_TRACE_TILES
#define SAGE_WG_TRACE_TILES 2  // tiles traced per consumer warpgroup (persistent CTAs run several)
#endif
#ifndef SAGE_WG_EXP2_FMA
// n8 score tiles out of every 8 whose exp2 runs on the FMA pipe (exp2_fma). Slower wherever tried;
// last on the three-stage sm90 default, H100 2026-12-06: 1 gave 0.976x (h100-2026-12-06-tune-b097707-native.log).
#define SAGE_WG_EXP2_FMA 0
#endif
#ifndef SAGE_WG_EXP2_F16X2
// 16-bit fp16 P.V only: P as ex2.approx.f16x2 of the fp16-rounded exponents, one instruction per
// pair of scores, straight into P's A fragments, its row sum in fp16 (exp2_f16x2, sum_f16x2). 0: off
// (measured 0.969x on an H100: the f16x2 instruction is two MUFU ops on sm_90).
#define SAGE_WG_EXP2_F16X2 0
#endif
#if SAGE_WG_EXP2_F16X2 && SAGE_WG_EXP2_FMA
#error "SAGE_WG_EXP2_F16X2 and SAGE_WG_EXP2_FMA are two answers to one question: set one"
#endif
#ifndef SAGE_WG_INTERLEAVE
// WS kernel, plain loop: issue the k-steps of S_{kb+1} = Q K_{kb+1} and O += P_kb V_kb alternately,
// as one commit group, so that consecutive wgmmas of a warpgroup write different accumulators
// (0: all of S's, then all of O's). Measured no faster (docs/kernels.md, 2026-12-04 late).
#define SAGE_WG_INTERLEAVE 0
#endif
namespace wg {

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile whose rows are ROW_BYTES
// (64 or 128) long: the hardware XORs address bits [4, 7) with bits [7, 10) (128B swizzle) or
// bits [4, 6) with [7, 9) (64B swizzle); tiles start 1024-byte aligned.
template <int ROW_BYTES>
__device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  static_assert(ROW_BYTES == 64 || ROW_BYTES == 128, "64B or 128B rows");
  const uint32_t off = static_cast<uint32_t>(row * ROW_BYTES + chunk * 16);
  constexpr uint32_t kMask = ROW_BYTES / 16 - 1;
  return off ^ (((off >> 7) & kMask) << 4);
}

// wgmma shared-memory matrix descriptor: start address, leading / stride byte offsets (16-byte
// units), swizzle mode (1: 128B, 2: 64B).
__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo,
                                              uint32_t swizzle) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32) |
         (static_cast<uint64_t>(swizzle) << 62);
}

// cp.async copies of one tile into the swizzled layouts by THREADS threads. Thread `tid` copies
// one 16-byte column chunk of every ROWS_PER_PASS-th row; ROWS_PER_PASS is a multiple of 8, so the
// swizzle (a function of the row mod 8) is the same for all of a thread's rows and every address
// is a per-thread base plus a compile-time offset. Rows past `rows` are zero-filled, unread.
template <int ROW_BYTES, int CHUNKS, int ROWS, int THREADS>
struct RowCopy {
  static constexpr int kRowsPerPass = THREADS / CHUNKS;
  static_assert(THREADS % CHUNKS == 0 && ROWS % kRowsPerPass == 0 && kRowsPerPass % 8 == 0, "copy tiling");
  int r0;
  uint32_t dst0;
  __device__ __forceinline__ RowCopy(int tid, uint32_t dst_of_r0) : r0(tid / CHUNKS), dst0(dst_of_r0) {}
  // src: row r0 of this tile in global memory; src_stride: elements of T between rows
  template <typename T>
  __device__ __forceinline__ void operator()(uint32_t tile, const T* src, int64_t src_stride, int rows) const {
    if (rows - r0 >= ROWS) {
      #pragma unroll
      for (int i = 0; i < ROWS / kRowsPerPass; ++i)
        cp_async_16(tile + dst0 + i * kRowsPerPass * ROW_BYTES, src + i * kRowsPerPass * src_stride, true);
    } else {
      #pragma unroll
      for (int i = 0; i < ROWS / kRowsPerPass; ++i) {
        const bool ok = i * kRowsPerPass < rows - r0;
        cp_async_16(tile + dst0 + i * kRowsPerPass * ROW_BYTES, ok ? src + i * kRowsPerPass * src_stride : src, ok);
      }
    }
  }
};

// K (or Q): int8 rows of HEAD_DIM bytes, K-major, HEAD_DIM-byte swizzle. K is padded to 64 tokens
// (zeros past kv_len), so rows are guarded against k_pad only.
template <int HEAD_DIM, int ROWS, int THREADS>
struct QKCopy {
  using Rows = RowCopy<HEAD_DIM, HEAD_DIM / 16, ROWS, THREADS>;
  Rows rows;
  const int8_t* src0;  // this thread's first row and column chunk, token 0
  __device__ __forceinline__ QKCopy(const int8_t* g, int tid)
      : rows(tid, swizzled<HEAD_DIM>(tid / (HEAD_DIM / 16), tid % (HEAD_DIM / 16))),
        src0(g + (tid / (HEAD_DIM / 16)) * HEAD_DIM + (tid % (HEAD_DIM / 16)) * 16) {}
  // rows [tok0, tok0 + ROWS) of which the first `valid` exist
  __device__ __forceinline__ void operator()(uint32_t tile, int tok0, int valid) const {
    rows(tile, src0 + static_cast<int64_t>(tok0) * HEAD_DIM, HEAD_DIM, valid);
  }
};

// 16-bit V rows from the caller's strides into the MN-major layout (64-column atoms of 128-byte
// rows, each atom its own block of ROWS rows, 128B swizzle); rows past kv_len zero-filled (P is 0
// there, V must not be NaN).
template <int HEAD_DIM, int ROWS, int THREADS>
struct VCopy {
  using Rows = RowCopy<128, HEAD_DIM / 8, ROWS, THREADS>;
  Rows rows;
  const __half* src0;
  int64_t v_sn;
  __device__ __forceinline__ VCopy(const __half* g, int64_t sn, int tid)
      : rows(tid, (tid % (HEAD_DIM / 8)) / 8 * (ROWS * 128) + swizzled<128>(tid / (HEAD_DIM / 8), tid % 8)),
        src0(g + (tid / (HEAD_DIM / 8)) * sn + (tid % (HEAD_DIM / 8)) * 8), v_sn(sn) {}
  __device__ __forceinline__ void operator()(uint32_t tile, int tok0, int valid) const {
    rows(tile, src0 + static_cast<int64_t>(tok0) * v_sn, v_sn, valid);
  }
};

// FP8 V^T (the quant_v_fp8 layout [B, Hkv, kFp8VTerms * D, k_pad] e4m3, tokens permuted within
// 16-token groups): ROWS rows (every term's) of BLOCK_N = 128 token bytes, K-major, 128B swizzle. A thread
// copies one column chunk of every ROWS_PER_PASS-th row; chunks past k_pad (a multiple of 64) are
// zero-filled, unread: an e4m3 byte there could be NaN, and 0 * NaN is NaN.
template <int ROWS, int BLOCK_N, int THREADS>
struct VtCopy {
  static constexpr int kChunks = BLOCK_N / 16, kRowsPerPass = THREADS / kChunks;
  static_assert(BLOCK_N == 128 && THREADS % kChunks == 0 && ROWS % kRowsPerPass == 0 &&
                kRowsPerPass % 8 == 0, "V^T copy tiling");
  int col;  // this thread's first token inside a block
  uint32_t dst0;
  const uint8_t* src0;
  int64_t stride;  // bytes between V^T rows (k_pad)
  __device__ __forceinline__ VtCopy(const uint8_t* g, int64_t k_pad, int tid)
      : col((tid % kChunks) * 16), dst0(swizzled<128>(tid / kChunks, tid % kChunks)),
        src0(g + (tid / kChunks) * k_pad + (tid % kChunks) * 16), stride(k_pad) {}
  // tokens [tok0, tok0 + BLOCK_N) of which the first `valid` exist (k_pad - tok0)
  __device__ __forceinline__ void operator()(uint32_t tile, int tok0, int valid) const {
    const bool ok = col < valid;
    #pragma unroll
    for (int i = 0; i < ROWS / kRowsPerPass; ++i)
      cp_async_16(tile + dst0 + i * kRowsPerPass * 128, ok ? src0 + tok0 + i * kRowsPerPass * stride : src0, ok);
  }
};

template <int N>
__device__ __forceinline__ void qk_wgmma(int32_t (&s)[N / 2], uint64_t da, uint64_t db, int acc) {
  if constexpr (N == 64) wgmma_m64n64k32_s8(s, da, db, acc);
  else wgmma_m64n128k32_s8(s, da, db, acc);
}

template <int N, PvKind PV>
__device__ __forceinline__ void pv_wgmma_ss(float (&o)[N / 2], uint64_t da, uint64_t db) {
  if constexpr (N == 64) {
    if constexpr (PV == PvKind::kBf16) wgmma_m64n64k16_bf16_ss(o, da, db);
    else wgmma_m64n64k16_f16_ss(o, da, db);
  } else {
    if constexpr (PV == PvKind::kBf16) wgmma_m64n128k16_bf16_ss(o, da, db);
    else wgmma_m64n128k16_f16_ss(o, da, db);
  }
}

template <int N, PvKind PV>
__device__ __forceinline__ void pv_wgmma(float (&o)[N / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (N == 64) {
    if constexpr (PV == PvKind::kBf16) wgmma_m64n64k16_bf16_rs(o, a, db);
    else wgmma_m64n64k16_f16_rs(o, a, db);
  } else {
    if constexpr (PV == PvKind::kBf16) wgmma_m64n128k16_bf16_rs(o, a, db);
    else wgmma_m64n128k16_f16_rs(o, a, db);
  }
}

// Score accumulators start at kScoreBias (the scores come out as the floats 1.5*2^23 + S).
// Written before wgmma_fence: registers a wgmma reads must be final when the fence executes.
template <int BLOCK_N>
__device__ __forceinline__ void preset_scores(int32_t (&acc)[BLOCK_N / 2]) {
  #pragma unroll
  for (int i = 0; i < BLOCK_N / 2; ++i) acc[i] = kScoreBias;
}
// Descriptors of the operand tiles: Q or K (rows of HEAD_DIM int8 bytes, K-major, HEAD_DIM-byte
// swizzle), FP8 V^T (rows of 128 token bytes, K-major, 128B swizzle) and 16-bit V (MN-major,
// 64-column atoms of BLOCK_N rows of 128 bytes).
template <int HEAD_DIM>
__device__ __forceinline__ uint64_t qk_desc(uint32_t tile) {
  return make_desc(tile, 16, 8 * HEAD_DIM, HEAD_DIM == 128 ? 1 : 2);
}
__device__ __forceinline__ uint64_t vt_desc(uint32_t tile) { return make_desc(tile, 16, 8 * 128, 1); }
template <int BLOCK_N>
__device__ __forceinline__ uint64_t v_desc(uint32_t tile) { return make_desc(tile, BLOCK_N * 128, 1024, 1); }

// One k-step of each product. QK step kk: +32 bytes along d; the first accumulates onto the
// preset score bias (or overwrites without one). FP8 P.V step kc: P's e4m3 A fragment of 32
// keys, +32 token bytes of V^T; fresh: its first step overwrites O (a block's own accumulator).
// 16-bit P.V step kc: 16 keys, +16 MN-major V rows of 128 bytes.
template <int BLOCK_N>
__device__ __forceinline__ void qk_step(int32_t (&s)[BLOCK_N / 2], uint64_t desc_q, uint64_t desc_k, int kk) {
  qk_wgmma<BLOCK_N>(s, desc_q + 2 * kk, desc_k + 2 * kk, kScoreBias != 0 || kk > 0);
}
template <int HEAD_DIM>
__device__ __forceinline__ void pv_fp8_step(float (&o)[HEAD_DIM / 2], const uint32_t (&a)[4], uint64_t desc_vt, int kc,
                                            bool fresh) {
  if (fresh && kc == 0) {  // o's old values are dead: tell the compiler (SAGE_WG_QK_AHEAD needs it)
    if constexpr (HEAD_DIM == 64) wgmma_m64n64k32_e4m3_rs_fresh(o, a, desc_vt);
    else wgmma_m64n128k32_e4m3_rs_fresh(o, a, desc_vt);
  } else {
    if constexpr (HEAD_DIM == 64) wgmma_m64n64k32_e4m3_rs(o, a, desc_vt + 2 * kc, 1);
    else wgmma_m64n128k32_e4m3_rs(o, a, desc_vt + 2 * kc, 1);
  }
}
template <int HEAD_DIM, PvKind PV>
__device__ __forceinline__ void pv16_step(float (&o)[HEAD_DIM / 2], const uint32_t (&a)[4], uint64_t desc_v, int kc) {
  pv_wgmma<HEAD_DIM, PV>(o, a, desc_v + 128 * kc);
}

// S (+)= Q K^T over HEAD_DIM / 32 k-steps; K tile at k_tile.
template <int HEAD_DIM, int BLOCK_N>
__device__ __forceinline__ void issue_qk(int32_t (&acc)[BLOCK_N / 2], uint64_t desc_q, uint32_t k_tile) {
  const uint64_t desc_k = qk_desc<HEAD_DIM>(k_tile);
  #pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 32; ++kk) qk_step<BLOCK_N>(acc, desc_q, desc_k, kk);
}
// FP8 P.V step kc on each of V's e4m3 terms in turn (hi, then lo: kFp8VTerms, attn_params.h),
// the same A fragment against the term's HEAD_DIM rows of V^T; fresh: only the first overwrites.
template <int HEAD_DIM>
__device__ __forceinline__ void pv_fp8_terms_step(float (&o)[HEAD_DIM / 2], const uint32_t (&a)[4], uint32_t vt_tile,
                                                  int kc, bool fresh) {
  #pragma unroll
  for (int term = 0; term < kFp8VTerms; ++term)
    pv_fp8_step<HEAD_DIM>(o, a, vt_desc(vt_tile + term * HEAD_DIM * 128), kc, fresh && term == 0);
}
// O (+)= P V in FP8: P from registers, V^T in shared memory (pv_fp8_terms_step).
template <int HEAD_DIM, int BLOCK_N>
__device__ __forceinline__ void issue_pv_fp8(float (&o)[HEAD_DIM / 2], const uint32_t (&pa)[BLOCK_N / 32][4],
                                             uint32_t vt_tile, bool fresh) {
  #pragma unroll
  for (int kc = 0; kc < BLOCK_N / 32; ++kc) pv_fp8_terms_step<HEAD_DIM>(o, pa[kc], vt_tile, kc, fresh);
}
// O += P V with P from registers (pv16_step), for the k-steps of part `part` of PARTS
// (SAGE_WG_PV_SPLIT), in order; issue_pv: all of them.
template <int HEAD_DIM, int BLOCK_N, PvKind PV, int PARTS>
__device__ __forceinline__ void issue_pv_part(float (&o)[HEAD_DIM / 2], const uint32_t (&pa)[BLOCK_N / 16][4],
                                              uint32_t v_tile, int part) {
  constexpr int kSteps = BLOCK_N / 16 / PARTS;
  const uint64_t desc_v = v_desc<BLOCK_N>(v_tile);
  #pragma unroll
  for (int kc = part * kSteps; kc < (part + 1) * kSteps; ++kc) pv16_step<HEAD_DIM, PV>(o, pa[kc], desc_v, kc);
}
template <int HEAD_DIM, int BLOCK_N, PvKind PV>
__device__ __forceinline__ void issue_pv(float (&o)[HEAD_DIM / 2], const uint32_t (&pa)[BLOCK_N / 16][4],
                                         uint32_t v_tile) {
  issue_pv_part<HEAD_DIM, BLOCK_N, PV, 1>(o, pa, v_tile, 0);
}

// S = Q K^T (from kScoreBias) and O (+)= P V, their k-steps alternating (SAGE_WG_INTERLEAVE): QK
// step j goes right before P.V step ceil(j * kP / kQ), so the two accumulator chains interleave
// evenly. FP8 (PA of BLOCK_N / 32 fragments): fresh as in issue_pv_fp8.
template <int HEAD_DIM, int BLOCK_N, PvKind PV, int PA>
__device__ __forceinline__ void issue_qk_pv_interleaved(int32_t (&s)[BLOCK_N / 2], uint64_t desc_q, uint32_t k_tile,
                                                        float (&o)[HEAD_DIM / 2], const uint32_t (&pa)[PA][4],
                                                        uint32_t v_tile, bool fresh) {
  constexpr bool kFp8 = PV == PvKind::kFp8;
  constexpr int kQ = HEAD_DIM / 32, kP = PA;
  static_assert(PA == (kFp8 ? BLOCK_N / 32 : BLOCK_N / 16) && kQ <= kP, "one P.V step per A fragment");
  const uint64_t desc_k = qk_desc<HEAD_DIM>(k_tile);
  [[maybe_unused]] const uint64_t desc_v = v_desc<BLOCK_N>(v_tile);
  #pragma unroll
  for (int i = 0; i < kP; ++i) {
    if ((i * kQ) % kP < kQ) qk_step<BLOCK_N>(s, desc_q, desc_k, i * kQ / kP);
    if constexpr (kFp8) pv_fp8_terms_step<HEAD_DIM>(o, pa[i], v_tile, i, fresh);
    else pv16_step<HEAD_DIM, PV>(o, pa[i], desc_v, i);
  }
}

}  // namespace wg

template <int HEAD_DIM, int NWG, int BLOCK_N>
struct WgmmaTraits {
  static constexpr int kThreads = NWG * 128;
  static constexpr int kCtaQ = NWG * 64;
  static constexpr int kQBytes = kCtaQ * HEAD_DIM;
  static constexpr int kKBytes = BLOCK_N * HEAD_DIM;
  static constexpr int kVBytes = BLOCK_N * HEAD_DIM * 2;  // HEAD_DIM / 64 atoms x BLOCK_N x 128 B
  // P_SMEM: P of each warpgroup, K-major (64 rows x BLOCK_N keys of 16 bits), as 64-key atoms of
  // 64 rows x 128 bytes (128B swizzle), for a P.V whose A comes from shared memory.
  static constexpr int kPBytes = SAGE_WG_P_SMEM ? 64 * BLOCK_N * 2 : 0;  // per warpgroup
  static constexpr int kSmemBytes = kQBytes + 2 * kKBytes + 2 * kVBytes + NWG * kPBytes + 1024;
  static_assert(kCtaQ <= 128 && 128 % kCtaQ == 0, "CTA rows must divide the 128-token Q padding");
  static_assert(BLOCK_N == 64 || BLOCK_N == 128, "64- or 128-key blocks");
};

namespace wg {

// The thread's Q scale (rows row0 + g, + 8) and where its K scales start and step (per_thread: the
// column group t of every 64-key block, 4 scales per block).
struct ThreadScales {
  float qs;
  const float* ks_src;
  int ks_step;
  __device__ __forceinline__ ThreadScales(const AttnParams& p, int64_t bh, int64_t bhkv, int row0, int g, int t)
      // rows at or past q_pad (a 192- or 256-row CTA's last warpgroups) have zero Q: any scale does
      : qs(p.q_scale[bh * p.q_groups + q_scale_index(p.gran, min(row0, p.q_pad - 16), g)]),
        ks_src(p.k_scale + bhkv * p.k_groups + (p.gran == QuantGran::kPerThread ? t : 0)),
        ks_step(p.gran == QuantGran::kPerThread ? 4 : 1) {}
};

// One K block's setup for the thread's rows row0 + g and row0 + g + 8 (row0 = the warp's first
// query row): the dequantization factors of its 64-key scale blocks, whether any of the warp's
// rows needs masking, and each row's key limit relative to the thread's first column 2t.
template <int BLOCK_N>
struct KBlock {
  float dq[BLOCK_N / kBlkK];
  bool need_mask;
  int limit[2];
  __device__ __forceinline__ KBlock(const AttnParams& p, int kb, const ThreadScales& sc, int row0, int g,
                                    int t) {
    #pragma unroll
    for (int sub = 0; sub < BLOCK_N / kBlkK; ++sub) {
      const int blk = kb * (BLOCK_N / kBlkK) + sub;
      dq[sub] = sc.qs * (blk < p.k_pad / kBlkK ? sc.ks_src[blk * sc.ks_step] : 1.f);
    }
    const int k0 = kb * BLOCK_N;
    need_mask = (k0 + BLOCK_N > p.kv_len) || (p.causal && k0 + BLOCK_N - 1 > row0);
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + g + 8 * r;
      limit[r] = (p.causal ? min(p.kv_len, row + 1) : p.kv_len) - (k0 + 2 * t);
    }
  }
};

// Whether P for a P.V of kind PV comes from the fp16x2 exponentials (SAGE_WG_EXP2_F16X2).
template <PvKind PV>
inline constexpr bool kExp2F16x2 = SAGE_WG_EXP2_F16X2 && PV == PvKind::kFp16;
// Whether the 16-bit P.V softmaxes keep a row's maximum lazily (SAGE_WG_LAZY_RESCALE; not FP8 P).
inline constexpr bool kLazyRescale16 = SAGE_WG_LAZY_RESCALE > 0;

// S (biased int32, wgmma accumulator layout) as fp32 scores (masked: -inf), for the softmax.
template <int BLOCK_N, bool MASK>
__device__ __forceinline__ void scores_to_f32(const int32_t (&s)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk,
                                              float (&sf)[BLOCK_N / 2]) {
  #pragma unroll
  for (int j = 0; j < BLOCK_N / 8; ++j)
    #pragma unroll
    for (int e = 0; e < 4; ++e) {
      float v = score_to_f32(s[4 * j + e]);
      if (MASK && blk.need_mask && j * 8 + (e & 1) >= blk.limit[e >> 1]) v = -INFINITY;
      sf[4 * j + e] = v;
    }
}

// SAGE_WG_FP8_P_VIA_F16: P * 448 comes out of the exp2 times 2^-8 (see e4m3x4_from_f16x2_scaled),
// and so do the row sums under SAGE_WG_FP8_P_FOLD (RowNorm divides the factor out).
constexpr int kP8ViaF16Shift = SAGE_WG_FP8_P_VIA_F16 ? 8 : 0;
constexpr float kP8SumScale = 1.f / static_cast<float>(1 << kP8ViaF16Shift);

// The row's largest dequantized score in the block (the max over its 64-key scale blocks of the
// largest raw score times dq), over the quad's four threads; -inf where all are masked. Its
// shuffles take the whole warp: call it from every lane, never behind a lane's own condition (a
// `first && row_block_max(1) ...` did that, and the warp hung at the shuffle, 2026-12-06).
template <int BLOCK_N>
__device__ __forceinline__ float row_block_max(int r, const float (&sf)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk) {
  constexpr int kSub = BLOCK_N / kBlkK;
  float mx = -INFINITY;
  #pragma unroll
  for (int sub = 0; sub < kSub; ++sub) {
    float mraw;
    if constexpr (kScoreBias != 0) {
      // biased scores are positive floats (masked: -inf): their bits order like the values
      int max_bits[1 + SAGE_WG_SOFTMAX_ILP];  // ILP: two chains of 4, not one of 8
      #pragma unroll
      for (int c = 0; c <= SAGE_WG_SOFTMAX_ILP; ++c) max_bits[c] = __float_as_int(-INFINITY);
      #pragma unroll
      for (int j = 8 * sub; j < 8 * sub + 8; ++j) {
        int& mb = max_bits[SAGE_WG_SOFTMAX_ILP ? j & 1 : 0];
        mb = __vimax3_s32(mb, __float_as_int(sf[4 * j + 2 * r]), __float_as_int(sf[4 * j + 2 * r + 1]));
      }
      mraw = __int_as_float(SAGE_WG_SOFTMAX_ILP ? max(max_bits[0], max_bits[SAGE_WG_SOFTMAX_ILP]) : max_bits[0]);
    } else {
      mraw = -INFINITY;
      #pragma unroll
      for (int j = 8 * sub; j < 8 * sub + 8; ++j)
        mraw = fmaxf(mraw, fmaxf(sf[4 * j + 2 * r], sf[4 * j + 2 * r + 1]));
    }
    mraw -= kScoreBiasF;  // exact (an integer below 2^24), or -inf
    mx = sub == 0 ? mraw * blk.dq[sub] : fmaxf(mx, mraw * blk.dq[sub]);
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  return mx;
}

// The first half of the online softmax for the thread's row r of a block (sf from scores_to_f32):
// the row's new running maximum (m_run[r]), its O rescale factor, and its exponent offset per
// 64-key scale block, so that p = exp2(sf * dq + neg_c). P_X448, LAZY: as softmax_probs_of.
template <int BLOCK_N, bool P_X448, bool LAZY>
__device__ __forceinline__ void softmax_row_head(int r, const float (&sf)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk,
                                                 float (&m_run)[2], float (&alpha)[2],
                                                 float (&neg_c)[BLOCK_N / kBlkK]) {
  constexpr int kSub = BLOCK_N / kBlkK;
  const float mx = row_block_max<BLOCK_N>(r, sf, blk);
  float m_new = fmaxf(m_run[r], mx);
  if constexpr (LAZY) {  // the old maximum stays while P <= 2^SAGE_WG_LAZY_RESCALE (-inf: moves)
    if (mx <= m_run[r] + static_cast<float>(SAGE_WG_LAZY_RESCALE)) m_new = m_run[r];
  }
  const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a fully masked row stays at 0
  alpha[r] = fast_exp2(m_run[r] - m_use);
  m_run[r] = m_new;
  // p = exp2((s - bias) * dq - m) = exp2(s * dq - (bias * dq + m))
  #pragma unroll
  for (int sub = 0; sub < kSub; ++sub)
    neg_c[sub] = P_X448 ? (kLog2Fp8PScale - static_cast<float>(kP8ViaF16Shift)) - fmaf(kScoreBiasF, blk.dq[sub], m_use)
                        : -fmaf(kScoreBiasF, blk.dq[sub], m_use);
}

// P = exp2(s * dq + neg_c) in place for n8 tiles j0 .. j1 - 1 of the thread's row r (sf from
// scores_to_f32, neg_c from softmax_row_head), each added to partial sum (2j + e) % SUMS of the row.
template <int BLOCK_N, int SUMS>
__device__ __forceinline__ void exp2_row_tiles(float (&sf)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk, int r,
                                               const float (&neg_c)[BLOCK_N / kBlkK], int j0, int j1,
                                               float (&rowsum)[SUMS]) {
  #pragma unroll
  for (int j = j0; j < j1; ++j)
    #pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float pv = softmax_exp2<SAGE_WG_EXP2_FMA>(fmaf(sf[4 * j + 2 * r + e], blk.dq[j / 8], neg_c[j / 8]), j);
      sf[4 * j + 2 * r + e] = pv;
      rowsum[(2 * j + e) % SUMS] += pv;
    }
}

// Base-2 online softmax of one block of biased int32 scores S (wgmma accumulator layout): updates
// the running max and sum, returns the O rescale factors and P (fp32, in the accumulator layout).
// MASK = false: the block needs no mask (blk.need_mask is false; softmax_probs below decides).
// P_X448 (FP8 P.V with SAGE_WG_FP8_P_FOLD): P and the row sum come out times 448.
// F16X2: P comes out as fp16x2 words, the bits of sf[4j + 2r] holding columns 2t, 2t+1 of n8 tile
// j, row r (sf[4j + 2r + 1] unused; pack_p16_frags<..., true> reads them).
template <int BLOCK_N, bool MASK, bool P_X448, bool LAZY = false, bool F16X2 = false>
__device__ __forceinline__ void softmax_probs_of(const int32_t (&s)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk,
                                              float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                              float (&sf)[BLOCK_N / 2]) {
  constexpr int kNT = BLOCK_N / 8;
  scores_to_f32<BLOCK_N, MASK>(s, blk, sf);
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    float neg_c[BLOCK_N / kBlkK];
    softmax_row_head<BLOCK_N, P_X448, LAZY>(r, sf, blk, m_run, alpha, neg_c);
    if constexpr (F16X2) {
      static_assert(!P_X448, "fp16 P only");
      uint32_t words[kNT];
      #pragma unroll
      for (int j = 0; j < kNT; ++j) {
        words[j] = exp2_f16x2(fmaf(sf[4 * j + 2 * r], blk.dq[j / 8], neg_c[j / 8]),
                              fmaf(sf[4 * j + 2 * r + 1], blk.dq[j / 8], neg_c[j / 8]));
        sf[4 * j + 2 * r] = __uint_as_float(words[j]);
      }
      l_run[r] = l_run[r] * alpha[r] + sum_f16x2<kNT>(words);
      continue;
    }
    constexpr int kSums = SAGE_WG_SOFTMAX_ILP ? 4 : 1;  // ILP: four chains of FADDs, not one of 32
    float rowsum[kSums];
    #pragma unroll
    for (int c = 0; c < kSums; ++c) rowsum[c] = 0.f;
    exp2_row_tiles<BLOCK_N>(sf, blk, r, neg_c, 0, kNT, rowsum);
    float sum = rowsum[0];
    if constexpr (kSums == 4) sum = (rowsum[0] + rowsum[1]) + (rowsum[2] + rowsum[3]);
    l_run[r] = l_run[r] * alpha[r] + sum;
  }
}

// The 16-bit A fragment of P.V k-step kc (keys 16kc .. 16kc+15) from P in the accumulator layout.
template <PvKind PV, int N>
__device__ __forceinline__ void pack_p16_step(const float (&sf)[N], int kc, uint32_t (&a)[4]) {
  #pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = pack_p16<PV>(sf[8 * kc + 2 * i], sf[8 * kc + 2 * i + 1]);
}

// P as the 16-bit A fragments of the P.V wgmma (n8 tiles 2kc, 2kc+1 = keys 16kc .. 16kc+15, the
// mma.m16n8k16 A layout).
// F16X2: sf holds the words softmax_probs_of<..., F16X2 = true> packed.
template <int BLOCK_N, PvKind PV, bool F16X2 = false>
__device__ __forceinline__ void pack_p16_frags(const float (&sf)[BLOCK_N / 2], uint32_t (&pn)[BLOCK_N / 16][4]) {
  #pragma unroll
  for (int kc = 0; kc < BLOCK_N / 16; ++kc) {
    if constexpr (F16X2) {
      #pragma unroll
      for (int i = 0; i < 4; ++i) pn[kc][i] = __float_as_uint(sf[8 * kc + 2 * i]);
      continue;
    }
    pack_p16_step<PV>(sf, kc, pn[kc]);
  }
}

// P * 448 as the e4m3 A fragments of the FP8 P.V wgmma (k32 steps): register r + 2 * half of step
// kc holds row g (+8 for r = 1), columns 2t, 2t+1 of n8 tiles 4kc + 2half and 4kc + 2half + 1,
// the order in which the FP8 V^T's stored tokens meet them (docs/kernels.md, sm89 V layout).
template <int BLOCK_N>
__device__ __forceinline__ void pack_p8_frags(const float (&sf)[BLOCK_N / 2], uint32_t (&pn)[BLOCK_N / 32][4]) {
  #pragma unroll
  for (int kc = 0; kc < BLOCK_N / 32; ++kc)
    #pragma unroll
    for (int r = 0; r < 2; ++r)
      #pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 4 * kc + 2 * half;
        if constexpr (SAGE_WG_FP8_P_VIA_F16) {  // sf is P * 448 / 256: fp16 pairs, then their bytes
          pn[kc][r + 2 * half] =
              e4m3x4_from_f16x2_scaled(pack_half2_rz(sf[4 * j + 2 * r], sf[4 * j + 2 * r + 1]),
                                       pack_half2_rz(sf[4 * j + 4 + 2 * r], sf[4 * j + 4 + 2 * r + 1]));
          continue;
        }
        constexpr float kMul = SAGE_WG_FP8_P_FOLD ? 1.f : kFp8PScale;  // folded: sf is P * 448 already
        const uint32_t lo = f32x2_to_e4m3x2(sf[4 * j + 2 * r] * kMul, sf[4 * j + 2 * r + 1] * kMul);
        const uint32_t hi = f32x2_to_e4m3x2(sf[4 * j + 4 + 2 * r] * kMul, sf[4 * j + 4 + 2 * r + 1] * kMul);
        pn[kc][r + 2 * half] = lo | (hi << 16);
      }
}

// f(std::true_type) for a block that some of the warp's rows need masked, else f(std::false_type):
// the code without mask selects (SAGE_WG_MASK_BRANCH; need_mask is warp-uniform). Without the
// branch ptxas if-converts the mask into an ISETP + SEL per score on every block.
template <int BLOCK_N, typename F>
__device__ __forceinline__ void with_mask_choice(const KBlock<BLOCK_N>& blk, F&& f) {
  if (!SAGE_WG_MASK_BRANCH || blk.need_mask)
    f(std::true_type{});
  else
    f(std::false_type{});
}

// The softmax of one block (the FP8 P.V path packs P itself).
template <int BLOCK_N, bool P_X448 = false>
__device__ __forceinline__ void softmax_probs(const int32_t (&s)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk,
                                              float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                              float (&sf)[BLOCK_N / 2]) {
  with_mask_choice(blk, [&](auto mask) {
    softmax_probs_of<BLOCK_N, decltype(mask)::value, P_X448>(s, blk, m_run, l_run, alpha, sf);
  });
}

// The softmax of one block, then P as the A fragments of the P.V of kind PV (FP8: P * 448 in e4m3,
// the 448 folded into the exp2 with SAGE_WG_FP8_P_FOLD; else 16-bit), for one mask arm.
template <int BLOCK_N, bool MASK, PvKind PV>
__device__ __forceinline__ void softmax_packed(const int32_t (&s)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk,
                                               float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                               uint32_t (&pa)[PV == PvKind::kFp8 ? BLOCK_N / 32 : BLOCK_N / 16][4]) {
  float sf[BLOCK_N / 2];
  if constexpr (PV == PvKind::kFp8) {
    softmax_probs_of<BLOCK_N, MASK, SAGE_WG_FP8_P_FOLD>(s, blk, m_run, l_run, alpha, sf);
    pack_p8_frags<BLOCK_N>(sf, pa);
  } else {
    softmax_probs_of<BLOCK_N, MASK, false, kLazyRescale16, kExp2F16x2<PV>>(s, blk, m_run, l_run, alpha, sf);
    pack_p16_frags<BLOCK_N, PV, kExp2F16x2<PV>>(sf, pa);
  }
}

// The softmax and the 16-bit packing together (the 16-bit P.V paths).
template <int BLOCK_N, PvKind PV>
__device__ __forceinline__ void online_softmax(const int32_t (&s)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk,
                                               float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                               uint32_t (&pn)[BLOCK_N / 16][4]) {
  with_mask_choice(blk, [&](auto mask) {
    float sf[BLOCK_N / 2];
    softmax_probs_of<BLOCK_N, decltype(mask)::value, false, kLazyRescale16, kExp2F16x2<PV>>(
        s, blk, m_run, l_run, alpha, sf);
    pack_p16_frags<BLOCK_N, PV, kExp2F16x2<PV>>(sf, pn);
  });
}

// SAGE_WG_PV_SPLIT: one block's online softmax in PARTS ranges of keys. After the maxima,
// after_head() runs (the O rescale, before any P.V of the block); then each range's exponentials,
// its P packed as the 16-bit A fragments of its P.V k-steps, and issue_part(part), which issues
// those k-steps: they run on the tensor cores while the next range's exponentials run on the MUFU.
// The row sums add the same values in the same order as softmax_probs_of.
template <int BLOCK_N, PvKind PV, int PARTS, typename AfterHead, typename IssuePart>
__device__ __forceinline__ void softmax_in_parts(const int32_t (&s)[BLOCK_N / 2], const KBlock<BLOCK_N>& blk,
                                                 float (&m_run)[2], float (&l_run)[2], float (&alpha)[2],
                                                 uint32_t (&pa)[BLOCK_N / 16][4], AfterHead&& after_head,
                                                 IssuePart&& issue_part) {
  constexpr int kNT = BLOCK_N / 8, kTiles = kNT / PARTS;  // n8 tiles per part
  static_assert(PV != PvKind::kFp8 && !kExp2F16x2<PV>, "16-bit P from fp32 exponentials");
  static_assert(kNT % PARTS == 0 && kTiles % 2 == 0, "a part is whole k16 steps");
  float sf[BLOCK_N / 2], neg_c[2][BLOCK_N / kBlkK];
  // only the scores' conversion in the mask arms: a wgmma issued in an arm is one ptxas serializes
  // (C7520, "compiler-inserted WG.AR in divergent path")
  with_mask_choice(blk, [&](auto mask) { scores_to_f32<BLOCK_N, decltype(mask)::value>(s, blk, sf); });
  #pragma unroll
  for (int r = 0; r < 2; ++r) softmax_row_head<BLOCK_N, false, kLazyRescale16>(r, sf, blk, m_run, alpha, neg_c[r]);
  after_head();
  float rowsum[2][1] = {{0.f}, {0.f}};
  #pragma unroll
  for (int part = 0; part < PARTS; ++part) {
    #pragma unroll
    for (int r = 0; r < 2; ++r)
      exp2_row_tiles<BLOCK_N>(sf, blk, r, neg_c[r], part * kTiles, (part + 1) * kTiles, rowsum[r]);
    #pragma unroll
    for (int kc = part * kTiles / 2; kc < (part + 1) * kTiles / 2; ++kc) pack_p16_step<PV>(sf, kc, pa[kc]);
    issue_part(part);
  }
  #pragma unroll
  for (int r = 0; r < 2; ++r) l_run[r] = l_run[r] * alpha[r] + rowsum[r][0];
}

// SAGE_WG_WS_P_SMEM: the A fragments of part `part`'s k-steps to the warpgroup's P tile (64 rows,
// 64-key atoms of 128-byte rows, 128B swizzle, K-major), one stmatrix x4 per k-step: its four
// 8x8 matrices are the fragment's registers (rows g / g+8, keys 16kc.. / 16kc+8..), and lane l
// gives the address of row l % 8 of matrix l / 8.
template <int BLOCK_N, int PARTS>
__device__ __forceinline__ void store_p_part(uint32_t p_tile, const uint32_t (&pa)[BLOCK_N / 16][4], int part, int wq,
                                             int lane) {
  constexpr int kSteps = BLOCK_N / 16 / PARTS;
  const int m = lane >> 3, row = wq * 16 + (lane & 7) + 8 * (m & 1);
  #pragma unroll
  for (int kc = part * kSteps; kc < (part + 1) * kSteps; ++kc) {
    const int j = 2 * kc + (m >> 1);  // the matrix's n8 tile of keys
    const uint32_t addr = p_tile + (j / 8) * (64 * 128) + swizzled<128>(row, j % 8);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(pa[kc][0]),
                 "r"(pa[kc][1]), "r"(pa[kc][2]), "r"(pa[kc][3])
                 : "memory");
  }
}

// O += P V for part `part`'s k-steps with P from the warpgroup's P tile (an SS wgmma).
template <int HEAD_DIM, int BLOCK_N, PvKind PV, int PARTS>
__device__ __forceinline__ void issue_pv_part_ss(float (&o)[HEAD_DIM / 2], uint32_t p_tile, uint32_t v_tile, int part) {
  constexpr int kSteps = BLOCK_N / 16 / PARTS;
  const uint64_t desc_v = v_desc<BLOCK_N>(v_tile);
  #pragma unroll
  for (int kc = part * kSteps; kc < (part + 1) * kSteps; ++kc) {
    // 16 keys = 32 bytes along the 128-byte rows of 64-key atom kc / 4; 8 rows = 1024 bytes
    const uint64_t desc_p = make_desc(p_tile + (kc / 4) * (64 * 128) + (kc % 4) * 32, 16, 1024, 1);
    pv_wgmma_ss<HEAD_DIM, PV>(o, desc_p, desc_v + 128 * kc);
  }
}

// A real use of P's registers after the wait that retires the P.V reading them, predicated off at
// run time (never: a condition that is always false but unknown to the compiler): ptxas protects
// an in-flight wgmma's accumulators, not its register A operand, so without a later use it hands
// P's registers to the code that runs while the P.V is in flight (docs/kernels.md).
template <int CHUNKS>
__device__ __forceinline__ void keep_p_live(const uint32_t (&pa)[CHUNKS][4], bool never, uint32_t scratch) {
  if (never) {
    #pragma unroll
    for (int kc = 0; kc < CHUNKS; ++kc)
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(scratch), "r"(pa[kc][0]), "r"(pa[kc][1]),
                   "r"(pa[kc][2]), "r"(pa[kc][3])
                   : "memory");
  }
}

template <int HEAD_DIM>
__device__ __forceinline__ void rescale(float (&o)[HEAD_DIM / 2], const float (&alpha)[2]) {
  #pragma unroll
  for (int j = 0; j < HEAD_DIM / 8; ++j) {
    o[4 * j + 0] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// Epilogue pieces. A row's 1 / l for O and its l for the LSE, from the thread's partial sum.
// FP8: O is P*448 times the scaled e4m3 V; with SAGE_WG_FP8_P_FOLD l carries the 448 too.
template <bool FP8>
struct RowNorm {
  float inv, l_true;
  __device__ __forceinline__ explicit RowNorm(float l_part) {
    const float l = quad_sum(l_part);
    constexpr bool kLx448 = FP8 && SAGE_WG_FP8_P_FOLD;
    inv = FP8 && !kLx448 ? 1.f / (l * kFp8PScale) : (kLx448 ? kP8SumScale : 1.f) / l;
    l_true = kLx448 ? l * (1.f / (kFp8PScale * kP8SumScale)) : l;
  }
};

// O / l of the thread's row r (0: g, 1: g + 8) at channels j * 8 + 2t and + 1, packed in the
// output's dtype. FP8: also V's per-channel scale and its mean added back (the sm89 contract).
template <int HEAD_DIM, typename OutT, bool FP8>
__device__ __forceinline__ uint32_t out_pair(const AttnParams& p, const float (&o)[HEAD_DIM / 2], float inv, int r,
                                             int j, int t, int64_t bhkv) {
  const int d = j * 8 + 2 * t;
  float a = o[4 * j + 2 * r] * inv, c = o[4 * j + 2 * r + 1] * inv;
  if constexpr (FP8) {
    a *= p.v_scale[bhkv * HEAD_DIM + d];
    c *= p.v_scale[bhkv * HEAD_DIM + d + 1];
    if (p.v_mean) {
      a += p.v_mean[bhkv * HEAD_DIM + d];
      c += p.v_mean[bhkv * HEAD_DIM + d + 1];
    }
  }
  return pack_out2<OutT>(a, c);
}

// Epilogue of the thread's rows row0 + g (+8): O / l in the output's dtype, and the LSE.
template <int HEAD_DIM, typename OutT, bool FP8 = false>
__device__ __forceinline__ void store_rows(const AttnParams& p, const float (&o)[HEAD_DIM / 2],
                                           const float (&l_run)[2], const float (&m_run)[2], int b,
                                           int h, int64_t bh, int row0, int g, int t, int64_t bhkv = 0) {
  OutT* out = reinterpret_cast<OutT*>(p.out) + b * p.o_sb + h * p.o_sh;
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    const RowNorm<FP8> norm(l_run[r]);
    const int row = row0 + g + 8 * r;
    if (row >= p.q_len) continue;
    OutT* orow = out + row * p.o_sn;
    #pragma unroll
    for (int j = 0; j < HEAD_DIM / 8; ++j)
      *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * t) = out_pair<HEAD_DIM, OutT, FP8>(p, o, norm.inv, r, j, t, bhkv);
    if (p.lse && t == 0) store_lse(p, bh, row, norm.l_true, m_run[r]);
  }
}

// Whether the output takes 16-byte stores: its base and its batch, head and row strides are
// multiples of 16 bytes (true for the output the bindings allocate).
template <typename OutT>
__device__ __forceinline__ bool out_16b_aligned(const AttnParams& p) {
  return ((reinterpret_cast<uintptr_t>(p.out) | static_cast<uint64_t>(p.o_sb | p.o_sh | p.o_sn) * sizeof(OutT)) &
          15u) == 0;
}

// The same epilogue for a consumer warpgroup's 64 rows from wg_row0 (SAGE_WG_STAGED_STORE): the
// thread's words go to the warpgroup's tile in shared memory (`stage`), then out as whole 16-byte
// chunks, so a warp's store covers two (d=128) or four (d=64) rows' contiguous bytes. The direct
// path's 4-byte stores touch 8 rows per warp instruction; in the H100 trace
// (benchmarks/results/h100-2026-12-06-trace-6f496e1.log) they took ~2300-4200 cycles per tile,
// ~10% of a tile at n=1024. The tile is laid out as the copy engine's 128B-swizzled boxes of 64
// channels x 64 rows (chunk c of row r in box c / 8, at chunk (c % 8) ^ (r % 8) of the row's 128
// bytes): the 8 rows a warp writes at once fall in distinct banks, and with `tma` (the output's
// map, SAGE_WG_TMA_STORE) thread 0 of the warpgroup hands the boxes to the copy engine instead.
// `barrier`: a named barrier of this warpgroup's 128 threads. The caller checked out_16b_aligned.
__device__ __forceinline__ uint32_t staged_chunk(uint32_t stage, int lrow, int c) {
  return stage + (c / 8) * (64 * 128) + lrow * 128 + (((c % 8) ^ (lrow & 7)) << 4);
}
template <int HEAD_DIM, typename OutT, bool FP8 = false>
__device__ __forceinline__ void store_rows_staged(const AttnParams& p, const float (&o)[HEAD_DIM / 2],
                                                  const float (&l_run)[2], const float (&m_run)[2], int b, int h,
                                                  int64_t bh, int wg_row0, int wq, int g, int t, int64_t bhkv,
                                                  uint32_t stage, int barrier, const CUtensorMap* tma = nullptr) {
  constexpr int kChunks = HEAD_DIM / 8;
  static_assert(HEAD_DIM % 64 == 0, "whole 64-channel boxes");
  const int ti = threadIdx.x & 127;
  // every thread has read the warpgroup's previous tile out (or, with the copy engine, its
  // issuing thread has seen the boxes read)
  if (tma != nullptr && ti == 0) sm90::tma_store_wait_all<true>();
  sm90::named_sync(barrier, 128);
  #pragma unroll
  for (int r = 0; r < 2; ++r) {
    const RowNorm<FP8> norm(l_run[r]);
    const int lrow = wq * 16 + g + 8 * r;  // lrow % 8 == g
    #pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const uint32_t word = out_pair<HEAD_DIM, OutT, FP8>(p, o, norm.inv, r, j, t, bhkv);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(staged_chunk(stage, lrow, j) + 4 * t), "r"(word)
                   : "memory");
    }
    const int row = wg_row0 + lrow;
    if (p.lse && t == 0 && row < p.q_len) store_lse(p, bh, row, norm.l_true, m_run[r]);
  }
  if (tma != nullptr) fence_proxy_async_smem();  // the words -> the copy engine's reads
  sm90::named_sync(barrier, 128);  // the tile is in shared memory
  if (tma != nullptr) {
    if (ti == 0) {
      #pragma unroll
      for (int box = 0; box < HEAD_DIM / 64; ++box)
        sm90::tma_store_4d(tma, stage + box * 64 * 128, box * 64, wg_row0, h, b);
      sm90::tma_store_commit();
    }
    return;
  }
  OutT* out = reinterpret_cast<OutT*>(p.out) + b * p.o_sb + h * p.o_sh;
  #pragma unroll
  for (int i = 0; i < 64 * kChunks / 128; ++i) {
    const int idx = i * 128 + ti, lrow = idx / kChunks, c = idx % kChunks;
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(staged_chunk(stage, lrow, c))
                 : "memory");
    const int row = wg_row0 + lrow;
    if (row < p.q_len) *reinterpret_cast<uint4*>(out + row * p.o_sn + c * 8) = v;
  }
}

}  // namespace wg

template <int HEAD_DIM, int NWG, int BLOCK_N, PvKind PV, typename OutT>
__global__ void __launch_bounds__(NWG * 128, SAGE_WG_MINB) attn_wgmma_kernel(const AttnParams p) {
#if defined(SAGE_HAS_WGMMA)
  using Tr = WgmmaTraits<HEAD_DIM, NWG, BLOCK_N>;
  constexpr int kThreads = Tr::kThreads;
  constexpr int kCtaQ = Tr::kCtaQ;
  static_assert(pv_is_16bit(PV), "16-bit P.V");

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t s0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = s0;
  const uint32_t sK = sQ + Tr::kQBytes;
  const uint32_t sV = sK + 2 * Tr::kKBytes;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wgi = warp >> 2, wq = warp & 3;  // warpgroup, warp inside it
  [[maybe_unused]] const uint32_t sP = sV + 2 * Tr::kVBytes + wgi * Tr::kPBytes;  // this WG's P
  const int g = lane >> 2, t = lane & 3;
  const CtaTile cta(p, kCtaQ, BLOCK_N);
  const int b = cta.b, h = cta.h, hkv = cta.hkv, q0 = cta.q0, n_kblocks = cta.n_kblocks;
  const int64_t bh = cta.bh, bhkv = cta.bhkv;

  const int8_t* gQ = p.q + (bh * p.q_pad + q0) * HEAD_DIM;
  const int8_t* gK = p.k + bhkv * p.k_pad * HEAD_DIM;
  const __half* gV = reinterpret_cast<const __half*>(p.v) + b * p.v_sb + hkv * p.v_sh;  // 16-bit

  // ---- async copies into the swizzled layouts ----
  const wg::QKCopy<HEAD_DIM, BLOCK_N, kThreads> copy_k(gK, tid);
  const wg::VCopy<HEAD_DIM, BLOCK_N, kThreads> copy_v(gV, p.v_sn, tid);
  auto load_k = [&](int kb, int buf) {
    copy_k(sK + buf * Tr::kKBytes, kb * BLOCK_N, p.k_pad - kb * BLOCK_N);
  };
  auto load_v = [&](int kb, int buf) {
    copy_v(sV + buf * Tr::kVBytes, kb * BLOCK_N, p.kv_len - kb * BLOCK_N);
  };
  wg::QKCopy<HEAD_DIM, kCtaQ, kThreads>(gQ, tid)(sQ, 0, kCtaQ);
  load_k(0, 0);
  load_v(0, 0);
  cp_async_commit();

  // ---- per-thread state: rows row0 + g and row0 + g + 8 ----
  const int wrow0 = wgi * 64 + wq * 16;  // inside the CTA
  const wg::ThreadScales sc(p, bh, bhkv, q0 + wrow0, g, t);

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[HEAD_DIM / 2];
  #pragma unroll
  for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;

  const uint64_t desc_q = wg::qk_desc<HEAD_DIM>(sQ + wgi * 64 * HEAD_DIM);
  auto issue_qk = [&](int32_t (&acc)[BLOCK_N / 2], int kb) {
    wg::issue_qk<HEAD_DIM, BLOCK_N>(acc, desc_q, sK + (kb & 1) * Tr::kKBytes);
  };
  auto issue_pv = [&](const uint32_t (&pa)[BLOCK_N / 16][4], int kb) {
#if SAGE_WG_P_SMEM
    const uint64_t desc_v = wg::v_desc<BLOCK_N>(sV + (kb & 1) * Tr::kVBytes);
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc) {
      // A = P tile: 64-key atom kc / 4, +32 bytes (16 keys) per step inside it; 8 rows = 1024 B
      const uint64_t desc_p = wg::make_desc(sP + (kc / 4) * (64 * 128) + (kc % 4) * 32, 16, 1024, 1);
      wg::pv_wgmma_ss<HEAD_DIM, PV>(o, desc_p, desc_v + 128 * kc);
    }
#else
    wg::issue_pv<HEAD_DIM, BLOCK_N, PV>(o, pa, sV + (kb & 1) * Tr::kVBytes);
#endif
  };
  auto preset_s = wg::preset_scores<BLOCK_N>;

  // Pipeline (one warpgroup's view): S_{j+1} = Q K_{j+1} and O += P_j V_j are issued together;
  // the softmax of S_{j+1} then runs while P_j V_j is still on the tensor cores. K is copied two
  // blocks ahead, V one.
  if (n_kblocks > 1) load_k(1, 1);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_smem();
  __syncthreads();
  int32_t s_i[BLOCK_N / 2];
  preset_s(s_i);
  wgmma_fence();
  issue_qk(s_i, 0);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_pin(s_i);

  uint32_t pa[BLOCK_N / 16][4];
  for (int kb = 0; kb < n_kblocks; ++kb) {
    // ---- softmax of S_kb (base 2) while P_{kb-1} V_{kb-1} runs ----
    const wg::KBlock<BLOCK_N> blk(p, kb, sc, q0 + wrow0, g, t);
    float alpha[2];
    uint32_t pn[BLOCK_N / 16][4];
    wg::online_softmax<BLOCK_N, PV>(s_i, blk, m_run, l_run, alpha, pn);

    // ---- P_{kb-1} V_{kb-1} done: rescale O, hand over the buffers ----
    wgmma_wait<0>();
    wgmma_pin(o);
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc) wgmma_pin(pa[kc]);  // P_{kb-1} live until its wgmma is done
    wg::rescale<HEAD_DIM>(o, alpha);
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc)
      #pragma unroll
      for (int e = 0; e < 4; ++e) pa[kc][e] = pn[kc][e];
#if SAGE_WG_P_SMEM
    // P_kb to this warpgroup's tile (P_{kb-1} V_{kb-1}, its reader, is done); the fence and the
    // barrier below make it visible to the tensor cores. Thread: rows wq*16 + g (+8), keys
    // 16kc + 2t (+1) and 16kc + 8 + 2t (+1).
    #pragma unroll
    for (int kc = 0; kc < BLOCK_N / 16; ++kc)
      #pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = wq * 16 + g + 8 * (e & 1), j = 2 * kc + (e >> 1);  // n8 tile j
        const uint32_t addr = sP + (j / 8) * (64 * 128) + wg::swizzled<128>(row, j % 8) + 4 * t;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pn[kc][e]) : "memory");
      }
#endif
    cp_async_wait<0>();
    fence_proxy_async_smem();  // cp.async data -> the tensor cores' (async proxy) reads
    __syncthreads();           // V_kb and K_{kb+1} landed; every warpgroup is past P V_{kb-1}, S_kb
    if (kb + 1 < n_kblocks) load_v(kb + 1, (kb + 1) & 1);
    if (kb + 2 < n_kblocks) load_k(kb + 2, kb & 1);
    cp_async_commit();

    // ---- issue S_{kb+1} = Q K_{kb+1} and O += P_kb V_kb ----
    // The last block issues an unused S too (on the other K buffer's stale tile): no branch around
    // the wgmma groups, which ptxas would otherwise serialize.
    preset_s(s_i);
    wgmma_fence();
    issue_qk(s_i, kb + 1);
    wgmma_commit();
    issue_pv(pa, kb);
    wgmma_commit();
#if SAGE_WG_PV_OVERLAP
    wgmma_wait<1>();  // S_{kb+1} ready; P_kb V_kb may still run
#else
    wgmma_wait<0>();  // S_{kb+1} and P_kb V_kb done: no register of an in-flight wgmma is live
#endif
    wgmma_pin(s_i);
  }
  wgmma_wait<0>();
  wgmma_pin(o);

  wg::store_rows<HEAD_DIM, OutT>(p, o, l_run, m_run, b, h, bh, q0 + wrow0, g, t);
#else
  __trap();  // built without sm_90a: the launcher never selects this kernel
#endif
}

template <int HEAD_DIM, int NWG, int BLOCK_N, PvKind PV, typename OutT>
cudaError_t launch_attn_wgmma(const AttnParams& p, cudaStream_t stream) {
  return launch_over_query_blocks<attn_wgmma_kernel<HEAD_DIM, NWG, BLOCK_N, PV, OutT>,
                                  WgmmaTraits<HEAD_DIM, NWG, BLOCK_N>>(p, stream);
}

// ---- Warp-specialized variant (SAGE_WG_WS): a producer warpgroup copies, consumers only compute ----
//
// The kernel above keeps a CTA barrier per K block, which holds its warpgroups in lockstep: they
// run their softmax at the same time and then queue their wgmmas at the same time, so the tensor
// cores idle through every softmax. Here warpgroup NWG (the last) is a producer: its 128 threads
// cp.async Q once and K/V into a ring of STAGES buffers, each buffer's arrival signalled on an
// mbarrier (cp.async.mbarrier.arrive.noinc), and wait for the consumers to release a buffer (an
// "empty" mbarrier) before refilling it. The consumer warpgroups never meet at a barrier, so their
// softmax and MMA phases can drift apart; PINGPONG makes them take turns (named barriers) so
// that one's softmax overlaps the other's products: 1, a warpgroup issues once the other has
// issued; 2, once the other's products are done (a warpgroup's wgmmas then run alone: on the
// H200 the issue of a wgmma stalls while the tensor cores are busy, so two warpgroups issuing
// together finish together and fall into lockstep, gpu_dev_profile.py trace).
// The producer gives most of its registers to the consumers (setmaxnreg).
// V_BYTES: bytes per V element (2: fp16/bf16 V, MN-major; 1: FP8 V^T, K-major, kFp8VTerms terms).
template <int HEAD_DIM, int NWG, int BLOCK_N, int STAGES, int V_BYTES = 2, bool PERSISTENT = false>
struct WgmmaWsTraits {
  static constexpr int kConsumers = NWG * 128;
  static constexpr int kThreads = kConsumers + 128;
  static constexpr int kCtaQ = NWG * 64;
  static constexpr int kQBytes = kCtaQ * HEAD_DIM;
  static constexpr int kKBytes = BLOCK_N * HEAD_DIM;
  static constexpr int kVBytes = BLOCK_N * HEAD_DIM * (V_BYTES == 1 ? kFp8VTerms : V_BYTES);
  static constexpr int kQStages = PERSISTENT ? 2 : 1;  // Q buffers
  // full K, full V, empty per K/V stage; full and empty per Q buffer; then (persistent) the tile of
  // each Q buffer (int64, the dynamic scheduler's hand-over)
  // SAGE_WG_WS_P_SMEM 2: also an empty barrier per stage for V alone (after them)
  static constexpr bool kPOverlap = SAGE_WG_WS_P_SMEM == 2 && V_BYTES == 2 && NWG <= 2;
  static constexpr int kTileSlotOffset = (3 * STAGES + 2 * kQStages + (kPOverlap ? STAGES : 0)) * 8;
  static constexpr int kTileSlotBytes = 32;  // the kernel's TileSlot
  static constexpr int kBarBytes = kTileSlotOffset + (PERSISTENT ? kTileSlotBytes * kQStages : 0);
  // SAGE_WG_STAGED_STORE: each consumer warpgroup's output tile (64 rows of 16-bit values)
  static constexpr bool kStagedStore = SAGE_WG_STAGED_STORE == 1 || (SAGE_WG_STAGED_STORE == 2 && NWG <= 2);
  static constexpr int kOBytes = kStagedStore ? NWG * 64 * HEAD_DIM * 2 : 0;
  // SAGE_WG_WS_P_SMEM: each consumer warpgroup's P tile (64 rows of BLOCK_N 16-bit values)
  static constexpr bool kPSmem = SAGE_WG_WS_P_SMEM != 0 && V_BYTES == 2 && NWG <= 2;
  static constexpr int kPBytes = kPSmem ? NWG * 64 * BLOCK_N * 2 : 0;
  static constexpr int kSmemBytes =
      kQStages * kQBytes + STAGES * (kKBytes + kVBytes) + kOBytes + kPBytes + kBarBytes + 1024;
  // CTAs per SM the launch bounds ask for: one consumer warpgroup leaves room for two CTAs.
  static constexpr int kMinBlocks = SAGE_WG_WS_MINB > 0 ? SAGE_WG_WS_MINB : NWG == 1 ? 2 : 1;
  // setmaxnreg moves registers from the producer to the consumers: each thread enters with
  // kEntryRegs (what the launch bounds leave, rounded down to 8), and NWG * consumer + producer
  // = (NWG + 1) * kEntryRegs (multiples of 8).
  static constexpr int kEntryRegs = 65536 / (kThreads * kMinBlocks) / 8 * 8;
#ifdef SAGE_WG_PRODUCER_REGS
  static constexpr int kProducerRegs = SAGE_WG_PRODUCER_REGS;
#else
  // three consumers: 32 leaves them 160 (at 152 ptxas serialized their wgmmas, C7512); four: 112.
  // Two 16-bit consumers get 224; 24 here (240 each) was level on an H100, 0.994x (2026-12-06,
  // benchmarks/results/h100-2026-12-06-tune-fe57cc4-native.log).
  static constexpr int kProducerRegs = NWG == 4 ? 24 : NWG == 3 ? 32 : V_BYTES == 1 ? 40 : 56;
#endif
  static constexpr int kConsumerRegs = ((NWG + 1) * kEntryRegs - kProducerRegs) / NWG / 8 * 8;
  // Three or four: the CTA's 192 / 256 rows run past the 128-row Q padding; the kernel asks for
  // the copy engine, which fills rows past q_pad with zeros, and ThreadScales clamps their scale
  // index.
  static_assert(NWG >= 1 && NWG <= 4, "one to four consumer warpgroups");
  static_assert(STAGES >= 2, "at least double buffering");
  static_assert(NWG * kConsumerRegs + kProducerRegs <= (NWG + 1) * kEntryRegs && kProducerRegs % 8 == 0 &&
                kProducerRegs >= 24 && kConsumerRegs <= 256, "register split");
};

// SAGE_WG_TMA: the tensor maps of Q [B*Hq][q_pad][D] and K [B*Hkv][k_pad][D] (bytes), and of V:
// FP8 V^T [B*Hkv][terms*D][k_pad] (bytes) or 16-bit V as the caller gave it (sm90::encode_v16_map);
// kernel parameters (TMA reads a map from parameter space). NoTmaMaps: the cp.async path.
struct WsTmaMaps {
  CUtensorMap q, k, v;
  CUtensorMap o;  // SAGE_WG_TMA_STORE: the output, when o_ok
  int o_ok;
};
struct NoTmaMaps {};
// Whether the kernel for P.V type PV takes the TMA path: a variable template, so that the maps'
// members are named only where the instantiation has them (a plain constant would have the
// compiler check `maps.q` in the cp.async build too).
template <PvKind PV>
inline constexpr bool kWsTma = SAGE_WG_TMA != 0;

// PV: fp16 / bf16 P.V on V as given ("fp32" accumulation; the sm90 family), or FP8 (P * 448 and the
// sm89 family's e4m3 V^T with per-channel scales; the sm90_fp8 family). TWO_LEVEL (FP8):
// each block's P.V into its own accumulator, added to O in fp32 ("fp32+fp32"); else straight into
// O ("fp32").
#if SAGE_WG_TRACE >= 0
namespace wg_trace {
// K blocks kFirst.. of the first tile, and the first kTiles tiles
constexpr int kFirst = SAGE_WG_TRACE_FIRST, kBlocks = 16, kTiles = SAGE_WG_TRACE_TILES;
constexpr int kWgs = 4;  // consumer warpgroups a CTA can have
// One per module (static: each .cu has its own, read by its own print_kernel).
struct Buffer {
  int written[kWgs];  // per consumer warpgroup: the traced CTA ran
  unsigned smid;
  uint32_t entry[kWgs];
  int block_count[kWgs];  // traced K blocks of the first tile
  uint32_t block[kWgs][kBlocks][5];
  int tile_count[kWgs];
  int tile_blocks[kWgs][kTiles];
  uint32_t tile[kWgs][kTiles][5];
};
static __device__ Buffer g_buffer;

// The lines gpu_dev_profile.py trace reads; launched after the attention kernel on its stream.
static __global__ void print_kernel() {
  Buffer& b = g_buffer;
  for (int w = 0; w < kWgs; ++w) {
    if (!b.written[w]) continue;
    for (int i = 0; i < b.block_count[w]; ++i)
      printf("TRACE sm %u wg %d kb %d %u %u %u %u %u\n", b.smid, w, kFirst + i, b.block[w][i][0], b.block[w][i][1],
             b.block[w][i][2], b.block[w][i][3], b.block[w][i][4]);
    for (int i = 0; i < b.tile_count[w]; ++i)
      printf("TRACE_TILE sm %u wg %d it %d nkb %d entry %u %u %u %u %u %u\n", b.smid, w, i, b.tile_blocks[w][i],
             b.entry[w], b.tile[w][i][0], b.tile[w][i][1], b.tile[w][i][2], b.tile[w][i][3], b.tile[w][i][4]);
    b.written[w] = 0;
  }
}
}  // namespace wg_trace
#endif

template <int HEAD_DIM, int NWG, int BLOCK_N, int STAGES, int PINGPONG, PvKind PV, typename OutT,
          bool TWO_LEVEL = false, bool PERSISTENT = false>
__global__ void __launch_bounds__((NWG + 1) * 128, WgmmaWsTraits<HEAD_DIM, NWG, BLOCK_N, STAGES>::kMinBlocks)
    attn_wgmma_ws_kernel(const AttnParams p,
                         const __grid_constant__ std::conditional_t<kWsTma<PV>, WsTmaMaps, NoTmaMaps> maps,
                         unsigned long long* tile_counter) {  // SAGE_WG_PERSISTENT 2: zeroed per call
#if defined(SAGE_HAS_WGMMA)
  constexpr bool kFp8 = PV == PvKind::kFp8;
  constexpr bool kTma = kWsTma<PV>;  // the copy engine fills Q, K and V (or V^T)
  using Tr = WgmmaWsTraits<HEAD_DIM, NWG, BLOCK_N, STAGES, kFp8 ? 1 : 2, PERSISTENT>;
  // the 16-bit P.V in parts during the softmax; not with three or four consumer warpgroups, whose
  // registers are too few for P to stay live across it (ptxas serializes the wgmmas there)
  constexpr int kPvSplit = kFp8 || NWG > 2 ? 1 : SAGE_WG_PV_SPLIT;
  // SAGE_WG_WS_P_SMEM 2 (Tr::kPOverlap): the softmax of block kb while P_{kb-1} V_{kb-1} runs,
  // P through the warpgroup's tile (its own loop)
  constexpr bool kPOverlap = Tr::kPOverlap;
  static_assert(!kPOverlap || (kTma && !PINGPONG && !SAGE_WG_FUSED_UPDATE && kPvSplit == 1),
                "SAGE_WG_WS_P_SMEM 2: the copy engine's producer, no turns, no fused update, no split");
  // SAGE_WG_WS_P_SMEM 1 (Tr::kPSmem): P.V from the warpgroup's P tile, through the parts path
  constexpr bool kPartsPath = (kPvSplit > 1 || Tr::kPSmem) && !kPOverlap;
  static_assert(!kPartsPath || (!PINGPONG && !SAGE_WG_FUSED_UPDATE),
                "SAGE_WG_PV_SPLIT, SAGE_WG_WS_P_SMEM: the plain loop only");
  static_assert(!kFp8 || BLOCK_N == 128, "FP8 V^T tiles are 128 tokens (128-byte rows)");
  static_assert(!TWO_LEVEL || kFp8, "two-level accumulation is the FP8 path's");
  static_assert(!PINGPONG || NWG == 2, "ping-pong needs two consumer warpgroups");
  static_assert(NWG <= 2 || kTma, "three or four consumer warpgroups read Q rows past q_pad: the copy engine's zeros");
  static_assert(!PERSISTENT || !SAGE_WG_WS_OVERLAP, "the persistent kernel runs the plain loop");
  static_assert(!SAGE_WG_EARLY_PRESET || SAGE_WG_FUSED_UPDATE, "SAGE_WG_EARLY_PRESET needs SAGE_WG_FUSED_UPDATE");
  static_assert(!SAGE_WG_QK_AHEAD || (SAGE_WG_FUSED_UPDATE && !PINGPONG && !SAGE_WG_WS_OVERLAP &&
                                       !SAGE_WG_INTERLEAVE),
                "SAGE_WG_QK_AHEAD needs SAGE_WG_FUSED_UPDATE, and no ping-pong, overlap or interleave");
  constexpr bool kDynamic = PERSISTENT && SAGE_WG_PERSISTENT == 2;  // tiles from tile_counter
  // SAGE_WG_NEXT_TILE_QK: the plain loop of the dynamic persistent kernel only
  [[maybe_unused]] constexpr bool kNextTileQk =
      SAGE_WG_NEXT_TILE_QK && kDynamic && !kPOverlap && !SAGE_WG_QK_AHEAD && !SAGE_WG_WS_OVERLAP;
  constexpr int kProducerBarrier = 3;  // named barrier of the producer's 128 threads (ping-pong: 1, 2)
  constexpr int kStoreBarrier = 4;     // + wgi: each consumer warpgroup's (SAGE_WG_STAGED_STORE)
  constexpr int kPBarrier = 6;         // + wgi: each consumer warpgroup's (SAGE_WG_WS_P_SMEM)

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sQ0 = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ0 + Tr::kQStages * Tr::kQBytes;
  const uint32_t sV = sK + STAGES * Tr::kKBytes;
  const uint32_t sO = sV + STAGES * Tr::kVBytes;  // SAGE_WG_STAGED_STORE: the output tiles
  const uint32_t sP = sO + Tr::kOBytes;           // SAGE_WG_WS_P_SMEM: the P tiles
  const uint32_t bars = sP + Tr::kPBytes;
  auto full_k = [&](int st) { return bars + 8 * st; };
  auto full_v = [&](int st) { return bars + 8 * (STAGES + st); };
  auto empty = [&](int st) { return bars + 8 * (2 * STAGES + st); };
  auto full_q = [&](int qs) { return bars + 8 * (3 * STAGES + qs); };
  auto q_empty = [&](int qs) { return bars + 8 * (3 * STAGES + Tr::kQStages + qs); };
  // Tr::kPOverlap: a stage's V is free (empty then means its K is)
  auto empty_v = [&](int st) { return bars + 8 * (3 * STAGES + 2 * Tr::kQStages + st); };
  // the tile whose Q is in buffer qs (dynamic scheduler; written by producer thread 0)
  // Its index (-1: none left) and, with SAGE_WG_TILE_SLOT, its fields decoded by the producer
  // (tried against the consumers' own decoding, 64-bit divisions, in the ~1000-1200 cycles
  // between a tile's start and its first K of benchmarks/results/h100-2026-12-06-tune-5c93194-trace.log).
  struct TileSlot {
    int64_t tile;
    int b, h, hkv, q0, n_kblocks, unused;
  };
  static_assert(sizeof(TileSlot) == Tr::kTileSlotBytes, "TileSlot layout");
  auto tile_slot = [&](int qs) -> volatile TileSlot& {
    return *reinterpret_cast<volatile TileSlot*>(smem_raw + (bars - smem_u32(smem_raw)) + Tr::kTileSlotOffset +
                                                 Tr::kTileSlotBytes * qs);
  };
  auto slot_tile = [&](int qs) {
    const volatile TileSlot& s = tile_slot(qs);
    return CtaTile::of(p, s.b, s.h, s.hkv, s.q0, s.n_kblocks);
  };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wgi = warp >> 2;
#if SAGE_WG_TRACE >= 0
  const uint32_t trace_entry = clock();
#endif
  // The CTA's tiles: its place in the grid, or (persistent) every gridDim.x-th tile from
  // blockIdx.x, or (dynamic) those the producer takes from tile_counter. Both roles walk them in
  // the same order, and count the K blocks of the tiles before (g0, folded by ws_ring_after): the
  // ring's stage and phase of block kb are those of block g0 + kb.
  const int n_qblocks = (p.q_len + Tr::kCtaQ - 1) / Tr::kCtaQ;
  const int64_t n_tiles = PERSISTENT ? static_cast<int64_t>(n_qblocks) * p.q_heads * p.batch : 1;
  const int64_t first_tile = PERSISTENT ? blockIdx.x : 0, tile_step = PERSISTENT ? gridDim.x : 1;
  auto tile_at = [&](int64_t tile) {
    if constexpr (PERSISTENT && SAGE_WG_TILE_DECODE32) {
      if (n_tiles <= INT32_MAX) {  // then heads * batch and the quotients fit 32 bits too
        const uint32_t t = static_cast<uint32_t>(tile), nq = static_cast<uint32_t>(n_qblocks);
        const uint32_t heads = static_cast<uint32_t>(p.q_heads), hb_count = heads * static_cast<uint32_t>(p.batch);
        const bool qblock_major = SAGE_WG_TILE_ORDER == 1;  // as CtaTile's int64 decode
        const uint32_t qblk = qblock_major ? t / hb_count : t % nq, hb = qblock_major ? t % hb_count : t / nq;
        return CtaTile(p, Tr::kCtaQ, BLOCK_N, static_cast<int>(qblk), static_cast<int>(hb % heads),
                       static_cast<int>(hb / heads), n_qblocks);
      }
    }
    return PERSISTENT ? CtaTile(p, Tr::kCtaQ, BLOCK_N, tile, n_qblocks, SAGE_WG_TILE_ORDER == 1)
                      : CtaTile(p, Tr::kCtaQ, BLOCK_N);
  };

  if (tid == 0) {
    for (int st = 0; st < STAGES; ++st) {
      // one cp.async arrival per producer thread, or the TMA thread's arrival with the tile's bytes
      sm90::mbar_init(full_k(st), kTma ? 1 : 128);
      sm90::mbar_init(full_v(st), kTma ? 1 : 128);
      sm90::mbar_init(empty(st), Tr::kConsumers);
      if constexpr (Tr::kPOverlap) sm90::mbar_init(empty_v(st), Tr::kConsumers);
    }
    for (int qs = 0; qs < Tr::kQStages; ++qs) {
      // dynamic, cp.async: also producer thread 0's plain arrive, which releases the tile slot
      sm90::mbar_init(full_q(qs), kTma ? 1 : kDynamic ? 129 : 128);
      sm90::mbar_init(q_empty(qs), Tr::kConsumers);
    }
    if constexpr (kTma) sm90::mbar_init_fence();
  }
  __syncthreads();  // the only CTA-wide barrier: the mbarriers are initialised

  if (wgi == NWG) {  // ---- producer ----
    sm90::regs_lower<Tr::kProducerRegs>();
    const int ptid = tid - Tr::kConsumers;
    if constexpr (kTma) {  // one thread issues every copy; rows past k_pad (V: kv_len) arrive as zeros
      if (ptid != 0) return;
      sm90::tma_prefetch_map(&maps.q);
      sm90::tma_prefetch_map(&maps.k);
      sm90::tma_prefetch_map(&maps.v);
    }
    int g0 = 0, it = 0;
    for (int64_t tile = first_tile; kDynamic || tile < n_tiles; tile += tile_step, ++it) {
      const int qs = it % Tr::kQStages;
      if (it >= Tr::kQStages) sm90::mbar_wait(q_empty(qs), (it / Tr::kQStages - 1) & 1);  // its last QK is done
      if constexpr (kDynamic) {
        if (ptid == 0) {
          const unsigned long long next = atomicAdd(tile_counter, 1ull);
          volatile TileSlot& slot = tile_slot(qs);
          if (next < static_cast<unsigned long long>(n_tiles)) {
            if constexpr (SAGE_WG_TILE_SLOT != 0) {
              const CtaTile c = tile_at(static_cast<int64_t>(next));
              slot.b = c.b; slot.h = c.h; slot.hkv = c.hkv; slot.q0 = c.q0; slot.n_kblocks = c.n_kblocks;
            }
            slot.tile = static_cast<int64_t>(next);
          } else {
            slot.tile = -1;
          }
          if constexpr (!kTma) sm90::mbar_arrive(full_q(qs));  // releases the slot to the consumers
        }
        if constexpr (!kTma) sm90::named_sync(kProducerBarrier, 128);  // the other producer threads read it
        tile = tile_slot(qs).tile;
        if (tile < 0) {  // no tile left: the consumers see -1 in the slot and stop too
          // every producer thread still in the loop (TMA: thread 0, whose arrival is the phase;
          // cp.async: all 128, which with thread 0's slot arrival make the 129)
          sm90::mbar_arrive(full_q(qs));
          break;
        }
      }
      const CtaTile cta = kDynamic && SAGE_WG_TILE_SLOT ? slot_tile(qs) : tile_at(tile);
      const int n_kblocks = cta.n_kblocks;
      const uint32_t sQ = sQ0 + qs * Tr::kQBytes;
      // K/V block kb goes to stage (g0 + kb) % STAGES once that stage's last reader is done
      auto wait_stage = [&](int kb) {
        const int gb = g0 + kb;
        if (gb >= STAGES) sm90::mbar_wait(empty(gb % STAGES), (gb / STAGES - 1) & 1);
        return gb % STAGES;
      };
      if constexpr (kTma) {
        sm90::mbar_arrive_expect_tx(full_q(qs), Tr::kQBytes);
        sm90::tma_load_3d(sQ, &maps.q, 0, cta.q0, static_cast<int>(cta.bh), full_q(qs));
        for (int kb = 0; kb < n_kblocks; ++kb) {
          const int st = wait_stage(kb);
          sm90::mbar_arrive_expect_tx(full_k(st), Tr::kKBytes);
          sm90::tma_load_3d(sK + st * Tr::kKBytes, &maps.k, 0, kb * BLOCK_N, static_cast<int>(cta.bhkv), full_k(st));
          if constexpr (Tr::kPOverlap) {  // empty said the stage's K is free; its V may still be read
            const int gb = g0 + kb;
            if (gb >= STAGES) sm90::mbar_wait(empty_v(st), (gb / STAGES - 1) & 1);
          }
          sm90::mbar_arrive_expect_tx(full_v(st), Tr::kVBytes);
          if constexpr (kFp8) {
            sm90::tma_load_3d(sV + st * Tr::kVBytes, &maps.v, kb * BLOCK_N, 0, static_cast<int>(cta.bhkv), full_v(st));
          } else {  // one box per 64-channel MN-major atom, each its own BLOCK_N x 128-byte block (VCopy)
            #pragma unroll
            for (int atom = 0; atom < HEAD_DIM / 64; ++atom)
              sm90::tma_load_4d(sV + st * Tr::kVBytes + atom * BLOCK_N * 128, &maps.v, atom * 64, kb * BLOCK_N,
                                cta.hkv, cta.b, full_v(st));
          }
        }
      } else {
        const int8_t* gK = p.k + cta.bhkv * p.k_pad * HEAD_DIM;
        wg::QKCopy<HEAD_DIM, Tr::kCtaQ, 128>(p.q + (cta.bh * p.q_pad + cta.q0) * HEAD_DIM, ptid)(sQ, 0, Tr::kCtaQ);
        sm90::mbar_arrive_on_cp_async(full_q(qs));
        const wg::QKCopy<HEAD_DIM, BLOCK_N, 128> copy_k(gK, ptid);
        auto copy_v = [&] {
          if constexpr (kFp8)
            return wg::VtCopy<kFp8VTerms * HEAD_DIM, BLOCK_N, 128>(  // every term's rows
                static_cast<const uint8_t*>(p.v) + cta.bhkv * kFp8VTerms * HEAD_DIM * p.k_pad, p.k_pad, ptid);
          else
            return wg::VCopy<HEAD_DIM, BLOCK_N, 128>(
                reinterpret_cast<const __half*>(p.v) + cta.b * p.v_sb + cta.hkv * p.v_sh, p.v_sn, ptid);
        }();
        const int v_len = kFp8 ? p.k_pad : p.kv_len;  // FP8 V^T is zero-padded to k_pad tokens
        for (int kb = 0; kb < n_kblocks; ++kb) {
          const int st = wait_stage(kb);
          copy_k(sK + st * Tr::kKBytes, kb * BLOCK_N, p.k_pad - kb * BLOCK_N);
          sm90::mbar_arrive_on_cp_async(full_k(st));
          copy_v(sV + st * Tr::kVBytes, kb * BLOCK_N, v_len - kb * BLOCK_N);
          sm90::mbar_arrive_on_cp_async(full_v(st));
        }
      }
      g0 = ws_ring_after<STAGES>(g0, n_kblocks);
    }
    if constexpr (!kTma) asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---- consumers: warpgroup wgi owns query rows wgi*64 .. wgi*64+63 of the CTA ----
  sm90::regs_raise<Tr::kConsumerRegs>();
  const int wq = warp & 3, g = lane >> 2, t = lane & 3;
  [[maybe_unused]] const uint32_t sPw = sP + wgi * 64 * BLOCK_N * 2;  // Tr::kPSmem: this warpgroup's P tile
  int g0 = 0, it = 0;  // as the producer's
#if SAGE_WG_NEXT_TILE_QK
  // kNextTileQk: S lives across tiles; s_ready says the previous tile's last block computed this
  // tile's first S into it
  int32_t s_i[BLOCK_N / 2];
  bool s_ready = false;
#endif
#if SAGE_WG_TRACE >= 0
  wg_trace::Buffer& trace_buf = wg_trace::g_buffer;
  const bool tile_tracer =
      blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z) == SAGE_WG_TRACE && (tid & 127) == 0;
  if (tile_tracer) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    trace_buf.smid = smid;
    trace_buf.entry[wgi] = trace_entry;
    trace_buf.block_count[wgi] = 0;
    trace_buf.tile_count[wgi] = 0;
  }
  auto tile_stamp = [&](int phase) {
    if (tile_tracer && it < wg_trace::kTiles) trace_buf.tile[wgi][it][phase] = clock();
  };
#else
  auto tile_stamp = [](int) {};
#endif
  for (int64_t tile = first_tile; kDynamic || tile < n_tiles; tile += tile_step, ++it) {
    tile_stamp(0);
    const int qs = it % Tr::kQStages;
    if constexpr (kDynamic) {
      sm90::mbar_wait(full_q(qs), (it / Tr::kQStages) & 1);  // Q landed, the slot written
      tile = tile_slot(qs).tile;
      if (tile < 0) break;
    }
    const CtaTile cta = kDynamic && SAGE_WG_TILE_SLOT ? slot_tile(qs) : tile_at(tile);
    const int b = cta.b, h = cta.h, q0 = cta.q0, n_kblocks = cta.n_kblocks;
    const int64_t bh = cta.bh, bhkv = cta.bhkv;
    const uint32_t sQ = sQ0 + qs * Tr::kQBytes;
    const int row0 = q0 + wgi * 64 + wq * 16;  // the warp's first query row
    const wg::ThreadScales sc(p, bh, bhkv, row0, g, t);

    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    float o[HEAD_DIM / 2];
    #pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
    [[maybe_unused]] float ob[TWO_LEVEL ? HEAD_DIM / 2 : 1];  // TWO_LEVEL: this block's P.V
    const uint64_t desc_q = wg::qk_desc<HEAD_DIM>(sQ + wgi * 64 * HEAD_DIM);

    // Ping-pong: warpgroup w issues its products after the other one has issued its own
    // (PINGPONG 1) or seen its own done (2) (named barrier 1 + w: its 128 threads wait, the other's
    // 128 arrive); warpgroup 1 lets 0 go first.
    constexpr int kTurnThreads = 256;
    if constexpr (PINGPONG) {
      if (wgi == 1) sm90::named_arrive(1, kTurnThreads);
    }

#if !SAGE_WG_NEXT_TILE_QK
    int32_t s_i[BLOCK_N / 2];
#endif
#if SAGE_WG_KS_FIRST_EARLY
    // the first block's K scales are loaded while Q and K_0 land and the first QK runs
    wg::KBlock<BLOCK_N> blk(p, 0, sc, row0, g, t);
#endif
#if SAGE_WG_NEXT_TILE_QK
    if (!kNextTileQk || !s_ready) {
#endif
    if constexpr (!kDynamic) sm90::mbar_wait(full_q(qs), (it / Tr::kQStages) & 1);
    sm90::mbar_wait(full_k(g0 % STAGES), (g0 / STAGES) & 1);
    tile_stamp(1);
    if constexpr (!kTma) fence_proxy_async_smem();  // cp.async data -> the tensor cores' (async proxy) reads
    wg::preset_scores<BLOCK_N>(s_i);
    wgmma_fence();
    wg::issue_qk<HEAD_DIM, BLOCK_N>(s_i, desc_q, sK + (g0 % STAGES) * Tr::kKBytes);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(s_i);
#if SAGE_WG_NEXT_TILE_QK
    } else {
      tile_stamp(1);
    }
    s_ready = false;
#endif
    tile_stamp(2);

    // The K scales of block kb + 1 are loaded while block kb's products run (a global load right
    // before the softmax that needs it showed as the top stall, long scoreboard, in ncu).
#if !SAGE_WG_KS_FIRST_EARLY
    wg::KBlock<BLOCK_N> blk(p, 0, sc, row0, g, t);
#endif
    // SAGE_WG_TRACE: the SM clock per K block at each phase, see gpu_dev_profile.py trace. The plain
    // loop stamps softmax start (0), softmax done (1), products issued (2), products done (3); the
    // overlapped loop its top (0), products issued (1), the next softmax done (2), P.V done (3).
    // Both stamp K_{kb+1} and V_kb landed (4), before the products' wgmmas.
#if SAGE_WG_TRACE >= 0
    const bool tracer = tile_tracer && it == 0;  // persistent: the CTA's first tile
    auto stamp = [&](int kb, int phase) {
      if (tracer && kb >= wg_trace::kFirst && kb < wg_trace::kFirst + wg_trace::kBlocks)
        trace_buf.block[wgi][kb - wg_trace::kFirst][phase] = clock();
    };
#else
    auto stamp = [](int, int) {};
#endif
    // O (+)= P_kb V_kb, V_kb in stage st: into O, or (FP8 two-level) into this block's accumulator.
    auto issue_pv_block = [&](int st, const auto& pa) {
      if constexpr (!kFp8) wg::issue_pv<HEAD_DIM, BLOCK_N, PV>(o, pa, sV + st * Tr::kVBytes);
      else if constexpr (TWO_LEVEL) wg::issue_pv_fp8<HEAD_DIM, BLOCK_N>(ob, pa, sV + st * Tr::kVBytes, true);
      else wg::issue_pv_fp8<HEAD_DIM, BLOCK_N>(o, pa, sV + st * Tr::kVBytes, false);
    };
    // Once V_kb and K_{kb+1} have landed: S_{kb+1} = Q K_{kb+1} and O += P_kb V_kb, issued back to
    // back as two commit groups. The last block issues an unused S (dropped) on its own K_kb, which
    // stays put until this warpgroup's empty arrive: no branch around the wgmma groups, and no read
    // of the next stage, which the producer may be filling (persistent: the next tile's K).
    // s_preset: true when the arm already preset S (SAGE_WG_EARLY_PRESET).
    // with_pv false (SAGE_WG_PV_SPLIT): P_kb V_kb was issued during the softmax; only S_{kb+1} here.
    auto issue_products = [&](int kb, const auto& pa, auto s_preset, auto with_pv) {
      const int st = (g0 + kb) % STAGES, nst = (g0 + kb + 1) % STAGES;
      const bool more = kb + 1 < n_kblocks;
#if SAGE_WG_NEXT_TILE_QK
      uint32_t sK_next = sK + (more ? nst : st) * Tr::kKBytes;
      uint64_t desc_s = desc_q;
      if constexpr (kNextTileQk) {
        if (!more) {  // the next tile's first S in place of an unused one, if there is a next tile
          const int nqs = (it + 1) % Tr::kQStages;
          sm90::mbar_wait(full_q(nqs), ((it + 1) / Tr::kQStages) & 1);  // its Q landed, its slot written
          if (tile_slot(nqs).tile >= 0) {
            const int gb = g0 + n_kblocks;  // its block 0's stage
            sm90::mbar_wait(full_k(gb % STAGES), (gb / STAGES) & 1);
            sK_next = sK + (gb % STAGES) * Tr::kKBytes;
            desc_s = wg::qk_desc<HEAD_DIM>(sQ0 + nqs * Tr::kQBytes + wgi * 64 * HEAD_DIM);
            s_ready = true;
          }
        }
      }
#else
      const uint32_t sK_next = sK + (more ? nst : st) * Tr::kKBytes;
      const uint64_t desc_s = desc_q;
#endif
      if constexpr (decltype(with_pv)::value) sm90::mbar_wait(full_v(st), ((g0 + kb) / STAGES) & 1);
      if (more) sm90::mbar_wait(full_k(nst), ((g0 + kb + 1) / STAGES) & 1);
      if constexpr (!kTma) fence_proxy_async_smem();
      stamp(kb, 4);
      if constexpr (PINGPONG) sm90::named_sync(1 + wgi, kTurnThreads);
      if constexpr (!decltype(s_preset)::value) wg::preset_scores<BLOCK_N>(s_i);
      wgmma_fence();
      if constexpr (!decltype(with_pv)::value) {
        wg::issue_qk<HEAD_DIM, BLOCK_N>(s_i, desc_s, sK_next);
        wgmma_commit();
      } else if constexpr (SAGE_WG_INTERLEAVE && !SAGE_WG_WS_OVERLAP) {  // one group: the loop waits for both
        if constexpr (TWO_LEVEL)
          wg::issue_qk_pv_interleaved<HEAD_DIM, BLOCK_N, PV>(s_i, desc_s, sK_next, ob, pa,
                                                             sV + st * Tr::kVBytes, true);
        else
          wg::issue_qk_pv_interleaved<HEAD_DIM, BLOCK_N, PV>(s_i, desc_s, sK_next, o, pa,
                                                             sV + st * Tr::kVBytes, false);
        wgmma_commit();
      } else {
        wg::issue_qk<HEAD_DIM, BLOCK_N>(s_i, desc_s, sK_next);
        wgmma_commit();
        issue_pv_block(st, pa);
        wgmma_commit();
      }
      if constexpr (PINGPONG == 1) {
        if (wgi == 0 || more) sm90::named_arrive(1 + (wgi ^ 1), kTurnThreads);
      }
    };
    // PINGPONG 2: the other warpgroup's turn once this one's products are done
    auto pass_turn_when_done = [&](int kb) {
      if constexpr (PINGPONG == 2) {
        if (wgi == 0 || kb + 1 < n_kblocks) sm90::named_arrive(1 + (wgi ^ 1), kTurnThreads);
      }
    };
    // O *= alpha once P_{kb-1} V_{kb-1} is complete; a warp whose row maxima all stayed skips it.
    auto rescale_o = [&](const float (&alpha)[2]) {
      if (!SAGE_WG_RESCALE_SKIP || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
        wg::rescale<HEAD_DIM>(o, alpha);
    };
    if constexpr (SAGE_WG_WS_OVERLAP && !TWO_LEVEL) {  // two-level keeps the plain loop
    // The softmax of S_{kb+1} runs while P_kb V_kb is still on the tensor cores. P_kb is that
    // wgmma's register A operand: a store of it after the wait that retires the wgmma, predicated
    // off at run time, keeps ptxas from giving its registers to the softmax's temporaries (the
    // first pipelined kernel failed exactly so, docs/kernels.md).
    constexpr int kPChunks = kFp8 ? BLOCK_N / 32 : BLOCK_N / 16;  // P's A fragments (4 registers each)
    auto softmax_into = [&](float (&alpha)[2], uint32_t (&pn)[kPChunks][4]) {
      if constexpr (kFp8) {
        float sf[BLOCK_N / 2];
        wg::softmax_probs<BLOCK_N, SAGE_WG_FP8_P_FOLD>(s_i, blk, m_run, l_run, alpha, sf);
        wg::pack_p8_frags<BLOCK_N>(sf, pn);
      } else {
        wg::online_softmax<BLOCK_N, PV>(s_i, blk, m_run, l_run, alpha, pn);
      }
    };
    const bool never = p.q_len < 0;
    const uint32_t scratch = sQ;
    uint32_t pa[kPChunks][4];
    {
      float alpha[2];
      softmax_into(alpha, pa);  // O is still 0
    }
    for (int kb = 0; kb < n_kblocks; ++kb) {
      const bool more = kb + 1 < n_kblocks;
      stamp(kb, 0);
      issue_products(kb, pa, std::false_type{}, std::true_type{});
      stamp(kb, 1);
      blk = wg::KBlock<BLOCK_N>(p, kb + 1, sc, row0, g, t);
      wgmma_wait<1>();  // S_{kb+1} is ready, P_kb V_kb may still run
      wgmma_pin(s_i);
      float alpha[2] = {1.f, 1.f};
      uint32_t pn[kPChunks][4];
      if (more) softmax_into(alpha, pn);
      stamp(kb, 2);
      wgmma_wait<0>();
      wgmma_pin(o);
      stamp(kb, 3);
      pass_turn_when_done(kb);
      wg::keep_p_live(pa, never, scratch);
      sm90::mbar_arrive(empty((g0 + kb) % STAGES));
      rescale_o(alpha);
      #pragma unroll
      for (int kc = 0; kc < kPChunks; ++kc)
        #pragma unroll
        for (int e = 0; e < 4; ++e) pa[kc][e] = pn[kc][e];
    }
    } else {
    [[maybe_unused]] float alpha_prev[2] = {1.f, 1.f};  // FUSED_UPDATE, two-level: the last block's alpha
    if constexpr (SAGE_WG_FUSED_UPDATE && TWO_LEVEL) {
      #pragma unroll
      for (int i = 0; i < HEAD_DIM / 2; ++i) ob[i] = 0.f;  // the first update adds nothing
    }
    // O = alpha O + P_kb V_kb, in fp32 (two-level accumulation)
    auto add_block = [&](const float (&alpha)[2]) {
      if constexpr (TWO_LEVEL) {
        #pragma unroll
        for (int j = 0; j < HEAD_DIM / 8; ++j) {
          o[4 * j + 0] = fmaf(o[4 * j + 0], alpha[0], ob[4 * j + 0]);
          o[4 * j + 1] = fmaf(o[4 * j + 1], alpha[0], ob[4 * j + 1]);
          o[4 * j + 2] = fmaf(o[4 * j + 2], alpha[1], ob[4 * j + 2]);
          o[4 * j + 3] = fmaf(o[4 * j + 3], alpha[1], ob[4 * j + 3]);
        }
      }
    };
    if constexpr (kPOverlap) {
    // SAGE_WG_WS_P_SMEM 2. Block kb: the softmax of S_kb while P_{kb-1} V_{kb-1} runs; once that
    // P.V is done, O's rescale and P_kb to the warpgroup's tile; then S_{kb+1} and P_kb V_kb (an SS
    // wgmma), and a wait for S_{kb+1} only. K_j is released once S_j is done (the last block's
    // K at the end: it also issues an unused S on it, as issue_products), V_j once P_j V_j is.
    auto release_k = [&](int kb) { sm90::mbar_arrive(empty((g0 + kb) % STAGES)); };
    auto release_v = [&](int kb) { sm90::mbar_arrive(empty_v((g0 + kb) % STAGES)); };
    if (n_kblocks > 1) release_k(0);  // S_0 is done (above)
    for (int kb = 0; kb < n_kblocks; ++kb) {
      const int st = (g0 + kb) % STAGES, nst = (g0 + kb + 1) % STAGES;
      const bool more = kb + 1 < n_kblocks;
      stamp(kb, 0);  // softmax starts
#if !SAGE_WG_KS_PREFETCH
      blk = wg::KBlock<BLOCK_N>(p, kb, sc, row0, g, t);
#endif
      float alpha[2];
      uint32_t pa[BLOCK_N / 16][4];
      wg::online_softmax<BLOCK_N, PV>(s_i, blk, m_run, l_run, alpha, pa);
      stamp(kb, 1);  // softmax done
      wgmma_wait<0>();  // P_{kb-1} V_{kb-1}: O, the P tile and V_{kb-1}'s stage are free
      wgmma_pin(o);
      if (kb > 0) release_v(kb - 1);
      rescale_o(alpha);
      wg::store_p_part<BLOCK_N, 1>(sPw, pa, 0, wq, lane);
      fence_proxy_async_smem();
      sm90::named_sync(kPBarrier + wgi, 128);  // the warpgroup's 64 rows of P are in the tile
      if (more) sm90::mbar_wait(full_k(nst), ((g0 + kb + 1) / STAGES) & 1);
      sm90::mbar_wait(full_v(st), ((g0 + kb) / STAGES) & 1);
      stamp(kb, 4);
      wg::preset_scores<BLOCK_N>(s_i);
      wgmma_fence();
      wg::issue_qk<HEAD_DIM, BLOCK_N>(s_i, desc_q, sK + (more ? nst : st) * Tr::kKBytes);
      wgmma_commit();
      wg::issue_pv_part_ss<HEAD_DIM, BLOCK_N, PV, 1>(o, sPw, sV + st * Tr::kVBytes, 0);
      wgmma_commit();
      stamp(kb, 2);  // products issued
#if SAGE_WG_KS_PREFETCH
      blk = wg::KBlock<BLOCK_N>(p, kb + 1, sc, row0, g, t);  // in range: guarded
#endif
      wgmma_wait<1>();  // S_{kb+1} is ready; P_kb V_kb may still run
      wgmma_pin(s_i);
      if (kb + 2 < n_kblocks) release_k(kb + 1);
      stamp(kb, 3);
    }
    wgmma_wait<0>();
    wgmma_pin(o);
    release_v(n_kblocks - 1);
    release_k(n_kblocks - 1);
    } else if constexpr (SAGE_WG_QK_AHEAD) {
    // S_{kb+1} on the tensor cores during the softmax of S_kb, then P_kb V_kb; the block waits for
    // both at its end. The two S register sets swap roles every block: the body runs twice per
    // trip with the sets exchanged, so the swap costs no moves.
    int32_t s_j[BLOCK_N / 2];
    auto block = [&](int kb, int32_t (&s_cur)[BLOCK_N / 2], int32_t (&s_nxt)[BLOCK_N / 2]) {
      const int st = (g0 + kb) % STAGES, nst = (g0 + kb + 1) % STAGES;
      const bool more = kb + 1 < n_kblocks;
      stamp(kb, 0);
#if !SAGE_WG_KS_PREFETCH
      blk = wg::KBlock<BLOCK_N>(p, kb, sc, row0, g, t);
#endif
      // P_{kb-1} V_{kb-1} (done last block) into O first, and S_{kb+1}'s registers preset only
      // now: so at most three accumulator sets (O, S_kb, S_{kb+1}; then O, S_{kb+1}, P_kb V_kb)
      // are live at a time, which is what 232 registers hold.
      if constexpr (TWO_LEVEL) add_block(alpha_prev);
      wg::preset_scores<BLOCK_N>(s_nxt);
      // The last block issues an unused S on its own K_kb, held until this warpgroup's empty
      // arrive (as issue_products: no branch around the wgmma groups).
      if (more) sm90::mbar_wait(full_k(nst), ((g0 + kb + 1) / STAGES) & 1);
      if constexpr (!kTma) fence_proxy_async_smem();
      wgmma_fence();
      wg::issue_qk<HEAD_DIM, BLOCK_N>(s_nxt, desc_q, sK + (more ? nst : st) * Tr::kKBytes);
      wgmma_commit();
      float alpha[2];
      uint32_t pa[kFp8 ? BLOCK_N / 32 : BLOCK_N / 16][4];
      wg::with_mask_choice(blk, [&](auto mask) {
        wg::softmax_packed<BLOCK_N, decltype(mask)::value, PV>(s_cur, blk, m_run, l_run, alpha, pa);
        if constexpr (!TWO_LEVEL) {
          wg::rescale<HEAD_DIM>(o, alpha);
          wgmma_pin(o);
        }
      });
      if constexpr (TWO_LEVEL) alpha_prev[0] = alpha[0], alpha_prev[1] = alpha[1];
      stamp(kb, 1);
      sm90::mbar_wait(full_v(st), ((g0 + kb) / STAGES) & 1);
      if constexpr (!kTma) fence_proxy_async_smem();
      stamp(kb, 4);
      wgmma_fence();
      issue_pv_block(st, pa);
      wgmma_commit();
      stamp(kb, 2);
#if SAGE_WG_KS_PREFETCH
      blk = wg::KBlock<BLOCK_N>(p, kb + 1, sc, row0, g, t);  // in range: guarded
#endif
      wgmma_wait<0>();
      wgmma_pin(s_nxt);
      wgmma_pin(o);
      if constexpr (TWO_LEVEL) wgmma_pin(ob);
      stamp(kb, 3);
      sm90::mbar_arrive(empty(st));
    };
    int kb = 0;
    for (; kb + 1 < n_kblocks; kb += 2) {
      block(kb, s_i, s_j);
      block(kb + 1, s_j, s_i);
    }
    if (kb < n_kblocks) block(kb, s_i, s_j);
    } else {
    for (int kb = 0; kb < n_kblocks; ++kb) {
      stamp(kb, 0);  // softmax starts
#if !SAGE_WG_KS_PREFETCH
      blk = wg::KBlock<BLOCK_N>(p, kb, sc, row0, g, t);
#endif
      float alpha[2];
      [[maybe_unused]] uint32_t pa_split[BLOCK_N / 16][4];  // SAGE_WG_PV_SPLIT: P, live until the wait
      if constexpr (SAGE_WG_FUSED_UPDATE) {
        // one basic block per mask arm: softmax, packing and the O update of the previous block
        uint32_t pa[kFp8 ? BLOCK_N / 32 : BLOCK_N / 16][4];
        wg::with_mask_choice(blk, [&](auto mask) {
          wg::softmax_packed<BLOCK_N, decltype(mask)::value, PV>(s_i, blk, m_run, l_run, alpha, pa);
          if constexpr (TWO_LEVEL) {
            add_block(alpha_prev);  // P_{kb-1} V_{kb-1} completed last iteration
          } else {
            wg::rescale<HEAD_DIM>(o, alpha);
            // Without it the front end hoists both arms' identical rescales into the join block
            // (seen in the PTX: 64 mul.f32 there, 4 per arm), away from the EX2s they should fill.
            wgmma_pin(o);
          }
          if constexpr (SAGE_WG_EARLY_PRESET) {  // S was read into sf; P is packed: sf is dead
            wg::preset_scores<BLOCK_N>(s_i);
            wgmma_pin(s_i);  // as the rescale: keep both arms' presets in the arms
          }
        });
        if constexpr (TWO_LEVEL) alpha_prev[0] = alpha[0], alpha_prev[1] = alpha[1];
        stamp(kb, 1);
        issue_products(kb, pa, std::bool_constant<SAGE_WG_EARLY_PRESET != 0>{}, std::true_type{});
      } else if constexpr (kFp8) {
        float sf[BLOCK_N / 2];
        wg::softmax_probs<BLOCK_N, SAGE_WG_FP8_P_FOLD>(s_i, blk, m_run, l_run, alpha, sf);
        uint32_t pa[BLOCK_N / 32][4];
        wg::pack_p8_frags<BLOCK_N>(sf, pa);
        if constexpr (!TWO_LEVEL) rescale_o(alpha);
        stamp(kb, 1);  // softmax done, waiting for K/V (and the turn)
        issue_products(kb, pa, std::false_type{}, std::true_type{});
      } else if constexpr (kPartsPath) {
        const int st = (g0 + kb) % STAGES;
        wg::softmax_in_parts<BLOCK_N, PV, kPvSplit>(
            s_i, blk, m_run, l_run, alpha, pa_split, [&] { rescale_o(alpha); },  // P_{kb-1} V_{kb-1} is done
            [&](int part) {
              if constexpr (Tr::kPSmem) {  // the part's P to the tile, seen by the tensor cores
                wg::store_p_part<BLOCK_N, kPvSplit>(sPw, pa_split, part, wq, lane);
                fence_proxy_async_smem();
                sm90::named_sync(kPBarrier + wgi, 128);
              }
              if (part == 0) {
                sm90::mbar_wait(full_v(st), ((g0 + kb) / STAGES) & 1);
                if constexpr (!kTma) fence_proxy_async_smem();
              }
              wgmma_fence();
              if constexpr (Tr::kPSmem)
                wg::issue_pv_part_ss<HEAD_DIM, BLOCK_N, PV, kPvSplit>(o, sPw, sV + st * Tr::kVBytes, part);
              else
                wg::issue_pv_part<HEAD_DIM, BLOCK_N, PV, kPvSplit>(o, pa_split, sV + st * Tr::kVBytes, part);
              wgmma_commit();
            });
        stamp(kb, 1);
        issue_products(kb, pa_split, std::false_type{}, std::false_type{});
      } else {
        uint32_t pa[BLOCK_N / 16][4];
        wg::online_softmax<BLOCK_N, PV>(s_i, blk, m_run, l_run, alpha, pa);
        rescale_o(alpha);  // P_{kb-1} V_{kb-1} completed last iteration
        stamp(kb, 1);
        issue_products(kb, pa, std::false_type{}, std::true_type{});
      }
      stamp(kb, 2);  // products issued
#if SAGE_WG_KS_PREFETCH
      blk = wg::KBlock<BLOCK_N>(p, kb + 1, sc, row0, g, t);  // in range: guarded
#endif
      wgmma_wait<0>();  // no register of an in-flight wgmma stays live into the softmax
      wgmma_pin(s_i);
      wgmma_pin(o);
      if constexpr (kPartsPath && !Tr::kPSmem) wg::keep_p_live(pa_split, p.q_len < 0, sQ);  // the parts' P until here
      stamp(kb, 3);  // products done
      pass_turn_when_done(kb);
      sm90::mbar_arrive(empty((g0 + kb) % STAGES));
      if constexpr (TWO_LEVEL) {
        wgmma_pin(ob);
        if constexpr (!SAGE_WG_FUSED_UPDATE) add_block(alpha);
      }
    }
    }
    if constexpr (SAGE_WG_FUSED_UPDATE && TWO_LEVEL) add_block(alpha_prev);  // the last block's P.V
    }
    tile_stamp(3);
#if SAGE_WG_TRACE >= 0
    if (tile_tracer && it < wg_trace::kTiles) trace_buf.tile_blocks[wgi][it] = n_kblocks;
    if (tracer) trace_buf.block_count[wgi] = max(0, min(wg_trace::kBlocks, n_kblocks - wg_trace::kFirst));
#endif
    if constexpr (PERSISTENT) sm90::mbar_arrive(q_empty(qs));  // the tile's last QK is done
    if (Tr::kStagedStore && wg::out_16b_aligned<OutT>(p)) {
      const CUtensorMap* o_map = nullptr;
      if constexpr (kTma && SAGE_WG_TMA_STORE != 0) o_map = maps.o_ok ? &maps.o : nullptr;
      wg::store_rows_staged<HEAD_DIM, OutT, kFp8>(p, o, l_run, m_run, b, h, bh, q0 + wgi * 64, wq, g, t, bhkv,
                                                  sO + wgi * 64 * HEAD_DIM * 2, kStoreBarrier + wgi, o_map);
    } else
      wg::store_rows<HEAD_DIM, OutT, kFp8>(p, o, l_run, m_run, b, h, bh, row0, g, t, bhkv);
    tile_stamp(4);
    g0 = ws_ring_after<STAGES>(g0, n_kblocks);  // as the producer's
  }
  if constexpr (kTma && SAGE_WG_TMA_STORE != 0) {
    // the output boxes in flight read this CTA's shared memory: done before it exits
    if (Tr::kStagedStore && maps.o_ok && (tid & 127) == 0) sm90::tma_store_wait_all<false>();
  }
#if SAGE_WG_TRACE >= 0
  if (tile_tracer) {
    trace_buf.tile_count[wgi] = min(it, wg_trace::kTiles);
    __threadfence();
    trace_buf.written[wgi] = 1;
  }
#endif
#else
  __trap();  // built without sm_90a: the launcher never selects this kernel
#endif
}

// Host side (SAGE_WG_PERSISTENT 2): the current device's memory pool for the per-call tile
// counters, created once; its own, so that keeping its memory across synchronizations (release
// threshold: everything) changes no other allocator's pool, and a counter costs no mapping.
inline cudaError_t tile_counter_pool(cudaMemPool_t* pool) {
  static std::atomic<cudaMemPool_t> pools[64];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= 64) return cudaErrorNotSupported;
  if ((*pool = pools[dev].load(std::memory_order_acquire)) != nullptr) return cudaSuccess;
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = dev;
  cudaMemPool_t created = nullptr;
  if ((err = cudaMemPoolCreate(&created, &props)) != cudaSuccess) return err;
  uint64_t keep = UINT64_MAX;
  if ((err = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep)) != cudaSuccess) {
    cudaMemPoolDestroy(created);
    return err;
  }
  cudaMemPool_t expected = nullptr;
  if (!pools[dev].compare_exchange_strong(expected, created)) {  // another thread made one first
    cudaMemPoolDestroy(created);
    created = expected;
  }
  *pool = created;
  return cudaSuccess;
}

template <int HEAD_DIM, int NWG, int BLOCK_N, int STAGES, int PINGPONG, PvKind PV, typename OutT,
          bool TWO_LEVEL = false>
cudaError_t launch_attn_wgmma_ws(const AttnParams& p, cudaStream_t stream) {
  // No key would ever land: the consumers would wait on K block 0 forever. The ops refuse empty K
  // before this; the check keeps a direct caller from hanging the GPU.
  if (p.kv_len <= 0) return cudaErrorInvalidValue;
  constexpr bool kTma = kWsTma<PV>;
  constexpr int kVBytes = PV == PvKind::kFp8 ? 1 : 2;
  using Tr = WgmmaWsTraits<HEAD_DIM, NWG, BLOCK_N, STAGES, kVBytes>;
  std::conditional_t<kTma, WsTmaMaps, NoTmaMaps> maps;
  if constexpr (kTma) {
    const uint64_t bhq = static_cast<uint64_t>(p.batch) * p.q_heads, bhkv = static_cast<uint64_t>(p.batch) * p.kv_heads;
    const struct {
      const char* name;
      CUresult result;
    } encoded[] = {
        {"Q", sm90::encode_byte_map(&maps.q, p.q, HEAD_DIM, p.q_pad, bhq, HEAD_DIM, Tr::kCtaQ)},
        {"K", sm90::encode_byte_map(&maps.k, p.k, HEAD_DIM, p.k_pad, bhkv, HEAD_DIM, BLOCK_N)},
        {PV == PvKind::kFp8 ? "V^T" : "V",
         PV == PvKind::kFp8
             ? sm90::encode_byte_map(&maps.v, p.v, p.k_pad, kFp8VTerms * HEAD_DIM, bhkv, BLOCK_N,
                                     kFp8VTerms * HEAD_DIM)  // one box: every term's rows
             : sm90::encode_v16_map(&maps.v, p.v, HEAD_DIM, p.kv_len, p.kv_heads, p.batch, p.v_sn, p.v_sh, p.v_sb,
                                    BLOCK_N)},
    };
    for (const auto& e : encoded) {
      // Not expected for inputs the bindings pass (16-byte strides and base, tma_friendly); if it
      // happens, say which map and why on stderr and fail the op (the binding raises), never guess.
      if (e.result != CUDA_SUCCESS) {
        std::fprintf(stderr, "SAGE_WG_TMA: the tensor map of %s was refused (CUresult %d%s)\n", e.name,
                     static_cast<int>(e.result),
                     e.result == CUDA_ERROR_NOT_FOUND ? ": the driver has no cuTensorMapEncodeTiled" : "");
        return cudaErrorNotSupported;
      }
    }
    // The output's map (SAGE_WG_TMA_STORE): an output the encoder refuses takes the 16-byte stores.
    maps.o_ok = SAGE_WG_TMA_STORE != 0 && Tr::kStagedStore &&
                sm90::encode_v16_map(&maps.o, p.out, HEAD_DIM, p.q_len, p.q_heads, p.batch, p.o_sn, p.o_sh, p.o_sb,
                                     64) == CUDA_SUCCESS;
  }
  // Persistent (a tuning knob): 1 for non-causal calls, 2 (dynamic tile scheduler) for every call;
  // the persistent kernel is instantiated only in builds that ask for it.
  const auto launch = [&]() -> cudaError_t {
    if constexpr (SAGE_WG_PERSISTENT != 0) {
      constexpr auto kPersistent = &attn_wgmma_ws_kernel<HEAD_DIM, NWG, BLOCK_N, STAGES, PINGPONG, PV, OutT, TWO_LEVEL, true>;
      using PTr = WgmmaWsTraits<HEAD_DIM, NWG, BLOCK_N, STAGES, kVBytes, true>;
      if constexpr (SAGE_WG_PERSISTENT == 2) {
        // The tile counter: per call, stream-ordered (capturable), from a pool of our own that
        // keeps its memory (tile_counter_pool); if none can be had, a CTA per tile as without
        // the knob, the allocation's error cleared so no later launch reports it.
        cudaMemPool_t pool = nullptr;
        unsigned long long* counter = nullptr;
        if (tile_counter_pool(&pool) != cudaSuccess ||
            cudaMallocFromPoolAsync(reinterpret_cast<void**>(&counter), sizeof(*counter), pool, stream) != cudaSuccess) {
          (void)cudaGetLastError();
        } else {
          cudaError_t err = cudaMemsetAsync(counter, 0, sizeof(*counter), stream);
          if (err == cudaSuccess) err = launch_persistent<kPersistent, PTr>(p, stream, maps, counter);
          const cudaError_t freed = cudaFreeAsync(counter, stream);
          return err != cudaSuccess ? err : freed;
        }
      } else if (!p.causal) {
        return launch_persistent<kPersistent, PTr>(p, stream, maps, static_cast<unsigned long long*>(nullptr));
      }
    }
    return launch_over_query_blocks<attn_wgmma_ws_kernel<HEAD_DIM, NWG, BLOCK_N, STAGES, PINGPONG, PV, OutT, TWO_LEVEL>,
                                    Tr>(p, stream, maps, static_cast<unsigned long long*>(nullptr));
  };
  cudaError_t err = launch();
#if SAGE_WG_TRACE >= 0
  if (err == cudaSuccess) {
    wg_trace::print_kernel<<<1, 1, 0, stream>>>();
    err = cudaGetLastError();
  }
#endif
  return err;
}

}  // namespace sage
