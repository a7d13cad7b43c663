// Synchronisation primitives of the warp-specialized sm_90a kernel (attn_wgmma.cuh): shared-memory
// mbarriers fed by cp.async completions, named barriers between warpgroups, and the per-warpgroup
// register reallocation (setmaxnreg). Compiled only where wgmma is (SAGE_HAS_WGMMA); elsewhere the
// kernel that calls them traps before reaching them.
#pragma once
#include <cstdint>

#include "wgmma_ops.cuh"

namespace sage::sm90 {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#ifdef SAGE_HAS_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

// Plain arrive (release at CTA scope): this thread is done with what the barrier guards.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef SAGE_HAS_WGMMA
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Arrives once every cp.async this thread issued so far has landed. noinc: the arrival counts
// against the count the barrier was initialised with (one per copying thread).
__device__ __forceinline__ void mbar_arrive_on_cp_async(uint32_t bar) {
#ifdef SAGE_HAS_WGMMA
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Arrive on `bar` (count 1) and expect `bytes` more transaction bytes in its current phase (the
// bulk copies that complete on it).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef SAGE_HAS_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// After mbar_init, before a bulk copy may complete on the barriers: makes the initialised
// barriers visible to the async proxy.
__device__ __forceinline__ void mbar_init_fence() {
#ifdef SAGE_HAS_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Blocks until the barrier's phase with parity `parity` has completed (acquire at CTA scope).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef SAGE_HAS_WGMMA
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads: sync waits, arrive does not.
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Per-warpgroup register budget (all warps of the warpgroup execute it together).
template <int REGS>
__device__ __forceinline__ void regs_raise() {
#ifdef SAGE_HAS_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void regs_lower() {
#ifdef SAGE_HAS_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

}  // namespace sage::sm90
