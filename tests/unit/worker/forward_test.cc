// The CPU forward pass against an independent, deliberately naive float
// implementation of the same transformer, on tiny random-weight models.
#include "worker/forward.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/quant.h"
#include "tests/unit/temp_dir.h"
#include "worker/format/tiny_model.h"
#include "worker/model.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

// One directory per test process, removed when the process exits.
std::string temp_path(const std::string& name) {
  static const TempDir dir("lazykv_forward_test");
  return dir.file(name);
}

using Matrix = std::vector<float>;  // row-major [rows][cols]

Matrix dequantize(const cpu::WeightMatrix& w) {
  Matrix m(size_t(w.rows * w.cols));
  const size_t rb = row_bytes(w.type, size_t(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    cpu::dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + size_t(r) * rb, m.data() + r * w.cols, w.cols);
  }
  return m;
}

std::vector<float> matvec(const cpu::WeightMatrix& w, const std::vector<float>& x) {
  const Matrix m = dequantize(w);
  std::vector<float> y(size_t(w.rows), 0.0f);
  for (int64_t r = 0; r < w.rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < w.cols; ++c) s += double(m[size_t(r * w.cols + c)]) * x[size_t(c)];
    y[size_t(r)] = float(s);
  }
  return y;
}

std::vector<float> rmsnorm(const std::vector<float>& x, const float* w, float eps) {
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = float(x[i] * inv * w[i]);
  return y;
}

void naive_rope(float* v, const ModelConfig& c, int pos) {
  const int half = c.n_rot / 2;
  for (int i = 0; i < half; ++i) {
    const double theta = pos * std::pow(double(c.rope_theta), -2.0 * i / c.n_rot);
    const int a = c.rope_style == cpu::RopeStyle::kInterleaved ? 2 * i : i;
    const int b = c.rope_style == cpu::RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
    const double x0 = v[a], x1 = v[b];
    v[a] = float(x0 * std::cos(theta) - x1 * std::sin(theta));
    v[b] = float(x0 * std::sin(theta) + x1 * std::cos(theta));
  }
}

// Logits [n_tokens][n_vocab] for a whole sequence, computed from scratch.
std::vector<std::vector<float>> naive_forward(const Model& model, const std::vector<int32_t>& tokens) {
  const ModelConfig& c = model.config();
  const int D = c.head_dim;
  const size_t n = tokens.size();
  const Matrix embd = dequantize(model.token_embd());
  std::vector<std::vector<float>> x(n);
  for (size_t t = 0; t < n; ++t) {
    x[t].assign(embd.begin() + tokens[t] * c.n_embd, embd.begin() + (tokens[t] + 1) * c.n_embd);
  }
  for (const LayerWeights& w : model.layers()) {
    std::vector<std::vector<float>> q(n), k(n), v(n);
    for (size_t t = 0; t < n; ++t) {
      const auto xn = rmsnorm(x[t], w.attn_norm, c.rms_eps);
      q[t] = matvec(w.wq, xn);
      k[t] = matvec(w.wk, xn);
      v[t] = matvec(w.wv, xn);
      for (size_t i = 0; w.bq && i < q[t].size(); ++i) q[t][i] += w.bq[i];
      for (size_t i = 0; w.bk && i < k[t].size(); ++i) k[t][i] += w.bk[i];
      for (size_t i = 0; w.bv && i < v[t].size(); ++i) v[t][i] += w.bv[i];
      for (int h = 0; h < c.n_head; ++h) naive_rope(q[t].data() + h * D, c, int(t));
      for (int h = 0; h < c.n_head_kv; ++h) naive_rope(k[t].data() + h * D, c, int(t));
    }
    for (size_t t = 0; t < n; ++t) {
      std::vector<float> attn(size_t(c.n_head * D), 0.0f);
      for (int h = 0; h < c.n_head; ++h) {
        const int kvh = h / c.n_group();
        std::vector<double> p(t + 1);
        double max = -1e300;
        for (size_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(q[t][size_t(h * D + d)]) * k[s][size_t(kvh * D + d)];
          p[s] = dot / std::sqrt(double(D));
          max = std::max(max, p[s]);
        }
        double z = 0;
        for (double& e : p) z += (e = std::exp(e - max));
        for (size_t s = 0; s <= t; ++s) {
          for (int d = 0; d < D; ++d) attn[size_t(h * D + d)] += float(p[s] / z * v[s][size_t(kvh * D + d)]);
        }
      }
      const auto o = matvec(w.wo, attn);
      for (size_t i = 0; i < o.size(); ++i) x[t][i] += o[i];
      const auto xn = rmsnorm(x[t], w.ffn_norm, c.rms_eps);
      const auto g = matvec(w.w_gate, xn);
      const auto u = matvec(w.w_up, xn);
      std::vector<float> a(g.size());
      for (size_t i = 0; i < g.size(); ++i) a[i] = float(g[i] / (1.0 + std::exp(-double(g[i]))) * u[i]);
      const auto d = matvec(w.w_down, a);
      for (size_t i = 0; i < d.size(); ++i) x[t][i] += d[i];
    }
  }
  std::vector<std::vector<float>> logits(n);
  for (size_t t = 0; t < n; ++t) logits[t] = matvec(model.output(), rmsnorm(x[t], model.output_norm(), c.rms_eps));
  return logits;
}

