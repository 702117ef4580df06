// The constants of the sparse collective's re-selection (dp/slice_plan.h), in their own header so
// that CUDA sources, which compile as C++17, can use them without slice_plan.h's C++20 headers.
#pragma once

namespace fusekit::dp {

// A magnitude's bin is the top 11 bits of its float below the sign (exponent and 3 mantissa bits):
// bin b holds the bit patterns [b << kMagnitudeShift, (b + 1) << kMagnitudeShift), an eighth of an
// octave.
constexpr int kMagnitudeBins = 2048;
constexpr int kMagnitudeShift = 20;
// The second level splits one bin by the next 11 bits: bin (bits >> kFineShift) & (kMagnitudeBins - 1)
// of the values whose coarse bin is the one being refined, 1/16384 of an octave each.
constexpr int kFineShift = 9;

// The bucketed index form on the wire (IndexForm::bucketed, dp/sparse_collective.h): an index in a
// slice [begin, end) travels as the low 16 bits of index - begin, and the slice's entries are
// counted per bucket of 2^kBucketShift elements (one uint32 per bucket).
constexpr int kBucketShift = 16;

}  // namespace fusekit::dp
