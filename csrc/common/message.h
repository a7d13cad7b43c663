// Numbers in TORCH_CHECK messages. Plain C++, no torch.
#pragma once
#include <cstdint>
#include <string>

namespace sage {

// A number for an error message, formatted by std::to_string (vsnprintf), never by streaming it:
// on the GPU runner, an int64 streamed into a TORCH_CHECK message inside these extensions killed
// the process (SIGSEGV in std::ostream::_M_insert<long> through a locale facet, where the same
// call with only strings raised cleanly; docs/kernels.md, Known limits). Strings stream safely.
inline std::string num(int64_t v) { return std::to_string(v); }

}  // namespace sage
