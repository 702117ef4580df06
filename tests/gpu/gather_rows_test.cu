// The row gather and scatter against the float64 reference, on fresh random inputs and fresh random
// distinct indices (in random order), with every output poisoned (NaN) first and a poisoned guard
// row on each side of it that must stay poisoned. A copy is exact, so outputs must equal the
// reference bit for bit. fp32, fp16, bf16; columns 1, 3, 4, 7, 8, 12, 768 and 769 (the 16-byte vector
// path where columns x element size allows, the element path otherwise, and operands one element
// off 16-byte alignment for the element path at 768); rows_out 0, 1, a part and all of rows_in
// (a permutation); BERT-base's MLM head gather (4096 tokens, 608 rows of 768). Out-of-range indices
// (-1, rows_in, INT_MAX, INT_MIN) give NaN rows forward and nothing backward, and touch nothing
// outside the tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_buffers.h"
#include "gpu_test_support.h"
#include "kernels/gather_rows.h"
#include "kernels/reference/gather_rows.h"

namespace fusekit::kernels {
namespace {

// A device matrix [rows, columns] with one poisoned guard row before and after it, `offset`
// elements past a 16-byte aligned allocation (offset 1: element-aligned only).
struct GuardedRows {
  int rows, columns, offset;
  DType dtype;
  Buffer buffer;  // owns device memory: never copied
  GuardedRows(int rows_, int columns_, int offset_, DType dtype_)
      : rows(rows_),
        columns(columns_),
        offset(offset_),
        dtype(dtype_),
        buffer(static_cast<size_t>(rows_ + 2) * columns_ + offset_, dtype_) {}
  size_t first() const { return static_cast<size_t>(offset) + columns; }  // element index of row 0
  void* get() const { return static_cast<char*>(buffer.get()) + first() * dtype_size(dtype); }
  // values: [rows, columns], rounded to the storage type in place; the guards stay poisoned.
  void upload(std::vector<double>& values) {
    std::vector<double> all = buffer.download();
    std::copy(values.begin(), values.end(), all.begin() + first());
    buffer.upload(all);
    std::copy(all.begin() + first(), all.begin() + first() + values.size(), values.begin());
  }
  std::vector<double> download(bool& guards_poisoned) const {
    const std::vector<double> all = buffer.download();
    const size_t end = first() + static_cast<size_t>(rows) * columns;
    for (size_t i = offset; i < first(); ++i) guards_poisoned = guards_poisoned && std::isnan(all[i]);
    for (size_t i = end; i < end + columns; ++i) guards_poisoned = guards_poisoned && std::isnan(all[i]);
    return std::vector<double>(all.begin() + first(), all.begin() + end);
  }
};

// int32 indices on the device.
class DeviceIndices {
 public:
  explicit DeviceIndices(const std::vector<int32_t>& indices) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<size_t>(indices.size(), 1) * sizeof(int32_t)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, indices.data(), indices.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceIndices() { cudaFree(data_); }
  DeviceIndices(const DeviceIndices&) = delete;
  DeviceIndices& operator=(const DeviceIndices&) = delete;
  const int32_t* get() const { return data_; }

