// Tensor element types. The numeric values are the GGML type ids used in GGUF
// files, so a file's type field maps directly onto this enum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lazykv {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kQ8_1 = 9,   // activations only
  kQ4_K = 12,
  kQ6_K = 14,
  kQ8_K = 15,  // activations only
  kBF16 = 30,
};

struct DTypeTraits {
  std::string_view name;
  size_t block_elems;  // elements per quantization block (1 for float types)
  size_t block_bytes;  // bytes per block
};

// nullopt for ids this build does not support.
std::optional<DType> dtype_from_id(uint32_t id);
const DTypeTraits& dtype_traits(DType type);

// Bytes of a row of n elements; n must be a multiple of block_elems.
inline size_t row_bytes(DType type, size_t n) {
  const DTypeTraits& t = dtype_traits(type);
  return n / t.block_elems * t.block_bytes;
}

}  // namespace lazykv
