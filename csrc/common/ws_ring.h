// The K/V ring position of the warp-specialized wgmma kernel's persistent CTAs (attn_wgmma.cuh), as
// plain C++ so the host can run it too: tests/unit/test_native_index_limits.py checks it against a
// 64-bit count of the K blocks.
#pragma once

#include "host_device.h"

namespace sage {

// The ring position g0 of the next tile's block 0, after a tile of n_kblocks. Block g0 + kb uses
// stage (g0 + kb) % STAGES at phase ((g0 + kb) / STAGES) & 1, and the producer waits for a stage
// from g0 + kb >= STAGES on: only g0 mod 2 * STAGES and g0 >= STAGES matter, so once g0 reaches
// 2 * STAGES it is folded into [2 * STAGES, 4 * STAGES). A plain running count of a persistent
// CTA's K blocks passed 2^31 (signed overflow: wrong stages and phases, a hang or a wrong output)
// once a call's tiles held more than (resident CTAs) * (2^31 - 1) K blocks in all, e.g. q, k and
// v of 1 x 1 x 83.5M x 64 on 132 SMs (53 GB with the output and the INT8 copies).
template <int STAGES>
SAGE_HOST_DEVICE int ws_ring_after(int g0, int n_kblocks) {
  const int g = g0 + n_kblocks;  // < 4 * STAGES + 2^24: n_kblocks <= kMaxTokens / 64
  return g < 2 * STAGES ? g : 2 * STAGES + g % (2 * STAGES);
}

}  // namespace sage
