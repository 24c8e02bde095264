// The exact mode's prefill on AMX tiles. Every f32 operand is split into
// three bf16 parts, x = hi + mid + lo (each the bf16 nearest to what the
// parts before it leave, so together they hold all 24 bits of the
// mantissa), and the tiles accumulate in f32 the six part products down to
// about 2^-26 of the leading one: hi*hi, hi*mid, mid*hi, hi*lo, lo*hi and
// mid*mid. What is left out (mid*lo, lo*mid, lo*lo) is at most about one f32
// rounding of the product and typically 2^-26 of it, so results track the
// f32 panels (matmul_f32.cc) to rounding error, at twelve tile
// products per 16 tokens x 32 rows x 32 columns where the panels need 16384
// FMA lanes.
//
// Layout: tiles of 16 rows of 64 bytes, each kept whole in 1 KiB so that a
// tile loads from consecutive lines. A = activations, [token tile][column
// chunk][part] tiles of 16 tokens x 32 bf16, split by all threads once per
// 512 tokens. B = weights in the tiles' pair layout ([column / 2][row][2]),
// dequantized by each thread for the row blocks of its row group (up to 256
// rows), one pass of 512 columns at a time, and transposed in registers.
// C = [token][row] f32: four tiles (two token tiles x two row blocks) keep
// four products in flight, accumulated across the passes in a per-thread
// buffer, so a pass's weights (768 KiB for 16 row blocks, packed just
// before) stay in L2 while every pair of token tiles runs over them; the
// last pass stores whole tiles straight to y.
#include "kernels/cpu/matmul_amx.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/cpu/quant.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__linux__)
#define LAZYKV_AMX 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace lazykv::cpu {
namespace {

std::atomic<bool> amx_enabled{true};

constexpr int kTileDim = 16;          // tokens or rows of a tile
constexpr int64_t kChunkCols = 32;    // columns per tile product (16 bf16 pairs)
constexpr int kParts = 3;             // hi, mid, lo
constexpr int64_t kRowPair = 32;      // the two row blocks of a tile pass
constexpr int64_t kGroupPairsMax = 8; // row pairs a thread packs at once: 256 rows
constexpr int kBlockChunks = 16;      // columns per pass: 16 x 32 = 512
constexpr int64_t kTokensPerPass = 512;  // bounds the scratch; weights are packed once per pass
constexpr size_t kTileBytes = 1024;   // 16 rows of 64 bytes
// Below this many tokens the few-token kernels or the panels are as fast.
constexpr int64_t kMinTokens = 32;

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

struct Sizes {
  int64_t n_chunks, tokens;  // tokens: one pass's, padded to a pair of tiles
  int64_t n_pairs, n_groups, group_rows;  // row groups: a multiple of the threads, of pairs of row blocks
  size_t act_bytes, packed_bytes, rows_f32_bytes, acc_bytes;
  size_t per_thread() const { return packed_bytes + rows_f32_bytes + acc_bytes; }
};

Sizes sizes_for(const WeightMatrix& w, int64_t batch, int n_threads) {
  Sizes s{};
  s.n_chunks = w.cols / kChunkCols;
  s.tokens = round_up(std::min(batch, kTokensPerPass), 2 * kTileDim);
  s.n_pairs = (w.rows + kRowPair - 1) / kRowPair;
  s.n_groups = n_threads * ((s.n_pairs + n_threads * kGroupPairsMax - 1) / (n_threads * kGroupPairsMax));
  s.group_rows = (s.n_pairs + s.n_groups - 1) / s.n_groups * kRowPair;
  s.act_bytes = size_t(kParts) * size_t(s.tokens) * size_t(w.cols) * 2;
  s.packed_bytes = size_t(s.group_rows / kTileDim) * kBlockChunks * kParts * kTileBytes;  // one pass's
  s.rows_f32_bytes = size_t(kTileDim) * kBlockChunks * kChunkCols * sizeof(float);
  s.acc_bytes = size_t(s.tokens) * size_t(s.group_rows) * sizeof(float);
  return s;
}

#if LAZYKV_AMX
#define LAZYKV_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw")))

bool ask_for_tiles() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = edx & (1u << 24), bf16 = edx & (1u << 22);
  if (!tile || !bf16) return false;
  // Linux hands out the tiles' state on request: ARCH_REQ_XCOMP_PERM for
  // XFEATURE_XTILEDATA, once for the whole process.
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0-3: C; tmm4, tmm5: one activation part of two token tiles; tmm6,
// tmm7: one weight part of two row blocks. All 16 rows of 64 bytes.
LAZYKV_AMX_TARGET void load_tile_config() {
  TileConfig config;
  for (int i = 0; i < 8; ++i) {
    config.colsb[i] = 64;
    config.rows[i] = kTileDim;
  }
  _tile_loadconfig(&config);
}

// 16 floats rounded to the nearest bf16 (ties to even), kept as floats.
LAZYKV_AMX_TARGET inline __m512 round_to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb);
  return _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(int(0xFFFF0000u))));
}

