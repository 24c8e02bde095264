#include "kernels/cpu/key_sketch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/fp16.h"

namespace lazykv::cpu {
namespace {

constexpr float kEdgeRounding = 4 * std::numeric_limits<float>::epsilon();

// Cell c of a dimension: [low, high]. The last cell ends at hi exactly, so
// the cells cover [lo, hi] whatever the rounding of lo + 16 s.
float cell_low(float lo, float step, int c) { return lo + float(c) * step; }
float cell_high(float lo, float hi, float step, int c) {
  return c == kKeySketchCells - 1 ? hi : lo + float(c + 1) * step;
}

int cell_of(float x, float lo, float hi) {
  const float step = (hi - lo) / float(kKeySketchCells);
  if (!(step > 0)) return 0;
  int c = std::clamp(int((x - lo) / step), 0, kKeySketchCells - 1);
  // The division can round across a cell edge: settle on the cell whose
  // bounds, computed as the table computes them, hold x.
  while (c > 0 && cell_low(lo, step, c) > x) --c;
  while (c < kKeySketchCells - 1 && cell_high(lo, hi, step, c) < x) ++c;
  return c;
}

}  // namespace

void encode_key_sketch(const uint16_t* keys, int32_t rows, int dim, const float* lo, const float* hi, uint8_t* out) {
  const size_t row_bytes = key_sketch_bytes(dim);
  for (int32_t r = 0; r < rows; ++r) {
    uint8_t* codes = out + size_t(r) * row_bytes;
    std::fill(codes, codes + row_bytes, uint8_t(0));
    for (int d = 0; d < dim; ++d) {
      const int c = cell_of(fp16_to_fp32(keys[size_t(r) * size_t(dim) + size_t(d)]), lo[d], hi[d]);
      codes[d / 2] |= uint8_t(c << (4 * (d % 2)));
    }
  }
}

void key_sketch_table(const float* q, int dim, const float* lo, const float* hi, float* table) {
  for (int d = 0; d < dim; ++d) {
    const float step = (hi[d] - lo[d]) / float(kKeySketchCells);
    // A few ulps of the dimension's magnitude: encode and this table may
    // round a cell edge (or contract it into an FMA) differently, and the
    // bound must hold.
    const float slack = std::abs(q[d]) * (std::abs(lo[d]) + std::abs(hi[d])) * kEdgeRounding;
    for (int c = 0; c < kKeySketchCells; ++c) {
      const float low = step > 0 ? cell_low(lo[d], step, c) : lo[d];
      const float high = step > 0 ? cell_high(lo[d], hi[d], step, c) : hi[d];
      table[size_t(d) * kKeySketchCells + size_t(c)] = std::max(q[d] * low, q[d] * high) + slack;
    }
  }
}

void key_sketch_bounds(const float* table, const uint8_t* sketch, int32_t rows, int dim, float* out) {
  const size_t row_bytes = key_sketch_bytes(dim);
  for (int32_t r = 0; r < rows; ++r) {
    const uint8_t* codes = sketch + size_t(r) * row_bytes;
    float sum = 0;
    for (int d = 0; d < dim; ++d) {
      const int c = (codes[d / 2] >> (4 * (d % 2))) & 0xf;
      sum += table[size_t(d) * kKeySketchCells + size_t(c)];
    }
    out[r] = sum;
  }
}

}  // namespace lazykv::cpu
