// Exponentials per clock per SM on this GPU: ex2.approx.ftz.f32 (one result per MUFU instruction)
// against ex2.approx.f16x2 and ex2.approx.ftz.bf16x2 (two results per instruction: do they cost
// one MUFU slot or two?). Each thread runs 8 independent chains so latency does not bound it;
// the grid fills every SM with 32 warps. Results per clock per SM = exponentials / (time * clock *
// SMs), the clock read from the device attribute (the runner does not lock it: a ratio between
// the rows is what counts).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/ex2_rate benchmarks/gpu_dev_ex2_rate.cu
//   /tmp/ex2_rate
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

constexpr int kChains = 8;
constexpr int kIters = 4096;

__global__ void ex2_f32(float* out, float seed) {
  float v[kChains];
  for (int c = 0; c < kChains; ++c) v[c] = -seed * (threadIdx.x + c) * 1e-6f;
  #pragma unroll 1
  for (int i = 0; i < kIters; ++i)
    #pragma unroll
    for (int c = 0; c < kChains; ++c) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(v[c]));
  float s = 0.f;
  for (int c = 0; c < kChains; ++c) s += v[c];
  if (s == 12345.f) out[threadIdx.x] = s;  // keeps the chains alive
}

template <bool BF16>
__global__ void ex2_x2(float* out, float seed) {
  uint32_t v[kChains];
  for (int c = 0; c < kChains; ++c) v[c] = 0x3c003c00u ^ static_cast<uint32_t>(c + threadIdx.x * seed);
  #pragma unroll 1
  for (int i = 0; i < kIters; ++i)
    #pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (BF16)
        asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(v[c]));
      else
        asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(v[c]));
    }
  uint32_t s = 0;
  for (int c = 0; c < kChains; ++c) s ^= v[c];
  if (s == 12345u) out[threadIdx.x] = static_cast<float>(s);
}

template <typename K>
static double time_ms(K kernel, int blocks, float* out) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  kernel<<<blocks, 1024>>>(out, 1.f);  // warm-up
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(a);
    kernel<<<blocks, 1024>>>(out, 1.f);
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
  cudaMalloc(&out, 4096);
  const int blocks = 2 * sms;
  const double threads = 1024.0 * blocks;
  const double instr = threads * kIters * kChains;  // ex2 instructions issued
  std::printf("%d SMs, clock attribute %.0f MHz; %d chains x %d iterations a thread\n", sms, khz / 1e3, kChains, kIters);
  std::printf("%-24s %10s %18s %18s\n", "instruction", "ms", "instr/clk/SM", "results/clk/SM");
  struct Row {
    const char* name;
    double ms;
    int results;
  } rows[] = {
      {"ex2.approx.ftz.f32", time_ms(ex2_f32, blocks, out), 1},
      {"ex2.approx.f16x2", time_ms(ex2_x2<false>, blocks, out), 2},
      {"ex2.approx.ftz.bf16x2", time_ms(ex2_x2<true>, blocks, out), 2},
  };
  for (const Row& r : rows) {
    const double per_clk = instr / (r.ms * 1e-3) / (khz * 1e3) / sms;
    std::printf("%-24s %10.3f %18.2f %18.2f\n", r.name, r.ms, per_clk, per_clk * r.results);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    std::printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
