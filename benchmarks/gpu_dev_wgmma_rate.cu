// Tuning harness (GPU runner, sm_90a): how fast warpgroup MMAs run when one, two, three or four
// warpgroups of a CTA issue them, at N = 64 / 128 / 256, with one accumulator chain or two
// interleaved, the B tile shared by the warpgroups or one each, and one commit group in flight or
// two. It answers what the attention kernels' traces could not (docs/kernels.md, "where the wgmma
// kernels' time goes"): whether one warpgroup's chained wgmmas keep the tensor cores busy.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I csrc \
//        -o /tmp/wgmma_rate benchmarks/gpu_dev_wgmma_rate.cu && /tmp/wgmma_rate
//
// Each row: one CTA per SM (132), ITERS commit groups of 4 k32 steps (the QK^T or P.V of a 128-wide
// head dim / key block) per chain and warpgroup, operands in 128B-swizzled shared memory (the
// values do not matter). TOPS from CUDA events; cycles per wgmma from clock64 in each warpgroup.
#include <cstdio>
#include <cstdlib>

#include "common/attn_wgmma.cuh"

namespace {

enum Op { kS8SS = 0, kE4m3RS = 1 };

template <int N>
__device__ __forceinline__ void s8_ss(int32_t (&d)[N / 2], uint64_t da, uint64_t db) {
  if constexpr (N == 64) sage::wgmma_m64n64k32_s8(d, da, db, 1);
  else if constexpr (N == 128) sage::wgmma_m64n128k32_s8(d, da, db, 1);
  else sage::wgmma_m64n256k32_s8(d, da, db, 1);
}
template <int N>
__device__ __forceinline__ void e4m3_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (N == 64) sage::wgmma_m64n64k32_e4m3_rs(d, a, db, 1);
  else if constexpr (N == 128) sage::wgmma_m64n128k32_e4m3_rs(d, a, db, 1);
  else sage::wgmma_m64n256k32_e4m3_rs(d, a, db, 1);
}

constexpr int kABytes = 64 * 128;  // a warpgroup's A: 64 rows x 128 bytes (K-major)
constexpr int kLoopFields = 5;     // loop_kernel's figures per warpgroup

// The first `bytes` of the 1024-aligned dynamic shared memory filled with operand values (none an
// e4m3 NaN) and made visible to the tensor cores; returns its shared-window address. Every thread
// of the CTA calls it.
__device__ uint32_t filled_operands(uint8_t* smem_raw, int bytes) {
  const uint32_t base = (sage::smem_u32(smem_raw) + 1023u) & ~1023u;
  uint8_t* gen = smem_raw + (base - sage::smem_u32(smem_raw));
  for (int i = threadIdx.x; i < bytes; i += blockDim.x) gen[i] = static_cast<uint8_t>((i * 37) & 0x3F);
  __syncthreads();
  sage::fence_proxy_async_smem();
  __syncthreads();
  return base;
}

template <int NWG, int N, int OP, int CHAINS, bool SHARED_B, int IN_FLIGHT>
__global__ void __launch_bounds__(NWG * 128, 1) rate_kernel(int iters, unsigned long long* cycles, int* sink) {
#if defined(SAGE_HAS_WGMMA)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  constexpr int kBTiles = SHARED_B ? 1 : NWG;
  const uint32_t base = filled_operands(smem_raw, NWG * kABytes + kBTiles * N * 128);
  const int tid = threadIdx.x, wgi = tid / 128;
  const uint32_t a_tile = base + wgi * kABytes;
  const uint32_t b_tile = base + NWG * kABytes + (SHARED_B ? 0 : wgi) * N * 128;
  const uint64_t da = sage::wg::qk_desc<128>(a_tile), db = sage::wg::qk_desc<128>(b_tile);  // 128-byte rows
  using Acc = std::conditional_t<OP == kS8SS, int32_t, float>;
  Acc acc[CHAINS][N / 2];
  #pragma unroll
  for (int c = 0; c < CHAINS; ++c)
    #pragma unroll
    for (int i = 0; i < N / 2; ++i) acc[c][i] = 0;
  uint32_t pa[4][4];
  #pragma unroll
  for (int k = 0; k < 4; ++k)
    #pragma unroll
    for (int e = 0; e < 4; ++e) pa[k][e] = 0x38383838u ^ (tid * 0x01010101u & 0x07070707u) ^ (k + e);
  const unsigned long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    sage::wgmma_fence();
    #pragma unroll
    for (int k = 0; k < 4; ++k)
      #pragma unroll
      for (int c = 0; c < CHAINS; ++c) {
        if constexpr (OP == kS8SS) s8_ss<N>(acc[c], da + 2 * k, db + 2 * k);
        else e4m3_rs<N>(acc[c], pa[k], db + 2 * k);
      }
    sage::wgmma_commit();
    if constexpr (IN_FLIGHT == 2) sage::wgmma_wait<1>();
    else sage::wgmma_wait<0>();
  }
  sage::wgmma_wait<0>();
  #pragma unroll
  for (int c = 0; c < CHAINS; ++c) sage::wgmma_pin(acc[c]);
  const unsigned long long t1 = clock64();
  Acc sum = 0;
  #pragma unroll
  for (int c = 0; c < CHAINS; ++c)
    #pragma unroll
    for (int i = 0; i < N / 2; ++i) sum += acc[c][i];
  if (sum == static_cast<Acc>(12345)) sink[0] = 1;  // keeps the products alive
  if (tid % 128 == 0) cycles[blockIdx.x * NWG + wgi] = t1 - t0;
