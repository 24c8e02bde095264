#include "worker/format/synthetic_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "common/seeded_random.h"
#include "common/thread_pool.h"
#include "kernels/cpu/quant.h"
#include "worker/format/gguf.h"

namespace lazykv {
namespace {

constexpr std::string_view kPrefix = "synth:";
constexpr DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                            DType::kQ4_0, DType::kQ4_1, DType::kQ4_K, DType::kQ6_K};

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

[[noreturn]] void bad_name(const std::string& name, const std::string& why) {
  std::string shapes, types;
  for (const SyntheticShape& s : synthetic_shapes()) shapes += (shapes.empty() ? "" : ", ") + s.name;
  for (DType t : kTypes) types += (types.empty() ? "" : ", ") + lower(std::string(dtype_traits(t).name));
  throw Error(ErrorCode::kInvalidArgument, "synthetic model '" + name + "': " + why +
                                               "; the form is synth:<shape>:<type>[:<seed>], shapes " + shapes +
                                               ", types " + types);
}

// The type a matrix of rows of `cols` is written in: K-quants need whole
// 256-element super-blocks.
DType matrix_type(DType type, int64_t cols) {
  return cols % int64_t(dtype_traits(type).block_elems) == 0 ? type : DType::kQ8_0;
}

// One tensor's values: uniform with the given mean and standard deviation,
// four per draw, from (seed, tensor, row), so any thread count gives the
// same bytes; encoded a row at a time.
struct TensorRecipe {
  std::string name;
  std::vector<int64_t> shape;  // GGUF order: row length first
  DType type;
  float mean, std;
};

void fill_tensor(const TensorRecipe& t, uint64_t seed, ThreadPool& pool, uint8_t* out) {
  const int64_t cols = t.shape[0], rows = t.shape.size() > 1 ? t.shape[1] : 1;
  const size_t row_size = row_bytes(t.type, size_t(cols));
  const uint64_t tensor_seed = seed ^ fnv1a(t.name);
  const float half_width = t.std * std::sqrt(3.0f);
  pool.parallel_for(rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> values(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      uint64_t state = tensor_seed + uint64_t(r) * 0xD1B54A32D192ED03ull;
      for (int64_t i = 0; i < cols; i += 4) {
        uint64_t bits = splitmix64(state);
        for (int64_t j = i; j < std::min(cols, i + 4); ++j, bits >>= 16) {
          const float u = float(bits & 0xFFFF) * (2.0f / 65536.0f) - 1.0f;  // [-1, 1)
          values[size_t(j)] = t.mean + half_width * u;
        }
      }
      cpu::quantize_row(t.type, values.data(), out + size_t(r) * row_size, cols);
    }
  });
}

std::vector<TensorRecipe> recipes(const SyntheticModelSpec& spec) {
  const SyntheticShape& s = spec.shape;
  const int64_t head_dim = s.n_embd / s.n_head, kv_dim = int64_t(s.n_head_kv) * head_dim;
  const auto matrix = [&](std::string name, int64_t rows, int64_t cols) {
    return TensorRecipe{std::move(name), {cols, rows}, matrix_type(spec.type, cols), 0.0f,
                        0.5f / std::sqrt(float(cols))};
  };
  const auto vector = [](std::string name, int64_t n, float mean, float std) {
    return TensorRecipe{std::move(name), {n}, DType::kF32, mean, std};
  };
  std::vector<TensorRecipe> out;
  out.push_back({"token_embd.weight", {s.n_embd, s.n_vocab}, matrix_type(spec.type, s.n_embd), 0.0f, 0.25f});
  out.push_back(vector("output_norm.weight", s.n_embd, 1.0f, 0.1f));
  if (!s.tied_embeddings) out.push_back(matrix("output.weight", s.n_vocab, s.n_embd));
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    out.push_back(vector(b + "attn_norm.weight", s.n_embd, 1.0f, 0.1f));
    out.push_back(matrix(b + "attn_q.weight", s.n_embd, s.n_embd));
    out.push_back(matrix(b + "attn_k.weight", kv_dim, s.n_embd));
    out.push_back(matrix(b + "attn_v.weight", kv_dim, s.n_embd));
    if (s.arch == "qwen2") {
      out.push_back(vector(b + "attn_q.bias", s.n_embd, 0.0f, 0.1f));
      out.push_back(vector(b + "attn_k.bias", kv_dim, 0.0f, 0.1f));
      out.push_back(vector(b + "attn_v.bias", kv_dim, 0.0f, 0.1f));
    }
    out.push_back(matrix(b + "attn_output.weight", s.n_embd, s.n_embd));
    out.push_back(vector(b + "ffn_norm.weight", s.n_embd, 1.0f, 0.1f));
    out.push_back(matrix(b + "ffn_gate.weight", s.n_ff, s.n_embd));
    out.push_back(matrix(b + "ffn_up.weight", s.n_ff, s.n_embd));
    out.push_back(matrix(b + "ffn_down.weight", s.n_embd, s.n_ff));
  }
  return out;
}

}  // namespace