 private:
  int32_t* data_ = nullptr;
};

std::vector<double> random_values(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

// rows_out distinct indices of [0, rows_in), in random order.
std::vector<int32_t> distinct_indices(int rows_in, int rows_out, std::mt19937_64& rng) {
  std::vector<int32_t> all(rows_in);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  return std::vector<int32_t>(all.begin(), all.begin() + rows_out);
}

// Every element equal to the reference, NaN where the reference is NaN; the first few offenders reported.
void expect_exact(const std::vector<double>& out, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(out.size(), ref.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const bool same = std::isnan(ref[i]) ? std::isnan(out[i]) : out[i] == ref[i];
    if (!same) {
      if (bad < 5) ADD_FAILURE() << what << "[" << i << "] = " << out[i] << ", reference " << ref[i];
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": elements that differ, of " << ref.size();
}

// Forward and backward with these indices: each output poisoned, then compared with the reference,
// and its guard rows checked.
void run_and_check(DType dtype, int rows_in, int columns, int offset, const std::vector<int32_t>& indices,
                   std::mt19937_64& rng) {
  const int rows_out = static_cast<int>(indices.size());
  const DeviceIndices device_indices(indices);

  GuardedRows src(rows_in, columns, offset, dtype), dst(rows_out, columns, offset, dtype);
  std::vector<double> src_values = random_values(size_t(rows_in) * columns, rng);
  src.upload(src_values);
  const std::vector<double> expected = reference::gather_rows_forward(src_values, indices, rows_in, columns);
  bool guards = true;
  // Twice: into poison (NaN: every row must be written), then into zeros (the NaN rows of
  // out-of-range indices must be written too).
  for (const bool poisoned : {true, false}) {
    SCOPED_TRACE(poisoned ? "dst poisoned" : "dst zero");
    if (!poisoned) {
      std::vector<double> zeros(size_t(rows_out) * columns, 0.0);
      dst.upload(zeros);
    }
    gather_rows_forward(dtype, src.get(), device_indices.get(), dst.get(), rows_in, rows_out, columns, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_exact(dst.download(guards), expected, "dst");
    EXPECT_TRUE(guards) << "the forward wrote outside dst";
  }

  GuardedRows dy(rows_out, columns, offset, dtype), dsrc(rows_in, columns, offset, dtype);
  std::vector<double> dy_values = random_values(size_t(rows_out) * columns, rng);
  dy.upload(dy_values);
  gather_rows_backward(dtype, dy.get(), device_indices.get(), dsrc.get(), rows_in, rows_out, columns, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  guards = true;
  expect_exact(dsrc.download(guards), reference::gather_rows_backward(dy_values, indices, rows_in, columns), "dsrc");
  EXPECT_TRUE(guards) << "the backward wrote outside dsrc";
}

struct Param {
  DType dtype;
  int rows_in, rows_out, columns;
  int offset;  // elements past 16-byte alignment: 1 forces the element path
};

class GatherRowsTest : public ::testing::TestWithParam<Param> {};

TEST_P(GatherRowsTest, MatchesFloat64Reference) {
  FUSEKIT_REQUIRE_GPU();
  const Param p = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  run_and_check(p.dtype, p.rows_in, p.columns, p.offset, distinct_indices(p.rows_in, p.rows_out, rng), rng);
}

std::vector<Param> params() {
  struct Shape {
    int rows_in, rows_out, columns;
  };
  // One row of one element; no rows out; a permutation; odd widths; widths of exactly one 16-byte
  // vector in fp32 (4) and fp16/bf16 (8); BERT-base's head (batch 32 x 128 tokens, 32 x 19 rows);
  // 769 (a vector path impossible), many short rows.
  const Shape shapes[] = {{1, 1, 1},        {5, 0, 7},      {37, 37, 3},  {64, 17, 4},      {64, 17, 8},
                          {4096, 608, 768}, {333, 77, 769}, {200, 50, 7}, {30001, 4500, 12}};
  std::vector<Param> out;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape s : shapes) out.push_back({dtype, s.rows_in, s.rows_out, s.columns, 0});
    out.push_back({dtype, 1000, 150, 768, 1});  // 16-byte rows, misaligned pointers: the element path
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const Param& p = info.param;
  return std::string(dtype_name(p.dtype)) + "_" + std::to_string(p.rows_in) + "x" + std::to_string(p.rows_out) + "x" +
         std::to_string(p.columns) + (p.offset ? "_misaligned" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, GatherRowsTest, ::testing::ValuesIn(params()), param_name);

// Out-of-range indices among valid ones: NaN rows forward, skipped rows backward, no access outside
// the tensors (the guard rows stay poisoned; compute-sanitizer's memcheck sees the rest).
TEST(GatherRows, OutOfRangeIndicesAreNaNRowsAndNoGradient) {
  FUSEKIT_REQUIRE_GPU();
  std::mt19937_64 rng(std::random_device{}());
  const int rows_in = 50;
  std::vector<int32_t> indices = distinct_indices(rows_in, 20, rng);
  indices[0] = -1;
  indices[5] = rows_in;
  indices[11] = INT_MAX;
  indices[19] = INT_MIN;
  for (const DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (const int columns : {8, 5}) {  // the vector path (fp16, bf16) and the element path
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + std::to_string(columns) + " columns");
      run_and_check(dtype, rows_in, columns, 0, indices, rng);
    }
  }
  // No row to read from: every index is out of range, every row NaN; the backward writes nothing.
  run_and_check(DType::f16, 0, 8, 0, {0, 3}, rng);
}

// The host checks (no GPU needed: they throw before any CUDA call).
TEST(GatherRows, RejectsBadArguments) {
  int32_t* none = nullptr;
  void* p = reinterpret_cast<void*>(16);  // never dereferenced: the calls throw first
  const auto* indices = reinterpret_cast<const int32_t*>(16);
  EXPECT_THROW(gather_rows_forward(DType::f16, p, indices, p, -1, 1, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_forward(DType::f16, p, indices, p, 4, -1, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_forward(DType::f16, p, indices, p, 4, 1, 0, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_forward(DType::f16, p, none, p, 4, 1, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_forward(DType::f16, nullptr, indices, p, 4, 1, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_forward(DType::f16, p, indices, nullptr, 4, 1, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_backward(DType::f16, p, indices, p, 4, 1, -3, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_backward(DType::f16, p, indices, nullptr, 4, 1, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_backward(DType::f16, nullptr, indices, p, 4, 1, 8, nullptr), std::invalid_argument);
  EXPECT_THROW(gather_rows_backward(DType::f16, p, none, p, 4, 1, 8, nullptr), std::invalid_argument);
  // Nothing to do: no rows out forward, no rows at all backward; no pointer is needed.
  EXPECT_NO_THROW(gather_rows_forward(DType::f16, nullptr, nullptr, nullptr, 4, 0, 8, nullptr));
  EXPECT_NO_THROW(gather_rows_backward(DType::f16, nullptr, nullptr, nullptr, 0, 0, 8, nullptr));
}

}  // namespace
}  // namespace fusekit::kernels