#else
  __trap();
#endif
}

// Two warpgroups: 0 issues the s8 m64n128k32 chain above (WGMMA_ITERS groups of 4, one in flight),
// 1 runs a softmax-like loop (ALU_ITERS rounds of 64 scores: FFMA, MUFU.EX2, FADD per score);
// either count 0 leaves that warpgroup idle. Do the tensor cores slow the softmax down, or it them?
__global__ void __launch_bounds__(256, 1) mixed_kernel(int wgmma_iters, int alu_iters, unsigned long long* cycles,
                                                        int* sink) {
#if defined(SAGE_HAS_WGMMA)
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t base = filled_operands(smem_raw, kABytes + 128 * 128);
  const int tid = threadIdx.x, wgi = tid / 128;
  const unsigned long long t0 = clock64();
  if (wgi == 0) {
    const uint64_t da = sage::wg::qk_desc<128>(base), db = sage::wg::qk_desc<128>(base + kABytes);
    int32_t acc[64];
    #pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0;
    for (int it = 0; it < wgmma_iters; ++it) {
      sage::wgmma_fence();
      #pragma unroll
      for (int k = 0; k < 4; ++k) s8_ss<128>(acc, da + 2 * k, db + 2 * k);
      sage::wgmma_commit();
      sage::wgmma_wait<0>();
    }
    sage::wgmma_pin(acc);
    int32_t sum = 0;
    #pragma unroll
    for (int i = 0; i < 64; ++i) sum += acc[i];
    if (sum == 12345) sink[0] = 1;
  } else {
    float x[64];
    #pragma unroll
    for (int i = 0; i < 64; ++i) x[i] = 0.001f * (tid + i);
    float total = 0.f;
    for (int it = 0; it < alu_iters; ++it) {
      float rs = 0.f;
      #pragma unroll
      for (int i = 0; i < 64; ++i) {
        float e;
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fmaf(x[i], 0.5f, -0.25f)));
        x[i] = e;
        rs += e;
      }
      total += rs;
    }
    if (total == 12345.f) sink[0] = 2;
  }
  const unsigned long long t1 = clock64();
  if (tid % 128 == 0) cycles[blockIdx.x * 2 + wgi] = t1 - t0;
#else
  __trap();
#endif
}

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

