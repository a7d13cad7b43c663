// Size limits of the kernels' launches and indices. kMaxGridYZ: CUDA's limit on a launch grid's
// y and z dims. Every kernel here puts heads in y and the batch in z (or y), so the ops refuse
// more of either; sageattn routes such calls to SDPA before they get here
// (sageattention/backends.py, MAX_GRID_YZ: tests/unit check that the two agree).
#pragma once
#include <cstdint>

namespace sage {

constexpr int64_t kMaxGridYZ = 65535;

// Tokens per sequence: the kernels keep token indices (and the padded lengths) in 32-bit ints, with
// room for padding and for sums of two of them; the ops refuse more (op_checks.h).
constexpr int64_t kMaxTokens = int64_t{1} << 30;

}  // namespace sage
