// trimkv's retention gates: the gate's arithmetic against a double-precision
// reference, the file checks, and where a model finds its gates.
#include "worker/policy/retention_gates.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>

#include "common/error.h"
#include "common/fp16.h"
#include "common/policy_config.h"
#include "tests/unit/policy/random_gates.h"
#include "tests/unit/temp_dir.h"
#include "worker/format/tiny_model.h"
#include "worker/local_worker.h"
#include "worker/model.h"
#include "worker/policy/policy.h"

namespace lazykv {
namespace {

float value_at(const SafetensorsTensor& t, size_t i) {
  if (t.type == DType::kF32) {
    float v;
    std::memcpy(&v, t.data + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, t.data + 2 * i, 2);
  return t.type == DType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

// log sigmoid(W2 silu(W1 x + b1) + bias), in double, from the file's tensors.
std::vector<double> reference_log_beta(const SafetensorsFile& f, int layer, const float* x, const RandomGatesSpec& s) {
  const std::string p = "layers." + std::to_string(layer) + ".";
  const SafetensorsTensor &w1 = *f.find(p + "w1"), &b1 = *f.find(p + "b1"), &w2 = *f.find(p + "w2"),
                          &bias = *f.find(p + "bias");
  std::vector<double> hidden(size_t(s.n_hidden)), out(size_t(s.n_head_kv));
  for (int i = 0; i < s.n_hidden; ++i) {
    double a = value_at(b1, size_t(i));
    for (int d = 0; d < s.n_embd; ++d) a += double(value_at(w1, size_t(i * s.n_embd + d))) * double(x[d]);
    hidden[size_t(i)] = a / (1.0 + std::exp(-a));
  }
  for (int h = 0; h < s.n_head_kv; ++h) {
    double z = value_at(bias, size_t(h));
    for (int i = 0; i < s.n_hidden; ++i) z += double(value_at(w2, size_t(h * s.n_hidden + i))) * hidden[size_t(i)];
    out[size_t(h)] = -std::log1p(std::exp(-z));
  }
  return out;
}

TEST(RetentionGates, LogBetaMatchesADoublePrecisionReference) {
  TempDir dir;
  ThreadPool pool(2);
  for (const DType type : {DType::kF16, DType::kBF16, DType::kF32}) {
    RandomGatesSpec spec;
    spec.n_layer = 3;
    spec.n_embd = 72;
    spec.n_hidden = 24;
    spec.n_head_kv = 3;
    spec.weights = type;
    const std::string path = dir.file("gates_" + std::to_string(int(type)));
    write_random_gates(path, spec);
    const std::shared_ptr<const RetentionGates> gates = load_retention_gates(path);
    const SafetensorsFile file = SafetensorsFile::open(path);
    RetentionScratch scratch;
    ASSERT_EQ(gates->n_layer, 3);
    ASSERT_EQ(gates->n_embd, 72);
    ASSERT_EQ(gates->n_hidden, 24);
    ASSERT_EQ(gates->n_head_kv, 3);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t n = 19;  // rows: a prefill chunk
    std::vector<float> x(size_t(n * spec.n_embd)), out(size_t(n * spec.n_head_kv));
    for (float& v : x) v = normal(rng);
    for (int layer = 0; layer < spec.n_layer; ++layer) {
      retention_log_beta(*gates, layer, x.data(), n, out.data(), scratch, pool);
      for (int64_t r = 0; r < n; ++r) {
        const std::vector<double> want = reference_log_beta(file, layer, x.data() + r * spec.n_embd, spec);
        for (int h = 0; h < spec.n_head_kv; ++h) {
          const float got = out[size_t(r * spec.n_head_kv + h)];
          EXPECT_LT(got, 0.0f);
          EXPECT_NEAR(got, want[size_t(h)], 1e-5 + 1e-5 * std::fabs(want[size_t(h)]))
              << "layer " << layer << " row " << r << " head " << h;
        }
      }
    }
  }
}

// A gate far into either side of the sigmoid gives 0 and z, never NaN or -inf.
TEST(RetentionGates, SaturatedGatesStayFinite) {
  TempDir dir;
  ThreadPool pool(1);
  for (const float bias : {200.0f, -200.0f}) {
    RandomGatesSpec spec;
    spec.n_layer = 1;
    spec.bias = bias;
    const std::string path = dir.file("gates");
    write_random_gates(path, spec);
    const std::shared_ptr<const RetentionGates> gates = load_retention_gates(path);
    std::vector<float> x(size_t(spec.n_embd), 0.1f), out(size_t(spec.n_head_kv));
    RetentionScratch scratch;
    retention_log_beta(*gates, 0, x.data(), 1, out.data(), scratch, pool);
    for (float v : out) {
      ASSERT_TRUE(std::isfinite(v)) << "bias " << bias;
      if (bias > 0) {
        EXPECT_LE(v, 0.0f);
        EXPECT_GT(v, -1e-30f);
      } else {
        EXPECT_LT(v, -150.0f);
      }
    }
  }
}

// Each defect is a clear error naming the file; a missing file is kNotFound.
TEST(RetentionGates, DefectiveFilesAreNamedErrors) {
  TempDir dir;
  const RandomGatesSpec spec;
  const auto expect_error = [&](const std::vector<SafetensorsTensor>& tensors, const std::string& what) {
    const std::string path = dir.file("bad");
    write_safetensors(path, tensors);
    try {
      load_retention_gates(path);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  std::vector<std::vector<uint8_t>> storage;
  const std::vector<SafetensorsTensor> good = random_gate_tensors(spec, storage);
  auto without = [&](const std::string& name) {
    std::vector<SafetensorsTensor> t;
    for (const SafetensorsTensor& x : good) {
      if (x.name != name) t.push_back(x);
    }
    return t;
  };
  expect_error(without("layers.0.b1"), "no tensor layers.0.b1");
  expect_error(without("layers.1.w2"), "no tensor layers.1.w2");
  expect_error(without("layers.0.w1"), "no tensor layers.0.w1");
  // Layer 1 gone but its tensors' names kept elsewhere: a gap, not a shorter file.
  std::vector<SafetensorsTensor> gap = good;
  for (SafetensorsTensor& t : gap) {
    if (t.name.starts_with("layers.1.")) t.name.replace(0, 8, "layers.2");
  }
  expect_error(gap, "8 tensors where 1 layers have 4");
  std::vector<SafetensorsTensor> misshapen = good;
  misshapen[4].shape = {8, 128};  // layers.1.w1 of 16 x 64 read as 8 x 128
  expect_error(misshapen, "layers.1.w1 has shape [8, 128] where the gates need [16, 64]");
  std::vector<SafetensorsTensor> nan_bias = good;
  std::vector<uint8_t> nan_bytes(8);
  const float nan = std::nanf("");
  std::memcpy(nan_bytes.data() + 4, &nan, 4);
  nan_bias[3].data = nan_bytes.data();
  expect_error(nan_bias, "layers.0.bias holds a value that is not finite");

  std::vector<SafetensorsTensor> inf_weight = good;
  std::vector<uint8_t> inf_bytes(inf_weight[0].data, inf_weight[0].data + inf_weight[0].bytes);
  inf_bytes[2 * 17] = 0x00;  // f16 0x7c00: +inf, in layers.0.w1
  inf_bytes[2 * 17 + 1] = 0x7c;
  inf_weight[0].data = inf_bytes.data();
  expect_error(inf_weight, "layers.0.w1 holds a value that is not finite");

  const std::string text = dir.file("text");
  std::ofstream(text) << "not a safetensors file at all";
  try {
    load_retention_gates(text);
    ADD_FAILURE() << "a text file loaded as gates";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("retention gates " + text), std::string::npos) << e.what();
  }
  try {
    load_retention_gates(dir.file("absent"));
    ADD_FAILURE() << "a missing file loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

// A header of odd length puts every tensor at an odd offset: the gates are
// copied out, so they load and give the same rates as an aligned file.
TEST(RetentionGates, TensorsAtOddOffsetsLoadTheSame) {
  TempDir dir;
  RandomGatesSpec spec;
  spec.weights = DType::kF32;
  const std::string aligned = dir.file("aligned");
  write_random_gates(aligned, spec);
  std::ifstream in(aligned, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  ASSERT_EQ(header % 2, 0u);
  // One more space at the header's end (JSON allows it): the data starts one byte later.
  bytes.insert(bytes.begin() + 8 + std::ptrdiff_t(header), ' ');
  ++header;
  std::memcpy(bytes.data(), &header, 8);
  const std::string odd = dir.file("odd");
  std::ofstream(odd, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  const auto a = load_retention_gates(aligned), b = load_retention_gates(odd);
  for (int l = 0; l < spec.n_layer; ++l) {
    EXPECT_EQ(a->layers[size_t(l)].w1, b->layers[size_t(l)].w1);
    EXPECT_EQ(a->layers[size_t(l)].w2, b->layers[size_t(l)].w2);
  }
}

// Model::load reads the gates beside the model file; gates of another shape
// or none leave trimkv unavailable, saying why.
TEST(RetentionGates, TheModelFindsItsGatesAndTrimkvSaysWhyWithout) {
  TempDir dir;
  TinyModelSpec tiny;
  tiny.n_layer = 2;
  tiny.n_embd = 64;
  tiny.n_head = 4;
  tiny.n_head_kv = 2;
  const std::string path = dir.file("tiny.gguf");
  write_tiny_gguf(path, tiny);

  std::unique_ptr<Model> bare = Model::load(path);
  EXPECT_EQ(bare->retention_gates(), nullptr);
  const std::string why = policy_unavailable("trimkv", policy_shape(*bare, 4));
  EXPECT_NE(why.find("scripts/train_trimkv.sh"), std::string::npos) << why;
  EXPECT_THROW(make_policy(make_policy_config("trimkv", {{"budget", "8"}}), policy_shape(*bare, 4)), Error);

  RandomGatesSpec other;
  other.n_layer = 3;
  write_random_gates(retention_gates_path(path), other);
  std::unique_ptr<Model> mismatched = Model::load(path);
  EXPECT_EQ(mismatched->retention_gates(), nullptr);
  EXPECT_NE(mismatched->retention_gates_missing().find("does not match the model (3 layers"), std::string::npos)
      << mismatched->retention_gates_missing();

  write_random_gates(retention_gates_path(path), RandomGatesSpec{});
  std::unique_ptr<Model> fitted = Model::load(path);
  ASSERT_NE(fitted->retention_gates(), nullptr) << fitted->retention_gates_missing();
  EXPECT_EQ(policy_unavailable("trimkv", policy_shape(*fitted, 4)), "");
  EXPECT_NO_THROW(make_policy(make_policy_config("trimkv", {{"budget", "8"}}), policy_shape(*fitted, 4)));

  // A worker on a GPU lists trimkv as unavailable (its pass hands no layer
  // inputs to the host), so a request naming it is refused before any step.
  const PolicyShape on_gpu = policy_shape_on(ComputeDevice::kCuda, policy_shape(*fitted, 4));
  EXPECT_NE(policy_unavailable("trimkv", on_gpu).find("CPU backend only"), std::string::npos);
  EXPECT_EQ(policy_unavailable("trimkv", policy_shape_on(ComputeDevice::kCpu, policy_shape(*fitted, 4))), "");
}

}  // namespace
}  // namespace lazykv