// The attention loop without memory traffic: two warpgroups, each per block a softmax of its 64
// scores per thread (row max with quad shuffles, FFMA + EX2, row sum, e4m3 packing) and then its
// products (4 s8 SS k-steps into S, 4 e4m3 RS k-steps into O). PINGPONG 0: the warpgroups run
// freely; 2: a warpgroup issues its products only once the other's are done (named barriers, as
// SAGE_WG_PINGPONG=2). PRODUCER: a third warpgroup copies 32 KB per block (a K and an FP8 V^T
// block) from global memory with cp.async by its 128 threads (1), as the kernels' producer does,
// or with two 16 KB bulk copies (cp.async.bulk, the copy engine) issued by one thread (2).
// STAGES 0: the producer copies into a ring of its own every 2000 cycles, nobody waits for it (its
// cost on the SM alone); STAGES >= 2: the kernels' protocol, the products of block kb read the
// ring's stage kb % STAGES once its full barrier completes and release it (empty barrier, both
// warpgroups) once done, and the producer refills a stage as soon as it is released. Per
// warpgroup: cycles per block and per phase, and when its products start (the offset between
// the warpgroups: 0 is lockstep, half the period is the ideal alternation). PV16: P.V as the sm90
// family (cuda-sm90-fp16, the shipped Hopper kernel) runs it, 8 f16 RS k16-steps on a 16-bit V
// (MN-major, 32 KB) instead of 4 e4m3 k32-steps: a warpgroup's products take 768 cycles of the
// tensor pipe instead of 512, so turn-taking should pay more there (memory-free loops only).
template <int PINGPONG, int PRODUCER, int STAGES, bool PV16 = false>
__global__ void __launch_bounds__(PRODUCER ? 384 : 256, 1) loop_kernel(int blocks, unsigned long long* cycles,
                                                                      int* sink, const uint4* src, int src_blocks) {
#if defined(SAGE_HAS_WGMMA)
  static_assert(STAGES == 0 || (PRODUCER && STAGES >= 2), "a gated loop needs a producer and two stages");
  static_assert(!PV16 || (PRODUCER == 0 && STAGES == 0), "PV16: the loop without memory only");
  constexpr int kRingStages = STAGES ? STAGES : 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  constexpr int kBytes = 2 * kABytes + (PV16 ? 3 : 2) * 128 * 128;  // Q of both warpgroups, K, V^T or V
  const uint32_t base = filled_operands(smem_raw, kBytes);
  const int tid = threadIdx.x, wgi = tid / 128;
  const uint32_t ring = base + kBytes, bars = ring + kRingStages * 32768;
  auto full = [&](int st) { return bars + 8 * st; };
  auto empty = [&](int st) { return bars + 8 * (kRingStages + st); };
  if (PRODUCER && tid == 0) {  // the barriers live after the ring, which only a producer has
    for (int st = 0; st < kRingStages; ++st) {
      sage::sm90::mbar_init(full(st), PRODUCER == 2 ? 1 : 128);
      sage::sm90::mbar_init(empty(st), 256);
    }
    sage::sm90::mbar_init_fence();
  }
  __syncthreads();
  if (PRODUCER && wgi == 2) {  // 2048 16-byte copies per 32 KB block, 16 per thread
    sage::sm90::regs_lower<40>();  // the consumers take the rest, as in the kernels
    if (PRODUCER == 2 && tid != 256) return;  // one thread issues the bulk copies
    for (int kb = 0; kb < blocks; ++kb) {
      const long long start = clock64();
      const int st = kb % kRingStages;
      const uint4* blk = src + static_cast<int64_t>((blockIdx.x * 7 + kb) % src_blocks) * 2048;
      if (STAGES && kb >= STAGES) sage::sm90::mbar_wait(empty(st), (kb / kRingStages - 1) & 1);
      if constexpr (PRODUCER == 2) {
        sage::sm90::mbar_arrive_expect_tx(full(st), 32768);
        for (int h = 0; h < 2; ++h)
          asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                       ::"r"(ring + st * 32768 + h * 16384), "l"(blk + h * 1024), "n"(16384), "r"(full(st))
                       : "memory");
        if (!STAGES) sage::sm90::mbar_wait(full(st), (kb / kRingStages) & 1);
      } else {
        #pragma unroll
        for (int i = 0; i < 16; ++i)
          sage::cp_async_16(ring + st * 32768 + (i * 128 + tid - 256) * 16, blk + i * 128 + tid - 256, true);
        if (STAGES) sage::sm90::mbar_arrive_on_cp_async(full(st));
        else asm volatile("cp.async.wait_all;\n" ::: "memory");
      }
      if (!STAGES)
        while (clock64() - start < 2000) {
        }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }
  if constexpr (PRODUCER) sage::sm90::regs_raise<232>();
  const uint64_t dq = sage::wg::qk_desc<128>(base + wgi * kABytes);
  int32_t s[64];
  float o[64];
  #pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = 0x4B400000 + (i * 131 + tid) % 1000, o[i] = 0.f;
  float m = -INFINITY, l = 0.f;
  if (PINGPONG && wgi == 1) sage::sm90::named_arrive(1, 256);
  unsigned long long t_soft = 0, t_prod = 0, t_issue = 0;
  const unsigned long long t0 = clock64();
  for (int kb = 0; kb < blocks; ++kb) {
    const unsigned long long ta = clock64();
    float mx = m;
    #pragma unroll
    for (int i = 0; i < 64; ++i) mx = fmaxf(mx, __int_as_float(s[i]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float neg = -mx * 0.01f;
    uint32_t pa[4][4];   // e4m3 P: 4 k32-steps
    uint32_t ph[8][4];   // f16 P (PV16): 8 k16-steps
    float rs = 0.f;
    #pragma unroll
    for (int i = 0; i < 64; i += 4) {
      float e[4];
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(e[j]) : "f"(fmaf(__int_as_float(s[i + j]), 0.01f, neg)));
        rs += e[j];
      }
      if constexpr (PV16) {
        ph[i / 8][(i / 2) % 4] = sage::pack_half2(e[0], e[1]);
        ph[i / 8][(i / 2) % 4 + 1] = sage::pack_half2(e[2], e[3]);
      } else {
        uint16_t lo, hi;
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(e[1] * 448.f), "f"(e[0] * 448.f));
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(e[3] * 448.f), "f"(e[2] * 448.f));
        pa[i / 16][(i / 4) % 4] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
      }
    }
    const float alpha = exp2f((m - mx) * 0.01f);
    m = mx;
    l = l * alpha + rs;
    #pragma unroll
    for (int i = 0; i < 64; ++i) o[i] *= alpha;
    const unsigned long long tb = clock64();
    const int st = kb % kRingStages;
    const uint32_t kv = STAGES ? ring + st * 32768 : base + 2 * kABytes;
    if constexpr (STAGES != 0) {
      sage::sm90::mbar_wait(full(st), (kb / kRingStages) & 1);
      sage::fence_proxy_async_smem();
    }
    if constexpr (PINGPONG) sage::sm90::named_sync(1 + wgi, 256);
    t_issue += clock64() - t0;
    const uint64_t dk = sage::wg::qk_desc<128>(kv), dv = sage::wg::vt_desc(kv + 128 * 128);
    #pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0x4B400000;
    sage::wgmma_fence();
    #pragma unroll
    for (int k = 0; k < 4; ++k) sage::wgmma_m64n128k32_s8(s, dq + 2 * k, dk + 2 * k, 1);
    sage::wgmma_commit();
    if constexpr (PV16) {
      const uint64_t dv16 = sage::wg::v_desc<128>(kv + 128 * 128);
      #pragma unroll
      for (int k = 0; k < 8; ++k) sage::wg::pv16_step<128, sage::PvKind::kFp16>(o, ph[k], dv16, k);
    } else {
      #pragma unroll
      for (int k = 0; k < 4; ++k) sage::wgmma_m64n128k32_e4m3_rs(o, pa[k], dv + 2 * k, 1);
    }
    sage::wgmma_commit();
    sage::wgmma_wait<0>();
    sage::wgmma_pin(s);
    sage::wgmma_pin(o);
    if constexpr (STAGES != 0) sage::sm90::mbar_arrive(empty(st));
    if constexpr (PINGPONG) {
      if (wgi == 0 || kb + 1 < blocks) sage::sm90::named_arrive(1 + (wgi ^ 1), 256);
    }
    const unsigned long long tc = clock64();
    t_soft += tb - ta;
    t_prod += tc - tb;
  }
  const unsigned long long t1 = clock64();
  float sum = l;
  #pragma unroll
  for (int i = 0; i < 64; ++i) sum += o[i];
  if (sum == 12345.f) sink[0] = 3;
  if (tid % 128 == 0) {
    unsigned long long* c = cycles + kLoopFields * (blockIdx.x * 2 + wgi);
    c[0] = t1 - t0;
    c[1] = t_soft;
    c[2] = t_prod;
    c[3] = t0;
    c[4] = t_issue;  // sum over blocks of (products start - t0)
  }