float max_abs_diff(std::span<const float> a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

KvCacheConfig cache_config(const Model& m) {
  const ModelConfig& c = m.config();
  return {c.n_layer, c.n_head_kv, c.head_dim, 4, 0};  // small pages: attention crosses page boundaries
}

const std::vector<int32_t> kTokens = {1, 40, 75, 120, 3, 200, 99, 12, 250, 7, 8, 180};

struct Case {
  std::string arch;
  DType type;
  int n_embd;
  int n_ff;
  float tolerance;  // relative to the largest logit
};

class ForwardVsNaive : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardVsNaive, AllLogitsMatch) {
  const Case& p = GetParam();
  TinyModelSpec spec;
  spec.arch = p.arch;
  spec.weight_type = p.type;
  spec.n_embd = p.n_embd;
  spec.n_ff = p.n_ff;
  spec.n_head = 4;
  spec.n_head_kv = 2;
  const std::string path = temp_path(p.arch + "_" + std::string(dtype_traits(p.type).name) + ".gguf");
  write_tiny_gguf(path, spec);
  const auto model = Model::load(path);
  ThreadPool pool(2);
  KvCache cache(cache_config(*model));
  ForwardPass fp(*model, cache, pool);
  cache.add_sequence(0);
  BatchItem item{0, kTokens, 0, true};
  const auto logits = fp.run({&item, 1});
  const auto expected = naive_forward(*model, kTokens);
  const size_t V = size_t(model->config().n_vocab);
  for (size_t t = 0; t < kTokens.size(); ++t) {
    const float scale = std::max(1.0f, max_abs(expected[t]));
    EXPECT_LT(max_abs_diff(logits.subspan(t * V, V), expected[t]), p.tolerance * scale) << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    TinyModels, ForwardVsNaive,
    ::testing::Values(Case{"llama", DType::kF32, 64, 128, 2e-3f}, Case{"qwen2", DType::kF32, 64, 128, 2e-3f},
                      Case{"llama", DType::kF16, 64, 128, 2e-3f}, Case{"llama", DType::kBF16, 64, 128, 2e-3f},
                      Case{"llama", DType::kQ8_0, 64, 128, 2e-2f}, Case{"llama", DType::kQ4_0, 64, 128, 3e-2f},
                      Case{"llama", DType::kQ4_1, 64, 128, 3e-2f}, Case{"qwen2", DType::kQ4_K, 256, 512, 3e-2f},
                      Case{"llama", DType::kQ6_K, 256, 512, 3e-2f}),
    [](const auto& info) { return info.param.arch + "_" + std::string(dtype_traits(info.param.type).name); });

TEST(Forward, GgufAndHfDirectoryGiveTheSameLogits) {
  for (const std::string arch : {"llama", "qwen2"}) {
    TinyModelSpec spec;
    spec.arch = arch;
    spec.tied_embeddings = arch == "llama";
    const std::string gguf = temp_path(arch + "_eq.gguf");
    const std::string dir = temp_path(arch + "_eq_hf");
    write_tiny_gguf(gguf, spec);
    write_tiny_hf_dir(dir, spec, /*sharded=*/arch == "qwen2");
    const auto a = Model::load(gguf);
    const auto b = Model::load(dir);
    EXPECT_NE(a->config().rope_style == cpu::RopeStyle::kInterleaved, arch == "qwen2");
    EXPECT_EQ(b->config().rope_style, cpu::RopeStyle::kNeox);
    ThreadPool pool(1);
    KvCache ca(cache_config(*a)), cb(cache_config(*b));
    ForwardPass fa(*a, ca, pool), fb(*b, cb, pool);
    ca.add_sequence(0);
    cb.add_sequence(0);
    BatchItem item{0, kTokens, 0, true};
    const auto la = fa.run({&item, 1});
    const std::vector<float> copy(la.begin(), la.end());
    const auto lb = fb.run({&item, 1});
    EXPECT_LT(max_abs_diff(lb, copy), 1e-4f * std::max(1.0f, max_abs(copy))) << arch;
  }
}

// Batched, chunked and incremental runs of the same sequences agree.
TEST(Forward, BatchingAndChunkingDoNotChangeResults) {
  TinyModelSpec spec;
  spec.weight_type = DType::kQ8_0;
  const std::string path = temp_path("batch.gguf");
  write_tiny_gguf(path, spec);
  const auto model = Model::load(path);
  const size_t V = size_t(model->config().n_vocab);
  ThreadPool pool(2);
  const std::vector<int32_t> a = {5, 6, 7, 8, 9, 10, 11};
  const std::vector<int32_t> b = {100, 101, 102};

  // Reference: each sequence alone, whole prompt at once.
  auto alone = [&](const std::vector<int32_t>& toks) {
    KvCache cache(cache_config(*model));
    ForwardPass fp(*model, cache, pool);
    cache.add_sequence(0);
    BatchItem item{0, toks, 0, false};
    const auto l = fp.run({&item, 1});
    return std::vector<float>(l.begin(), l.end());
  };
  const auto ref_a = alone(a);
  const auto ref_b = alone(b);

  // Both in one batch: a's prompt in two chunks (3 + 4), b whole.
  KvCache cache(cache_config(*model));
  ForwardPass fp(*model, cache, pool);
  cache.add_sequence(1);
  cache.add_sequence(2);
  const std::span<const int32_t> sa(a);
  BatchItem first{1, sa.subspan(0, 3), 0, false};
  fp.run({&first, 1});
  std::vector<BatchItem> batch = {{1, sa.subspan(3), 3, false}, {2, b, 0, false}};
  const auto l = fp.run(batch);
  EXPECT_LT(max_abs_diff(l.subspan(0, V), ref_a), 1e-3f);
  EXPECT_LT(max_abs_diff(l.subspan(V, V), ref_b), 1e-3f);

  // Token by token decode of b in another cache gives the same final logits.
  KvCache cache2(cache_config(*model));
  ForwardPass fp2(*model, cache2, pool);
  cache2.add_sequence(0);
  std::vector<float> last;
  for (size_t t = 0; t < b.size(); ++t) {
    BatchItem step{0, {&b[t], 1}, int32_t(t), false};
    const auto lt = fp2.run({&step, 1});
    last.assign(lt.begin(), lt.end());
  }
  EXPECT_LT(max_abs_diff(last, ref_b), 1e-3f);
}

TEST(Forward, RejectsTokensOutsideTheVocabulary) {
  const std::string path = temp_path("vocab.gguf");
  write_tiny_gguf(path, TinyModelSpec{});
  const auto model = Model::load(path);
  ThreadPool pool(1);
  KvCache cache(cache_config(*model));
  ForwardPass fp(*model, cache, pool);
  cache.add_sequence(0);
  const std::vector<int32_t> bad = {1, model->config().n_vocab};
  BatchItem item{0, bad, 0, false};
  EXPECT_THROW(fp.run({&item, 1}), Error);
  EXPECT_EQ(cache.n_slots(0, 0, 0), 0);
}

}  // namespace
}  // namespace lazykv