const std::vector<SyntheticShape>& synthetic_shapes() {
  static const std::vector<SyntheticShape> shapes = {
      {"smollm2-135m", "llama", 30, 576, 9, 3, 1536, 49152, 100000.0f, true},
      {"qwen2.5-1.5b", "qwen2", 28, 1536, 12, 2, 8960, 151936, 1000000.0f, true},
      {"llama3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 500000.0f, false},
      {"qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, 1000000.0f, false},
  };
  return shapes;
}

bool is_synthetic_name(std::string_view name) { return name.substr(0, kPrefix.size()) == kPrefix; }

SyntheticModelSpec parse_synthetic_name(const std::string& name) {
  if (!is_synthetic_name(name)) bad_name(name, "not a synthetic model name");
  std::vector<std::string> parts;
  for (size_t at = kPrefix.size(); at <= name.size();) {
    const size_t colon = std::min(name.find(':', at), name.size());
    parts.push_back(name.substr(at, colon - at));
    at = colon + 1;
  }
  if (parts.size() < 2 || parts.size() > 3) bad_name(name, "expected a shape and a type");
  SyntheticModelSpec spec{};
  const auto shape = std::find_if(synthetic_shapes().begin(), synthetic_shapes().end(),
                                  [&](const SyntheticShape& s) { return s.name == lower(parts[0]); });
  if (shape == synthetic_shapes().end()) bad_name(name, "unknown shape '" + parts[0] + "'");
  spec.shape = *shape;
  const auto type = std::find_if(std::begin(kTypes), std::end(kTypes),
                                 [&](DType t) { return lower(std::string(dtype_traits(t).name)) == lower(parts[1]); });
  if (type == std::end(kTypes)) bad_name(name, "unknown type '" + parts[1] + "'");
  spec.type = *type;
  if (parts.size() == 3) {
    size_t used = 0;
    try {
      spec.seed = std::stoull(parts[2], &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != parts[2].size()) bad_name(name, "the seed '" + parts[2] + "' is not a number");
  }
  return spec;
}

TokenizerSpec synthetic_tokenizer(const SyntheticModelSpec& spec, TokenizerSpec base) {
  constexpr int32_t kTypeUnused = 5;  // GGUF token type: never produced, never matched
  if (int64_t(base.tokens.size()) > spec.shape.n_vocab) {
    throw Error(ErrorCode::kInvalidArgument, "synthetic model: the tokenizer's " + std::to_string(base.tokens.size()) +
                                                 " tokens exceed the shape's vocabulary of " +
                                                 std::to_string(spec.shape.n_vocab));
  }
  if (base.token_types.empty()) base.token_types.assign(base.tokens.size(), 1);
  for (int64_t id = int64_t(base.tokens.size()); id < spec.shape.n_vocab; ++id) {
    base.tokens.push_back("<|synth_unused_" + std::to_string(id) + "|>");
    base.token_types.push_back(kTypeUnused);
  }
  return base;
}

void write_synthetic_gguf(const SyntheticModelSpec& spec, const TokenizerSpec& tokenizer, std::FILE* out,
                          const std::string& what, int threads) {
  const SyntheticShape& s = spec.shape;
  GgufWriter w;
  set_model_metadata(w, {s.arch, "synth-" + s.name + "-" + lower(std::string(dtype_traits(spec.type).name)), s.n_layer,
                         32768, s.n_embd, s.n_ff, s.n_head, s.n_head_kv, s.n_embd / s.n_head, s.n_vocab, s.rope_theta,
                         1e-5f, true});
  set_tokenizer_metadata(w, tokenizer);
  ThreadPool pool(threads);
  for (TensorRecipe& t : recipes(spec)) {
    const int64_t rows = t.shape.size() > 1 ? t.shape[1] : 1;
    const size_t bytes = row_bytes(t.type, size_t(t.shape[0])) * size_t(rows);
    std::string name = t.name;
    std::vector<int64_t> shape = t.shape;
    const DType type = t.type;
    w.add_tensor(std::move(name), std::move(shape), type, bytes,
                 [recipe = std::move(t), seed = spec.seed, &pool](uint8_t* data) {
                   fill_tensor(recipe, seed, pool, data);
                 });
  }
  w.write(out, what);
}

}  // namespace lazykv