#else
  __trap();
#endif
}

template <int PINGPONG, int PRODUCER, int STAGES, bool PV16 = false>
void run_loop(int sms, unsigned long long* d_cycles, int* d_sink, const uint4* src, int src_blocks) {
  constexpr int kRingStages = STAGES ? STAGES : 2;
  const int smem = 2 * kABytes + (PV16 ? 3 : 2) * 128 * 128 +
                   (PRODUCER ? kRingStages * 32768 + 2 * 8 * kRingStages : 0) + 1024;
  const int blocks = 512;
  constexpr int kWgmmasPerBlock = PV16 ? 2 * (4 + 8) : 2 * (4 + 4);  // both warpgroups, 64 cycles each
  auto kernel = loop_kernel<PINGPONG, PRODUCER, STAGES, PV16>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<sms, PRODUCER ? 384 : 256, smem>>>(blocks, d_cycles, d_sink, src, src_blocks);
  kernel<<<sms, PRODUCER ? 384 : 256, smem>>>(blocks, d_cycles, d_sink, src, src_blocks);
  CHECK(cudaDeviceSynchronize());
  static unsigned long long h[132 * 2 * kLoopFields];
  CHECK(cudaMemcpy(h, d_cycles, sizeof(unsigned long long) * sms * 2 * kLoopFields, cudaMemcpyDeviceToHost));
  double c[2][3] = {}, offset = 0;
  for (int i = 0; i < sms; ++i) {
    const unsigned long long* w0 = h + kLoopFields * 2 * i;
    const unsigned long long* w1 = w0 + kLoopFields;
    for (int w = 0; w < 2; ++w)
      for (int f = 0; f < 3; ++f) c[w][f] += static_cast<double>(w0[kLoopFields * w + f]) / sms / blocks;
    // mean over blocks of WG1's products start minus WG0's (clock64 is one counter per SM)
    offset += (static_cast<double>(w1[3]) - static_cast<double>(w0[3]) +
               (static_cast<double>(w1[4]) - static_cast<double>(w0[4])) / blocks) / sms;
  }
  std::printf("loop, P.V %s, ping-pong %d, producer %d, stages %d: cycles per block %.0f / %.0f (WG0 / WG1); softmax %.0f / %.0f, "
              "wait + turn + products %.0f / %.0f; WG1 - WG0 products start %+.0f; tensor busy %.0f%% at 64 cycles per wgmma\n",
              PV16 ? "f16" : "e4m3", PINGPONG, PRODUCER, STAGES, c[0][0], c[1][0], c[0][1], c[1][1], c[0][2], c[1][2],
              offset, 100.0 * kWgmmasPerBlock * 64 / c[0][0]);
}

