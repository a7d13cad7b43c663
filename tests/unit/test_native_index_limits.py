"""32-bit index limits of the native kernels that a CPU can check.

The warp-specialized wgmma kernel (csrc/common/attn_wgmma.cuh, the sm90 and sm90_fp8 families) runs
persistent CTAs, each walking many (query block, head, batch) tiles; its producer and consumers
find a K block's ring stage and mbarrier phase from g0, the CTA's count of the K blocks before the
tile. As a plain int that count passed 2^31 once a call held more than (resident CTAs) * (2^31 - 1)
K blocks, within the ops' limits and within an H100's memory (1 x 1 x 83.5M x 64: 53 GB). The count
is now folded by ws_ring_after (csrc/common/ws_ring.h); the driver below runs that header on the
host against a 64-bit count, past 2^31 blocks.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from host_cpp import compile_driver

ROOT = Path(__file__).resolve().parents[2]

DRIVER = r"""
#include <cstdint>
#include <cstdio>
#include <random>
#include "ws_ring.h"

// One CTA's walk over tiles of n_kblocks each (up to 2^24, kMaxTokens / 64), until its 64-bit
// count passes `until`: every block's stage, phase and the producer's wait (on its stage's previous
// use, at that use's phase) as the kernel derives them from the folded g0, against the count.
template <int S>
static int walk(long long until, unsigned seed, long long* tiles, long long* total) {
  std::mt19937 rng(seed);
  int g0 = 0;
  long long ref = 0;
  *tiles = 0;
  while (ref <= until) {
    const int pick = rng() % 4;
    const int n = pick == 0 ? 1 + (int)(rng() % 5) : pick == 1 ? (1 << 24) - (int)(rng() % 3)
                : 1 + (int)(rng() % (1 << 24));
    const int kbs[] = {0, 1, 2, S - 1, S, n - 2, n - 1, (int)(rng() % n)};
    for (int kb : kbs) {
      if (kb < 0 || kb >= n) continue;
      const int gb = g0 + kb;
      const long long rb = ref + kb;
      if (gb < 0 || gb % S != rb % S || ((gb / S) & 1) != ((rb / S) & 1) || (gb >= S) != (rb >= S) ||
          (rb >= S && ((gb / S - 1) & 1) != ((rb / S - 1) & 1))) {
        std::printf("mismatch S=%d tile %lld kb %d: g0 %d, count %lld\n", S, *tiles, kb, g0, ref);
        return 1;
      }
    }
    g0 = sage::ws_ring_after<S>(g0, n);
    ref += n;
    ++*tiles;
    if (g0 < 0 || g0 >= 4 * S) { std::printf("g0 %d out of [0, %d)\n", g0, 4 * S); return 1; }
  }
  *total = ref;
  return 0;
}

// Short tiles from the start: the first lap (no waits), then every stage and phase in turn.
template <int S>
static int first_laps() {
  int g0 = 0;
  long long ref = 0;
  for (int tile = 0; tile < 200; ++tile) {
    const int n = 1 + tile % 7;
    for (int kb = 0; kb < n; ++kb) {
      const int gb = g0 + kb;
      const long long rb = ref + kb;
      if (gb % S != rb % S || ((gb / S) & 1) != ((rb / S) & 1) || (gb >= S) != (rb >= S)) {
        std::printf("first laps: mismatch S=%d tile %d kb %d\n", S, tile, kb);
        return 1;
      }
    }
    g0 = sage::ws_ring_after<S>(g0, n);
    ref += n;
  }
  return 0;
}

int main() {
  int bad = first_laps<2>() + first_laps<3>() + first_laps<4>();
  long long tiles = 0, total = 0, most = 0;
  const long long until = 3LL << 31;  // well past a 32-bit count
  for (unsigned seed = 1; seed <= 3; ++seed) {
    bad += walk<2>(until, seed, &tiles, &total);
    most = total > most ? total : most;
    bad += walk<3>(until, seed, &tiles, &total);
    bad += walk<4>(until, seed, &tiles, &total);
  }
  std::printf("%d %lld\n", bad, most);
  return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return compile_driver(tmp_path_factory.mktemp("ws_ring"), "driver", DRIVER)


def test_ring_position_matches_a_64_bit_count_past_2_31_blocks(driver):
    out = subprocess.run([str(driver)], capture_output=True, text=True, check=True).stdout.split()
    bad, most = int(out[-2]), int(out[-1])
    assert bad == 0, " ".join(out)
    assert most > 2**32  # the walk went far past where an int count wrapped


def test_both_roles_advance_the_ring_through_ws_ring_after():
    """The producer and the consumers must derive the same stages and phases: both advance g0 with
    ws_ring_after, and no running count of K blocks is left."""
    source = (ROOT / "csrc" / "common" / "attn_wgmma.cuh").read_text()
    assert '#include "ws_ring.h"' in source
    assert len(re.findall(r"\bg0 = ws_ring_after<STAGES>\(g0, n_kblocks\);", source)) == 2
    assert not re.search(r"\bg0\s*\+=", source)


def test_the_example_in_ws_ring_h_passed_the_32_bit_count():
    """1 x 1 x 83.5M x 64 on the sm90 family (192 query rows a tile at d=64, 128 keys a block) on 132
    SMs, one CTA each: its K blocks exceed 132 * (2^31 - 1), so some CTA's count passed 2^31."""
    tiles_h = (ROOT / "csrc" / "sm90" / "tiles.cuh").read_text()
    assert "#define SAGE_SM90_NWG_64 3" in tiles_h and "#define SAGE_SM90_BLOCK_N_64 128" in tiles_h
    n = 83_500_000
    blocks = -(-n // (3 * 64)) * -(-n // 128)
    assert blocks > 132 * (2**31 - 1)
    # q, k, v and the output in fp16, Q and K in int8 (padded to 128 / 64 tokens): on an 80 GB card
    assert n * 64 * 2 * 4 + (-(-n // 128) * 128 + -(-n // 64) * 64) * 64 < 80e9
