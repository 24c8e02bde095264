#include "common/dtype.h"

#include "common/error.h"

namespace lazykv {
namespace {

// Block layouts are the GGML ones (see kernels/cpu/quant.h for the structs).
constexpr DTypeTraits kF32{"F32", 1, 4};
constexpr DTypeTraits kF16{"F16", 1, 2};
constexpr DTypeTraits kBF16{"BF16", 1, 2};
constexpr DTypeTraits kQ4_0{"Q4_0", 32, 2 + 16};
constexpr DTypeTraits kQ4_1{"Q4_1", 32, 2 + 2 + 16};
constexpr DTypeTraits kQ8_0{"Q8_0", 32, 2 + 32};
constexpr DTypeTraits kQ8_1{"Q8_1", 32, 2 + 2 + 32};
constexpr DTypeTraits kQ4_K{"Q4_K", 256, 2 + 2 + 12 + 128};
constexpr DTypeTraits kQ6_K{"Q6_K", 256, 128 + 64 + 16 + 2};
constexpr DTypeTraits kQ8_K{"Q8_K", 256, 4 + 256 + 32};

}  // namespace

std::optional<DType> dtype_from_id(uint32_t id) {
  switch (static_cast<DType>(id)) {
    case DType::kF32: case DType::kF16: case DType::kBF16: case DType::kQ4_0:
    case DType::kQ4_1: case DType::kQ8_0: case DType::kQ8_1: case DType::kQ4_K:
    case DType::kQ6_K: case DType::kQ8_K:
      return static_cast<DType>(id);
  }
  return std::nullopt;
}

const DTypeTraits& dtype_traits(DType type) {
  switch (type) {
    case DType::kF32: return kF32;
    case DType::kF16: return kF16;
    case DType::kBF16: return kBF16;
    case DType::kQ4_0: return kQ4_0;
    case DType::kQ4_1: return kQ4_1;
    case DType::kQ8_0: return kQ8_0;
    case DType::kQ8_1: return kQ8_1;
    case DType::kQ4_K: return kQ4_K;
    case DType::kQ6_K: return kQ6_K;
    case DType::kQ8_K: return kQ8_K;
  }
  throw Error(ErrorCode::kInternal, "dtype_traits: unknown dtype");
}

}  // namespace lazykv
