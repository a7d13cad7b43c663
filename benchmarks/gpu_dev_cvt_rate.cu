// Which pipe do the softmax's conversions use? Rates per clock per SM of the packs that turn P into
// the P.V operand, alone and beside MUFU.EX2 at the softmax's mix (one pack per two exponentials):
// the fp16 family packs with cvt.rn.f16x2.f32 (F2FP.F16.F32.PACK_AB), the FP8 family with
// cvt.rn.satfinite.e4m3x2.f32 (F2FP.SATFINITE.E4M3.F32.PACK_AB). If a pack shares the MUFU's
// quarter-rate unit, "ex2 + pack" takes the sum of the two alone; if not, about the larger.
// Then the latency of each with one warp per scheduler and one chain (the softmax's situation in a
// warpgroup that runs alone). Each thread runs 8 independent chains in the rate rows; the grid
// fills every SM with 32 warps. Results per clock per SM = instructions / (time * clock * SMs),
// with the clock from the device attribute (not locked: compare rows, not absolute figures).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/cvt_rate benchmarks/gpu_dev_cvt_rate.cu
//   /tmp/cvt_rate
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

constexpr int kIters = 2048;

enum Op { kEx2, kPackF16, kPackE4m3, kPackE4m3FromF16, kEx2PlusF16, kEx2PlusE4m3, kFfma };

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Each pack feeds its result back as the next input's bits: a chain ptxas cannot hoist.
__device__ __forceinline__ uint32_t pack_f16(uint32_t r) {
  uint32_t d;
  asm volatile("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(__uint_as_float(r & 0x3fffffffu)), "f"(0.5f));
  return d;
}
__device__ __forceinline__ uint32_t pack_e4m3(uint32_t r) {
  uint16_t d;
  asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(__uint_as_float(r & 0x3fffffffu)), "f"(0.5f));
  return d;
}
__device__ __forceinline__ uint32_t pack_e4m3_from_f16(uint32_t r) {
  uint16_t d;
  asm volatile("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(d) : "r"(r & 0x3bff3bffu));
  return d;
}

template <Op OP, int CHAINS>
__global__ void rate_kernel(float* out, float seed) {
  float f[CHAINS];
  uint32_t u[CHAINS];
  for (int c = 0; c < CHAINS; ++c) {
    f[c] = -seed * (threadIdx.x + c) * 1e-6f;
    u[c] = 0x3c003c00u ^ static_cast<uint32_t>(c + threadIdx.x);
  }
  #pragma unroll 1
  for (int i = 0; i < kIters; ++i) {
    #pragma unroll
    for (int c = 0; c < CHAINS; ++c) {
      if constexpr (OP == kEx2) f[c] = ex2(f[c]);
      if constexpr (OP == kFfma) f[c] = fmaf(f[c], 0.999f, 1e-3f);
      if constexpr (OP == kPackF16) u[c] = pack_f16(u[c]);
      if constexpr (OP == kPackE4m3) u[c] = pack_e4m3(u[c]);
      if constexpr (OP == kPackE4m3FromF16) u[c] = pack_e4m3_from_f16(u[c]);
      if constexpr (OP == kEx2PlusF16 || OP == kEx2PlusE4m3) {
        f[c] = ex2(f[c]);  // two exponentials per pack, as in the softmax
        f[c] = ex2(f[c]);
        u[c] = OP == kEx2PlusF16 ? pack_f16(u[c]) : pack_e4m3(u[c]);
      }
    }
  }
  float s = 0.f;
  for (int c = 0; c < CHAINS; ++c) s += f[c] + static_cast<float>(u[c]);
  if (s == 12345.f) out[threadIdx.x] = s;  // keeps the chains alive
}

template <typename K>
static double time_ms(K kernel, int blocks, int threads, float* out) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  kernel<<<blocks, threads>>>(out, 1.f);  // warm-up
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(a);
    kernel<<<blocks, threads>>>(out, 1.f);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    best = ms < best ? ms : best;
  }
  return best;
}

int main() {
  int dev = 0, sms = 0, khz = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
  float* out = nullptr;
  cudaMalloc(&out, 1 << 16);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, dev);
  std::printf("%s, %d SMs, clock attribute %.0f MHz, %d iterations a thread\n", prop.name, sms, khz / 1e3, kIters);
  // Rates: 2 blocks of 1024 threads per SM, 8 chains a thread (instructions = per chain per iteration).
  struct Rate {
    const char* name;
    double ms;
    double per_chain_iter;
  } rates[] = {
      {"ex2.approx.ftz.f32", time_ms(rate_kernel<kEx2, 8>, 2 * sms, 1024, out), 1},
      {"fma.rn.f32", time_ms(rate_kernel<kFfma, 8>, 2 * sms, 1024, out), 1},
      {"cvt.rn.f16x2.f32", time_ms(rate_kernel<kPackF16, 8>, 2 * sms, 1024, out), 1},
      {"cvt.rn.satfinite.e4m3x2.f32", time_ms(rate_kernel<kPackE4m3, 8>, 2 * sms, 1024, out), 1},
      {"cvt...e4m3x2.f16x2", time_ms(rate_kernel<kPackE4m3FromF16, 8>, 2 * sms, 1024, out), 1},
      {"2 ex2 + 1 f16x2 pack", time_ms(rate_kernel<kEx2PlusF16, 8>, 2 * sms, 1024, out), 3},
      {"2 ex2 + 1 e4m3x2 pack", time_ms(rate_kernel<kEx2PlusE4m3, 8>, 2 * sms, 1024, out), 3},
  };
  const double threads = 1024.0 * 2 * sms;
  std::printf("%-30s %9s %14s %22s\n", "rate (32 warps/SM, 8 chains)", "ms", "instr/clk/SM", "ns per chain-iteration");
  for (const Rate& r : rates) {
    const double instr = threads * kIters * 8 * r.per_chain_iter;
    const double per_clk = instr / (r.ms * 1e-3) / (khz * 1e3) / sms;
    std::printf("%-30s %9.3f %14.2f %22.4f\n", r.name, r.ms, per_clk, r.ms * 1e6 / kIters);
  }
  const double sum = rates[0].ms * 2 + rates[2].ms, sum8 = rates[0].ms * 2 + rates[3].ms;
  std::printf("ex2 x2 + f16 pack alone, summed: %.3f ms (measured together %.3f)\n", sum, rates[5].ms);
  std::printf("ex2 x2 + e4m3 pack alone, summed: %.3f ms (measured together %.3f)\n", sum8, rates[6].ms);
  // Latency: one block of 128 threads per SM (a warp per scheduler), one chain.
  struct Lat {
    const char* name;
    double ms;
  } lats[] = {
      {"ex2.approx.ftz.f32", time_ms(rate_kernel<kEx2, 1>, sms, 128, out)},
      {"fma.rn.f32", time_ms(rate_kernel<kFfma, 1>, sms, 128, out)},
      {"cvt.rn.f16x2.f32", time_ms(rate_kernel<kPackF16, 1>, sms, 128, out)},
      {"cvt.rn.satfinite.e4m3x2.f32", time_ms(rate_kernel<kPackE4m3, 1>, sms, 128, out)},
      {"cvt...e4m3x2.f16x2", time_ms(rate_kernel<kPackE4m3FromF16, 1>, sms, 128, out)},
  };
  std::printf("%-30s %22s\n", "latency (1 warp/scheduler)", "cycles per dependent op");
  for (const Lat& l : lats)
    std::printf("%-30s %22.1f\n", l.name, l.ms * 1e-3 * khz * 1e3 / kIters);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