namespace lazykv {
namespace {

std::unique_ptr<Model> tiny_model(const std::string& name) {
  const std::string path = temp_path(name);
  write_tiny_gguf(path, TinyModelSpec{});
  return Model::load(path);
}

TEST(Forward, RejectsASequenceTwiceInOneBatchAndHandlesEmptyBatches) {
  const auto model = tiny_model("dup.gguf");
  ThreadPool pool(2);
  KvCache cache(cache_config(*model));
  ForwardPass fp(*model, cache, pool);
  cache.add_sequence(0);
  const std::vector<int32_t> a = {5, 6}, b = {7};
  const std::vector<BatchItem> batch = {{0, a, 0, false}, {0, b, 2, false}};
  EXPECT_THROW(fp.run(batch), Error);
  EXPECT_EQ(cache.n_slots(0, 0, 0), 0);
  EXPECT_TRUE(fp.run({}).empty());
}

// Heads compact independently; attention must size its buffers by the
// largest head, not by layer 0 head 0.
TEST(Forward, UnevenlyCompactedHeadsStayCorrect) {
  const auto model = tiny_model("uneven.gguf");
  ThreadPool pool(2);
  KvCache cache(cache_config(*model));
  ForwardPass fp(*model, cache, pool);
  cache.add_sequence(0);
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + i);
  BatchItem item{0, prompt, 0, false};
  fp.run({&item, 1});
  const std::vector<int32_t> keep = {0, 39};
  cache.compact(0, 0, 0, keep);  // layer 0, head 0 keeps 2 of 40
  const int32_t next = 50;
  item = BatchItem{0, {&next, 1}, 40, false};
  const auto logits = fp.run({&item, 1});
  for (float l : logits) ASSERT_TRUE(std::isfinite(l));
  EXPECT_EQ(cache.n_slots(0, 0, 0), 3);
  EXPECT_EQ(cache.n_slots(0, 1, 1), 41);
}

}  // namespace
}  // namespace lazykv
