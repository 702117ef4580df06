#include "kernels/dtype.h"

namespace fusekit::kernels {

size_t dtype_size(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

}  // namespace fusekit::kernels