// 32 floats into three vectors of 32 bf16 each, in order: hi, mid, lo.
LAZYKV_AMX_TARGET inline void split_parts(const float* x, __m512i parts[kParts]) {
  alignas(64) static constexpr uint16_t kHighHalves[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                           23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                           45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i high_halves = _mm512_load_si512(kHighHalves);
  __m512 r0 = _mm512_loadu_ps(x), r1 = _mm512_loadu_ps(x + 16);
  for (int p = 0; p < kParts; ++p) {
    const __m512 h0 = round_to_bf16(r0), h1 = round_to_bf16(r1);
    parts[p] = _mm512_permutex2var_epi16(_mm512_castps_si512(h0), high_halves, _mm512_castps_si512(h1));
    r0 = _mm512_sub_ps(r0, h0);  // exact: h holds the leading bits of r
    r1 = _mm512_sub_ps(r1, h1);
  }
}

// r[i] = the 32-bit lanes of column i of the 16x16 matrix whose rows r held.
LAZYKV_AMX_TARGET void transpose_16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4q + c], lane L: element 4L + c of rows 4q .. 4q + 3
  for (int q = 0; q < 4; ++q) {
    const __m512i* tq = t + 4 * q;
    u[4 * q + 0] = _mm512_unpacklo_epi64(tq[0], tq[2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(tq[0], tq[2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(tq[1], tq[3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(tq[1], tq[3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i even01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88);
    const __m512i odd01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i even23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88);
    const __m512i odd23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_i32x4(even01, even23, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(odd01, odd23, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(even01, even23, 0xDD);
    r[12 + c] = _mm512_shuffle_i32x4(odd01, odd23, 0xDD);
  }
}

// Token tiles [begin, end) of x (n_tok tokens, zeros past them) into tiles
// [token tile][chunk][part]: 16 tokens of 32 bf16, so a tile loads from 1 KiB
// in a row. A tile's three parts of a chunk are written together.
LAZYKV_AMX_TARGET void split_activations(const float* x, int64_t cols, int64_t n_tok, int64_t begin, int64_t end,
                                         uint8_t* tiles) {
  const int64_t n_chunks = cols / kChunkCols;
  for (int64_t tile = begin; tile < end; ++tile) {
    uint8_t* first = tiles + size_t(tile) * size_t(n_chunks) * kParts * kTileBytes;
    for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {
      uint8_t* parts_of_chunk = first + size_t(chunk) * kParts * kTileBytes;
      for (int i = 0; i < kTileDim; ++i) {
        const int64_t t = tile * kTileDim + i;
        __m512i parts[kParts];
        if (t < n_tok) {
          split_parts(x + t * cols + chunk * kChunkCols, parts);
        } else {
          for (auto& part : parts) part = _mm512_setzero_si512();
        }
        for (int p = 0; p < kParts; ++p) _mm512_storeu_si512(parts_of_chunk + p * kTileBytes + i * 64, parts[p]);
      }
    }
  }
}

// Columns [32 chunk0, 32 (chunk0 + n_chunks)) of rows [r0, r0 + 16) of w
// (zeros past its last row) into tiles [chunk][part]: [column pair][row]
// 32-bit lanes. chunk0 starts a pass, a whole number of any type's blocks.
LAZYKV_AMX_TARGET void pack_block(const WeightMatrix& w, int64_t r0, int64_t chunk0, int n_chunks, float* rows_f32,
                                  uint8_t* tiles) {
  const int64_t n_cols = n_chunks * kChunkCols;
  const size_t stride = row_bytes(w.type, size_t(w.cols));
  const auto* first = static_cast<const uint8_t*>(w.data) + row_bytes(w.type, size_t(chunk0 * kChunkCols));
  for (int i = 0; i < kTileDim; ++i) {
    float* row = rows_f32 + i * n_cols;
    if (r0 + i < w.rows) {
      dequantize_row(w.type, first + size_t(r0 + i) * stride, row, n_cols);
    } else {
      std::memset(row, 0, size_t(n_cols) * sizeof(float));
    }
  }
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    __m512i lanes[kParts][kTileDim];
    for (int i = 0; i < kTileDim; ++i) {
      __m512i parts[kParts];
      split_parts(rows_f32 + i * n_cols + chunk * kChunkCols, parts);
      for (int p = 0; p < kParts; ++p) lanes[p][i] = parts[p];
    }
    for (int p = 0; p < kParts; ++p) {
      transpose_16x16(lanes[p]);
      uint8_t* tile = tiles + (size_t(chunk) * kParts + p) * kTileBytes;
      for (int pair = 0; pair < kTileDim; ++pair) _mm512_storeu_si512(tile + pair * 64, lanes[p][pair]);
    }
  }
}

// C[token tile][row block] += (one part of two token tiles) x (one part of
// two row blocks): four independent products.
LAZYKV_AMX_TARGET inline void four_products() {
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// C of token tiles t, t + 16 against row blocks 0, 1 (tmm0-3: C[token
// tile][row block]), over n_chunks chunks: from acc (C's [token][row] f32,
// acc_stride bytes a token) unless first, to out. Four C tiles keep four products in
// flight; the parts go lo, mid, hi against the activations' hi so that the
// hi weights are already loaded for the mid activations.
LAZYKV_AMX_TARGET void run_tiles(const uint8_t* act0, const uint8_t* act1, const uint8_t* tiles0,
                                 const uint8_t* tiles1, int n_chunks, float* acc, int64_t acc_stride, bool first,
                                 float* out, int64_t out_stride) {
  const int64_t acc_tile = kTileDim * acc_stride / int64_t(sizeof(float));  // floats to the second token tile
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, acc, acc_stride);
    _tile_loadd(1, acc + kTileDim, acc_stride);
    _tile_loadd(2, acc + acc_tile, acc_stride);
    _tile_loadd(3, acc + acc_tile + kTileDim, acc_stride);
  }
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    const uint8_t* w0 = tiles0 + size_t(chunk) * kParts * kTileBytes;
    const uint8_t* w1 = tiles1 + size_t(chunk) * kParts * kTileBytes;
    const uint8_t* a0 = act0 + size_t(chunk) * kParts * kTileBytes;  // hi, mid, lo
    const uint8_t* a1 = act1 + size_t(chunk) * kParts * kTileBytes;
    _tile_loadd(4, a0, 64);
    _tile_loadd(5, a1, 64);
    _tile_loadd(6, w0 + 2 * kTileBytes, 64);  // lo
    _tile_loadd(7, w1 + 2 * kTileBytes, 64);
    four_products();
    _tile_loadd(6, w0 + kTileBytes, 64);  // mid
    _tile_loadd(7, w1 + kTileBytes, 64);
    four_products();
    _tile_loadd(6, w0, 64);  // hi
    _tile_loadd(7, w1, 64);
    four_products();
    _tile_loadd(4, a0 + kTileBytes, 64);
    _tile_loadd(5, a1 + kTileBytes, 64);
    four_products();  // mid x hi
    _tile_loadd(6, w0 + kTileBytes, 64);
    _tile_loadd(7, w1 + kTileBytes, 64);
    four_products();  // mid x mid
    _tile_loadd(4, a0 + 2 * kTileBytes, 64);
    _tile_loadd(5, a1 + 2 * kTileBytes, 64);
    _tile_loadd(6, w0, 64);
    _tile_loadd(7, w1, 64);
    four_products();  // lo x hi
  }
  const int64_t out_tile = kTileDim * out_stride / int64_t(sizeof(float));
  _tile_stored(0, out, out_stride);
  _tile_stored(1, out + kTileDim, out_stride);
  _tile_stored(2, out + out_tile, out_stride);
  _tile_stored(3, out + out_tile + kTileDim, out_stride);
}

// One thread's row groups for tokens [t0, t0 + n_tok) (act holds them from 0).
LAZYKV_AMX_TARGET void run_groups(const WeightMatrix& w, const Sizes& s, const uint8_t* act, int64_t t0,
                                  int64_t n_tok, float* y, uint8_t* own, int thread, int n_threads) {
  uint8_t* packed = own;
  float* rows_f32 = reinterpret_cast<float*>(own + s.packed_bytes);
  float* acc = reinterpret_cast<float*>(own + s.packed_bytes + s.rows_f32_bytes);
  const size_t tile_bytes = size_t(s.n_chunks) * kParts * kTileBytes;  // a token tile's activations
  const size_t pass_bytes = size_t(kBlockChunks) * kParts * kTileBytes;  // a row block's weights in a pass
  const int64_t acc_stride = s.group_rows * int64_t(sizeof(float));
  const int64_t y_stride = w.rows * int64_t(sizeof(float));
  const int64_t full_tokens = n_tok / (2 * kTileDim) * (2 * kTileDim);  // in whole tile pairs
  load_tile_config();
  for (int64_t g = s.n_groups * thread / n_threads; g < s.n_groups * (thread + 1) / n_threads; ++g) {
    const int64_t pair_begin = s.n_pairs * g / s.n_groups, pair_end = s.n_pairs * (g + 1) / s.n_groups;
    const int64_t r0 = pair_begin * kRowPair;
    const int n_blocks = int(pair_end - pair_begin) * 2;
    const int direct_blocks = int(std::min<int64_t>(n_blocks, (w.rows - r0) / kRowPair * 2));
    for (int64_t c0 = 0; c0 < s.n_chunks; c0 += kBlockChunks) {
      const int n_chunks = int(std::min<int64_t>(kBlockChunks, s.n_chunks - c0));
      for (int b = 0; b < n_blocks; ++b) {
        pack_block(w, r0 + b * kTileDim, c0, n_chunks, rows_f32, packed + b * pass_bytes);
      }
      // The last pass stores whole tile pairs straight to y; the edges go through acc.
      const bool last = c0 + kBlockChunks >= s.n_chunks;
      for (int64_t t = 0; t < n_tok; t += 2 * kTileDim) {
        const uint8_t* a0 = act + size_t(t / kTileDim) * tile_bytes + size_t(c0) * kParts * kTileBytes;
        for (int b = 0; b < n_blocks; b += 2) {
          float* own_acc = acc + t * s.group_rows + b * kTileDim;
          const bool direct = last && t < full_tokens && b < direct_blocks;
          run_tiles(a0, a0 + tile_bytes, packed + b * pass_bytes, packed + (b + 1) * pass_bytes, n_chunks, own_acc,
                    acc_stride, c0 == 0, direct ? y + (t0 + t) * w.rows + r0 + b * kTileDim : own_acc,
                    direct ? y_stride : acc_stride);
        }
      }
    }
    const int64_t row_count = std::min<int64_t>(w.rows - r0, n_blocks * kTileDim);
    for (int64_t t = 0; t < n_tok; ++t) {
      const int64_t from = t < full_tokens ? direct_blocks * kTileDim : 0;
      std::memcpy(y + (t0 + t) * w.rows + r0 + from, acc + t * s.group_rows + from,
                  size_t(std::max<int64_t>(0, row_count - from)) * sizeof(float));
    }
  }
  _tile_release();
}
#endif  // LAZYKV_AMX

}  // namespace

bool amx_bf16_usable() {
#if LAZYKV_AMX
  static const bool usable = ask_for_tiles();
  return usable;
#else
  return false;
#endif
}

void set_amx_enabled(bool enabled) { amx_enabled.store(enabled); }

bool matmul_amx_takes(const WeightMatrix& w, int64_t batch) {
  return batch >= kMinTokens && w.cols > 0 && w.cols % kChunkCols == 0 && amx_enabled.load() && amx_bf16_usable();
}

size_t matmul_amx_scratch_bytes(const WeightMatrix& w, int64_t batch, int n_threads) {
  if (!matmul_amx_takes(w, batch)) return 0;
  const Sizes s = sizes_for(w, batch, std::max(1, n_threads));
  return s.act_bytes + s.per_thread() * size_t(std::max(1, n_threads));
}

void matmul_amx(const WeightMatrix& w, const float* x, int64_t batch, float* y, void* scratch, ThreadPool& pool) {
#if LAZYKV_AMX
  const Sizes s = sizes_for(w, batch, pool.size());
  auto* act = static_cast<uint8_t*>(scratch);
  uint8_t* per_thread = act + s.act_bytes;
  for (int64_t t0 = 0; t0 < batch; t0 += s.tokens) {
    const int64_t n_tok = std::min(s.tokens, batch - t0);
    const int64_t padded = round_up(n_tok, 2 * kTileDim);
    pool.run([&](int thread, int n_threads) {
      const int64_t n_tiles = padded / kTileDim;
      split_activations(x + t0 * w.cols, w.cols, n_tok, n_tiles * thread / n_threads,
                        n_tiles * (thread + 1) / n_threads, act);
    });
    pool.run([&](int thread, int n_threads) {
      run_groups(w, s, act, t0, n_tok, y, per_thread + s.per_thread() * size_t(thread), thread, n_threads);
    });
  }
#else
  (void)w, (void)x, (void)batch, (void)y, (void)scratch, (void)pool;
#endif
}

}  // namespace lazykv::cpu
