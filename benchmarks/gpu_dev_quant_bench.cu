// Times the shared INT8 quantization kernel (quant_int8_kernel) and V's FP8 scale kernel alone, with CUDA events, on the benchmark shapes, and prints a checksum of every output so
// that builds with different tuning knobs (SAGE_QUANT_THREADS, SAGE_QUANT_KEEP_MAX,
// SAGE_QUANT_MIN_CTAS) can be checked for identical results. Kernel developers' tool, no torch:
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -I csrc [-DSAGE_QUANT_THREADS=256] \
//        -o /tmp/quant_bench benchmarks/gpu_dev_quant_bench.cu && /tmp/quant_bench
//
// Inputs: fp16 [B, H, N, D] HND, values a fixed function of the index in [-4, 4); K with a token
// mean to subtract (smoothing: the V scale kernel's mean of the same tensor); per_thread
// granularity, the native ops' default.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>

#include "common/quant_kernels.cuh"

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); return 1; } } while (0)

__global__ void fill(__half* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    x[i] = __float2half((h & 0xffff) / 8192.f - 4.f);
  }
}

static uint64_t checksum(const void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
  uint64_t s = 1469598103934665603ull;
  for (uint8_t c : h) s = (s ^ c) * 1099511628211ull;
  return s;
}

int main() {
  const int shapes[][4] = {{4, 32, 4096, 128}, {8, 32, 1024, 128}, {4, 32, 4096, 64}, {1, 32, 16384, 128}};
  std::printf("SAGE_QUANT_THREADS=%d SAGE_QUANT_KEEP_MAX=%d SAGE_QUANT_MIN_CTAS=%d\n", SAGE_QUANT_THREADS,
              SAGE_QUANT_KEEP_MAX, SAGE_QUANT_MIN_CTAS);
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  for (const auto& s : shapes) {
    const int B = s[0], H = s[1], N = s[2], D = s[3];
    const int64_t n = int64_t(B) * H * N * D;
    __half* x;
    float *mean, *scale, *partial, *vscale;
    int8_t* out;
    int* arrivals;
    CHECK(cudaMalloc(&x, n * 2));
    CHECK(cudaMalloc(&out, n + int64_t(B) * H * 128 * D));
    CHECK(cudaMalloc(&mean, int64_t(B) * H * D * 4));
    CHECK(cudaMalloc(&scale, int64_t(B) * H * (N / 32 + 4) * 8 * 4));
    CHECK(cudaMalloc(&partial, int64_t(B) * H * (N / 64 + 1) * 3 * D * 4));
    CHECK(cudaMalloc(&vscale, int64_t(B) * H * D * 4));
    CHECK(cudaMalloc(&arrivals, int64_t(B) * H * 4));
    fill<<<1024, 256>>>(x, n, 12345u);

    // V's FP8 scale without and with smoothing (which also gives the mean K subtracts below).
    float ms = 0.f;
    const int reps = 50;
    for (int smooth = 0; smooth < 2; ++smooth) {
      sage::VScaleParams st{};
      st.v = x; st.v_sb = int64_t(H) * N * D; st.v_sh = int64_t(N) * D; st.v_sn = D;
      st.heads = H; st.tokens = N; st.head_dim = D;
      st.chunks = (N + sage::v_scale_chunk_tokens(D) - 1) / sage::v_scale_chunk_tokens(D);
      st.partial = partial; st.arrivals = arrivals; st.scale = vscale; st.mean = smooth ? mean : nullptr;
      st.scale_max = 448.f;
      auto run_scale = [&] {
        cudaMemsetAsync(arrivals, 0, int64_t(B) * H * 4);
        return sage::launch_v_scale(st, B, sage::DType::kFloat16, smooth, 0);
      };
      CHECK(run_scale());
      CHECK(cudaEventRecord(t0));
      for (int r = 0; r < reps; ++r) run_scale();
      CHECK(cudaEventRecord(t1));
      CHECK(cudaEventSynchronize(t1));
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      std::printf("%dx%dx%dx%d V FP8 scale%s (with its memset): %7.1f us  %.2f TB/s  sum %016llx\n", B, H, N,
                  D, smooth ? " and mean" : "", 1e3 * ms / reps, n * 2 / (1e9 * ms / reps),
                  (unsigned long long)(checksum(vscale, int64_t(B) * H * D * 4) ^
                                       (smooth ? checksum(mean, int64_t(B) * H * D * 4) : 0)));
    }

    for (int is_key = 0; is_key < 2; ++is_key) {
      sage::QuantInt8Params p{};
      p.x = x; p.x_sb = int64_t(H) * N * D; p.x_sh = int64_t(N) * D; p.x_sn = D;
      p.mean = is_key ? mean : nullptr;
      p.out = out; p.scale_out = scale;
      p.heads = H; p.tokens = N; p.head_dim = D;
      p.block_tokens = is_key ? 64 : 32;
      p.groups_per_block = is_key ? 4 : 8;
      p.padded_tokens = (N + (is_key ? 63 : 127)) / (is_key ? 64 : 128) * (is_key ? 64 : 128);
      p.scale_groups = p.padded_tokens / p.block_tokens * p.groups_per_block;
      p.scale_mult = is_key ? 1.f : 0.12752f;
      CHECK(sage::launch_quant_int8(p, B, sage::DType::kFloat16, 0));
      CHECK(cudaEventRecord(t0));
      for (int r = 0; r < reps; ++r) sage::launch_quant_int8(p, B, sage::DType::kFloat16, 0);
      CHECK(cudaEventRecord(t1));
      CHECK(cudaEventSynchronize(t1));
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      const int64_t out_bytes = int64_t(B) * H * p.padded_tokens * D;
      const uint64_t sum = checksum(out, out_bytes) ^ checksum(scale, int64_t(B) * H * p.scale_groups * 4);
      std::printf("%dx%dx%dx%d %s INT8 per_thread: %7.1f us  %.2f TB/s  sum %016llx\n", B, H, N, D,
                  is_key ? "K" : "Q", 1e3 * ms / reps, (n * 2 + out_bytes) / (1e9 * ms / reps),
                  (unsigned long long)sum);
    }
    CHECK(cudaFree(x)); CHECK(cudaFree(out)); CHECK(cudaFree(mean)); CHECK(cudaFree(scale));
    CHECK(cudaFree(partial)); CHECK(cudaFree(arrivals)); CHECK(cudaFree(vscale));
  }
  return 0;
}