template <int NWG, int N, int OP, int CHAINS, bool SHARED_B, int IN_FLIGHT>
void run(int sms, int iters, unsigned long long* d_cycles, int* d_sink) {
  auto kernel = rate_kernel<NWG, N, OP, CHAINS, SHARED_B, IN_FLIGHT>;
  const int smem = NWG * kABytes + (SHARED_B ? 1 : NWG) * N * 128 + 1024;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<sms, NWG * 128, smem>>>(iters, d_cycles, d_sink);  // warm-up
  CHECK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    CHECK(cudaEventRecord(e0));
    kernel<<<sms, NWG * 128, smem>>>(iters, d_cycles, d_sink);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    best = ms < best ? ms : best;
  }
  static unsigned long long h_cycles[132 * 4];
  CHECK(cudaMemcpy(h_cycles, d_cycles, sizeof(unsigned long long) * sms * NWG, cudaMemcpyDeviceToHost));
  double mean_cycles = 0;
  for (int i = 0; i < sms * NWG; ++i) mean_cycles += static_cast<double>(h_cycles[i]);
  mean_cycles /= sms * NWG;
  const double wgmmas = static_cast<double>(iters) * 4 * CHAINS;  // per warpgroup
  const double macs = wgmmas * NWG * sms * 64.0 * N * 32;
  std::printf("%-9s NWG %d  N %3d  chains %d  B %-7s in-flight %d | %7.0f TOPS  %6.1f cycles/wgmma/WG  %5.1f cycles/wgmma/SM\n",
              OP == kS8SS ? "s8 SS" : "e4m3 RS", NWG, N, CHAINS, SHARED_B ? "shared" : "own", IN_FLIGHT,
              2.0 * macs / (best * 1e-3) / 1e12, mean_cycles / wgmmas, mean_cycles / wgmmas / NWG);
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row reaches the log even if a later one hangs and is killed
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (sms > 132) sms = 132;
  unsigned long long* d_cycles;
  int* d_sink;
  CHECK(cudaMalloc(&d_cycles, sizeof(unsigned long long) * 132 * 2 * kLoopFields));
  CHECK(cudaMalloc(&d_sink, sizeof(int)));
  const int iters = 4000;
  std::printf("peak at 1.98 GHz: dense int8 / fp8 = %d SMs x 4096 MAC/clk x 2 = %.0f TOPS; ideal 64 cycles per m64n128k32 per SM\n",
              sms, sms * 4096.0 * 2 * 1.98e9 / 1e12);
  // s8, A and B from shared memory (the QK^T of the kernels)
  run<1, 128, kS8SS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<1, 128, kS8SS, 2, true, 1>(sms, iters, d_cycles, d_sink);
  run<1, 128, kS8SS, 1, true, 2>(sms, iters, d_cycles, d_sink);
  run<2, 128, kS8SS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<2, 128, kS8SS, 1, false, 1>(sms, iters, d_cycles, d_sink);
  run<3, 128, kS8SS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<4, 128, kS8SS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<1, 64, kS8SS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<1, 64, kS8SS, 2, true, 1>(sms, iters, d_cycles, d_sink);
  run<2, 64, kS8SS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<1, 256, kS8SS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<2, 256, kS8SS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  // e4m3, A from registers, B from shared memory (the FP8 P.V)
  run<1, 128, kE4m3RS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<1, 128, kE4m3RS, 2, true, 1>(sms, iters, d_cycles, d_sink);
  run<2, 128, kE4m3RS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<3, 128, kE4m3RS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<1, 256, kE4m3RS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  run<2, 256, kE4m3RS, 1, true, 1>(sms, iters, d_cycles, d_sink);
  // one warpgroup's wgmmas beside another's softmax-like work: cycles of each, alone and together
  {
    const int smem = kABytes + 128 * 128 + 1024;
    CHECK(cudaFuncSetAttribute(mixed_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    static unsigned long long h[132 * 2];
    const int wi = 2000, ai = 300;
    const int runs[3][2] = {{wi, 0}, {0, ai}, {wi, ai}};
    for (const auto& r : runs) {
      mixed_kernel<<<sms, 256, smem>>>(r[0], r[1], d_cycles, d_sink);
      mixed_kernel<<<sms, 256, smem>>>(r[0], r[1], d_cycles, d_sink);
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemcpy(h, d_cycles, sizeof(unsigned long long) * sms * 2, cudaMemcpyDeviceToHost));
      double c0 = 0, c1 = 0;
      for (int i = 0; i < sms; ++i) c0 += static_cast<double>(h[2 * i]), c1 += static_cast<double>(h[2 * i + 1]);
      c0 /= sms, c1 /= sms;
      std::printf("mixed: wgmma groups %4d, softmax rounds %3d | WG0 %.1f cycles per wgmma, WG1 %.1f cycles per 64-score round (%.2f per EX2 per warp)\n",
                  r[0], r[1], r[0] ? c0 / (4.0 * r[0]) : 0.0, r[1] ? c1 / r[1] : 0.0, r[1] ? c1 / r[1] / 64 : 0.0);
    }
  }
  const int src_blocks = 4096;  // 128 MB of K/V blocks: the stream comes from DRAM, as in the kernels
  uint4* d_src;
  CHECK(cudaMalloc(&d_src, static_cast<size_t>(src_blocks) * 32768));
  CHECK(cudaMemset(d_src, 0x11, static_cast<size_t>(src_blocks) * 32768));
  run_loop<0, 0, 0>(sms, d_cycles, d_sink, d_src, src_blocks);  // no memory at all
  run_loop<2, 0, 0>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<0, 1, 0>(sms, d_cycles, d_sink, d_src, src_blocks);  // a producer nobody waits for
  run_loop<2, 1, 0>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<0, 2, 0>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<2, 2, 0>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<0, 1, 2>(sms, d_cycles, d_sink, d_src, src_blocks);  // the kernels' protocol (cp.async, 2 stages)
  run_loop<0, 1, 3>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<2, 1, 2>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<0, 2, 2>(sms, d_cycles, d_sink, d_src, src_blocks);  // the same fed by bulk copies
  run_loop<0, 2, 3>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<0, 2, 4>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<2, 2, 3>(sms, d_cycles, d_sink, d_src, src_blocks);
  // the shipped fp16 family's P.V: lockstep against turns, no memory
  run_loop<0, 0, 0, true>(sms, d_cycles, d_sink, d_src, src_blocks);
  run_loop<2, 0, 0, true>(sms, d_cycles, d_sink, d_src, src_blocks);
  return 0;
}
