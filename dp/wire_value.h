// The 16-bit type in which gradient values travel (dp/sparse_encoding.h's records, the sparse
// collectives): fp16 or bf16, rounded to nearest even. Its own header so that CUDA sources, which
// compile as C++17, can name it without the encoders' C++20 headers.
#pragma once

#include <cstdint>

namespace fusekit::dp {

enum class WireValue : uint8_t { f16 = 0, bf16 = 1 };

}  // namespace fusekit::dp
