// How a demoted K or V row travels to the tiers and is stored there: Q8_0
// (32 values to one f16 scale and 32 int8: 34 bytes, about half of f16)
// when the head dimension is a multiple of 32 and the policy asks for it,
// else the cache's own f16, bit for bit. The kvstore never looks inside a
// row: it only needs row_bytes() to gather the rows a fetch names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace lazykv::tiers {

class TierRowFormat {
 public:
  static constexpr int kMaxHeadDim = 1024;
  // Error(kInvalidArgument) if head_dim is not in [1, kMaxHeadDim].
  TierRowFormat(int head_dim, bool q8);
  size_t row_bytes() const { return row_bytes_; }
  std::string name() const;  // "q8_0" or "f16"
  void encode(const uint16_t* f16_row, uint8_t* out) const;
  void decode(const uint8_t* row, uint16_t* f16_out) const;

 private:
  int head_dim_;
  DType type_;
  size_t row_bytes_;
};

}  // namespace lazykv::tiers
