// Key sketches for lazy+tiers' promotion probe: a demoted key row kept on the
// worker as 4 bits per dimension, relative to its block's per-dimension range
// [lo_d, hi_d]. Code c places the key in the cell
// [lo_d + c s_d, lo_d + (c + 1) s_d] with s_d = (hi_d - lo_d) / 16, so
// sum_d max(q_d a_d, q_d b_d) over the cells bounds q.k from above: Quest's
// bound over a box 16 times narrower per dimension, tight enough per row to
// fetch only the rows whose logit may reach the hit level. Stateless.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lazykv::cpu {

inline constexpr int kKeySketchCells = 16;

// Bytes of one row's sketch (two dimensions per byte).
inline size_t key_sketch_bytes(int dim) { return size_t(dim + 1) / 2; }

// Encodes `rows` f16 keys ([rows][dim]) within lo/hi ([dim], covering every
// key) into out ([rows][key_sketch_bytes(dim)]); every key lies in its cell.
void encode_key_sketch(const uint16_t* keys, int32_t rows, int dim, const float* lo, const float* hi, uint8_t* out);

// The per-(dimension, code) terms of the bound for one query: table
// [dim][kKeySketchCells], table[d][c] = max(q_d a, q_d b) over cell c of d.
void key_sketch_table(const float* q, int dim, const float* lo, const float* hi, float* table);

// Upper bound of q.k for each sketched row, from key_sketch_table's table.
void key_sketch_bounds(const float* table, const uint8_t* sketch, int32_t rows, int dim, float* out);

}  // namespace lazykv::cpu
