#include "worker/tiers/tier_row_format.h"

#include <array>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/fp16.h"
#include "kernels/cpu/quant.h"

namespace lazykv::tiers {

namespace {

int checked_head_dim(int head_dim) {
  if (head_dim < 1 || head_dim > TierRowFormat::kMaxHeadDim) {
    throw Error(ErrorCode::kInvalidArgument, "tier rows: head_dim " + std::to_string(head_dim) + " is not in [1, " +
                                                 std::to_string(TierRowFormat::kMaxHeadDim) + "]");
  }
  return head_dim;
}

}  // namespace

TierRowFormat::TierRowFormat(int head_dim, bool q8)
    : head_dim_(checked_head_dim(head_dim)),
      type_(q8 && head_dim % cpu::kQK == 0 ? DType::kQ8_0 : DType::kF16),
      row_bytes_(lazykv::row_bytes(type_, size_t(head_dim))) {}

std::string TierRowFormat::name() const { return type_ == DType::kQ8_0 ? "q8_0" : "f16"; }

void TierRowFormat::encode(const uint16_t* f16_row, uint8_t* out) const {
  if (type_ == DType::kF16) {
    std::memcpy(out, f16_row, row_bytes_);
    return;
  }
  std::array<float, kMaxHeadDim> row;  // on the stack: rows are encoded from concurrent layers
  for (int d = 0; d < head_dim_; ++d) row[size_t(d)] = fp16_to_fp32(f16_row[d]);
  cpu::quantize_row(type_, row.data(), out, head_dim_);
}

void TierRowFormat::decode(const uint8_t* row_bytes, uint16_t* f16_out) const {
  if (type_ == DType::kF16) {
    std::memcpy(f16_out, row_bytes, row_bytes_);
    return;
  }
  std::array<float, kMaxHeadDim> row;
  cpu::dequantize_row(type_, row_bytes, row.data(), head_dim_);
  for (int d = 0; d < head_dim_; ++d) f16_out[d] = fp32_to_fp16(row[size_t(d)]);
}

}  // namespace lazykv::tiers
