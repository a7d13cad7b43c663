// CUDA's limit on a launch grid's y and z dims. Every kernel here puts heads in y and the batch in
// z (or y), so the ops refuse more of either; sageattn routes such calls to SDPA before they get
// here (sageattention/backends.py, MAX_GRID_YZ: tests/unit check that the two agree).
#pragma once
#include <cstdint>

namespace sage {

constexpr int64_t kMaxGridYZ = 65535;

}  // namespace sage
