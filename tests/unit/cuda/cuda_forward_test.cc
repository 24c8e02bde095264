// The CUDA forward pass against the CPU one on tiny random models: the same
// batches give the same logits (to float rounding) and the same greedy tokens,
// with weights the device reads in place and weights it converts, mixed
// prefill and decode batches, evicting policies (their compactions rewrite
// pages the device mirrors), GQA expanded per query head, remembered queries,
// tensor-parallel ranks over Gloo, and decode steps replayed as CUDA graphs.
// Skipped where no CUDA device is usable.
#include "worker/cuda/cuda_forward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../parallel/parallel_test_util.h"
#include "../tiny_model_fixture.h"
#include "common/error.h"
#include "kernels/cuda/ops.h"
#include "worker/compute_device.h"
#include "worker/policy/policy.h"

namespace lazykv {
namespace {

class CudaForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::cuda_device_available()) GTEST_SKIP() << "no CUDA device: the CUDA forward pass is not exercised";
  }
};

int32_t argmax(std::span<const float> row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + (i * 37 + salt * 11) % 200);
  return p;
}

struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // every step's row, concatenated
  int64_t evicted = 0;
};

// A prompt then n greedy tokens of one sequence on `device`, under `policy`
// (null: none), through one rank of `group`.
Generation generate(ComputeDevice device, const Model& model, TensorParallelGroup& group, const PolicyConfig* policy,
                    const std::vector<int32_t>& prompt, int n,
                    cpu::ActivationPrecision precision = cpu::ActivationPrecision::kF32) {
  ModelShard shard(model, group.rank(), group.world());
  const ModelConfig& c = shard.config();
  KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 16, 0});
  ThreadPool pool(2);
  const auto pass = make_forward_backend(device, 0, shard, group, cache, pool, precision);
  std::unique_ptr<EvictionPolicy> p;
  if (policy != nullptr) {
    PolicyShape shape = policy_shape(c, int32_t(prompt.size()), int32_t(prompt.size()) + n);
    p = make_policy(*policy, shape);
  }
  cache.add_sequence(1, p ? p->heads_per_layer() : 0);
  Generation g;
  BatchItem item{1, prompt, 0, false, p.get()};
  std::span<const float> logits = pass->run({&item, 1});
  int32_t pos = int32_t(prompt.size());
  for (int i = 0; i < n; ++i) {
    g.logits.insert(g.logits.end(), logits.begin(), logits.end());
    g.tokens.push_back(argmax(logits));
    BatchItem next{1, {&g.tokens.back(), 1}, pos++, false, p.get()};
    logits = pass->run({&next, 1});
  }
  if (p) g.evicted = p->evicted_slots();
  return g;
}

Generation generate(ComputeDevice device, const Model& model, const PolicyConfig* policy,
                    const std::vector<int32_t>& prompt, int n,
                    cpu::ActivationPrecision precision = cpu::ActivationPrecision::kF32) {
  SoloGroup solo;
  return generate(device, model, solo, policy, prompt, n, precision);
}

void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, float tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  float worst = 0;
  for (size_t i = 0; i < expected.size(); ++i) worst = std::max(worst, std::abs(actual[i] - expected[i]));
  EXPECT_LT(worst, tolerance);
}

TinyModelSpec spec(DType type, const std::string& arch = "llama") {
  TinyModelSpec s;
  s.arch = arch;
  s.n_embd = 128;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 256;
  s.n_layer = 2;
  s.weight_type = type;
  return s;
}

// One greedy generation on each device, compared.
void expect_like_the_cpu(const TinyModelSpec& s, int prompt_len, int n, float tolerance) {
  SCOPED_TRACE(std::string(dtype_traits(s.weight_type).name) + " " + s.arch);
  TinyModel m = load_tiny_model("cuda_fwd_" + s.arch, s);
  const auto prompt = prompt_of(prompt_len, int(s.weight_type));
  const Generation cpu_run = generate(ComputeDevice::kCpu, *m.model, nullptr, prompt, n);
  const Generation gpu_run = generate(ComputeDevice::kCuda, *m.model, nullptr, prompt, n);
  EXPECT_EQ(gpu_run.tokens, cpu_run.tokens);
  expect_close(gpu_run.logits, cpu_run.logits, tolerance);
}

TEST_F(CudaForwardTest, WeightsReadInPlaceGiveTheCpuLogits) {
  for (DType type : {DType::kQ8_0, DType::kQ4_1, DType::kF16}) expect_like_the_cpu(spec(type), 21, 24, 2e-3f);
}

TEST_F(CudaForwardTest, ConvertedWeightsAndBiasesStayClose) {
  // F32 matrices become F16 on the device: close, not equal. BF16 keeps its
  // bits (tiled), here under the same bound, with Qwen2's biases.
  for (DType type : {DType::kF32, DType::kBF16}) expect_like_the_cpu(spec(type, "qwen2"), 17, 16, 5e-2f);
}

// A 300-token prompt: its GEMMs on f16 inputs and its attention on the
// tensor cores (PrefillAttention, from 256 tokens), whose f16 queries and
// probabilities leave about 1e-3 of each term; the logits after it within
// the bound the converted weights get.
TEST_F(CudaForwardTest, LongPromptOnTheTensorCoresStaysClose) {
  TinyModelSpec s = spec(DType::kQ8_0);
  s.n_ctx = 512;
  TinyModel m = load_tiny_model("cuda_fwd_long", s);
  const auto prompt = prompt_of(300, 12);
  const Generation cpu_run = generate(ComputeDevice::kCpu, *m.model, nullptr, prompt, 1);
  const Generation gpu_run = generate(ComputeDevice::kCuda, *m.model, nullptr, prompt, 1);
  expect_close(gpu_run.logits, cpu_run.logits, 5e-2f);
}

// int8 activations: the first logits (after the prompt, so no earlier token
// differs) no further from the exact f32 ones than the CPU's own int8 mode
// is (3x its largest error: the GPU keeps each block's scale in f32 where
// the CPU's Q8_0/Q8_1 round it to f16, so both quantize a little
// differently); a wrong scale or layout lands far outside. And not the f32
// logits: the int8 kernels ran.
TEST_F(CudaForwardTest, Int8ActivationsAreAsCloseToF32AsTheCpuInt8Pass) {
  for (DType type : {DType::kQ8_0, DType::kQ4_1}) {
    SCOPED_TRACE(dtype_traits(type).name);
    TinyModel m = load_tiny_model("cuda_fwd_int8", spec(type));
    const auto prompt = prompt_of(19, int(type));
    const auto int8 = cpu::ActivationPrecision::kInt8;
    const Generation cpu_f32 = generate(ComputeDevice::kCpu, *m.model, nullptr, prompt, 1);
    const Generation cpu_int8 = generate(ComputeDevice::kCpu, *m.model, nullptr, prompt, 1, int8);
    const Generation gpu_int8 = generate(ComputeDevice::kCuda, *m.model, nullptr, prompt, 1, int8);
    const Generation gpu_f32 = generate(ComputeDevice::kCuda, *m.model, nullptr, prompt, 1);
    float cpu_error = 0, gpu_error = 0;
    for (size_t i = 0; i < cpu_f32.logits.size(); ++i) {
      cpu_error = std::max(cpu_error, std::abs(cpu_int8.logits[i] - cpu_f32.logits[i]));
      gpu_error = std::max(gpu_error, std::abs(gpu_int8.logits[i] - cpu_f32.logits[i]));
    }
    EXPECT_GT(cpu_error, 0.0f);
    EXPECT_LT(gpu_error, 3 * cpu_error + 1e-3f) << "cpu int8 error " << cpu_error;
    EXPECT_NE(gpu_int8.logits, gpu_f32.logits);
  }
}

// Two sequences in one pass: one prefills a chunk with every row's logits
// while the other decodes, then both decode together.
TEST_F(CudaForwardTest, MixedPrefillAndDecodeBatches) {
  TinyModel m = load_tiny_model("cuda_fwd_mixed", spec(DType::kQ8_0));
  std::vector<std::vector<float>> results[2];
  for (ComputeDevice device : {ComputeDevice::kCpu, ComputeDevice::kCuda}) {
    ModelShard shard(*m.model, 0, 1);
    SoloGroup solo;
    const ModelConfig& c = shard.config();
    KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 16, 0});
    ThreadPool pool(2);
    const auto pass = make_forward_backend(device, 0, shard, solo, cache, pool, cpu::ActivationPrecision::kF32);
    cache.add_sequence(1);
    cache.add_sequence(2);
    const auto a = prompt_of(30, 3), b1 = prompt_of(12, 4), b2 = prompt_of(9, 5);
    auto& out = results[device == ComputeDevice::kCuda ? 1 : 0];
    BatchItem first{1, a, 0, false};
    auto logits = pass->run({&first, 1});
    int32_t next = argmax(logits);
    std::vector<BatchItem> mixed{{1, {&next, 1}, 30, false}, {2, b1, 0, true}};
    logits = pass->run(mixed);
    out.emplace_back(logits.begin(), logits.end());
    int32_t next_a = argmax(logits.first(size_t(c.n_vocab)));
    std::vector<BatchItem> mixed2{{2, b2, 12, false}, {1, {&next_a, 1}, 31, false}};
    logits = pass->run(mixed2);
    out.emplace_back(logits.begin(), logits.end());
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) expect_close(results[1][i], results[0][i], 2e-3f);
}

// Evicting policies: compaction on the host rewrites pages, which must reach
// the device before the next attention. Tokens and evictions agree with the
// CPU pass step for step.
TEST_F(CudaForwardTest, EvictingPoliciesMatchTheCpuPass) {
  TinyModel m = load_tiny_model("cuda_fwd_policy", spec(DType::kQ8_0));
  const std::vector<PolicyConfig> policies{
      make_policy_config("lazy", {{"budget", "24"}, {"window", "8"}}),
      make_policy_config("lazy", {{"budget", "24"}, {"window", "8"}, {"per_query_head", "1"}}),
      make_policy_config("h2o", {{"budget", "24"}}),
      make_policy_config("tova", {{"budget", "24"}}),
      make_policy_config("snapkv", {{"budget", "24"}, {"window", "8"}, {"period", "16"}}),
      make_policy_config("rkv", {{"budget", "24"}, {"window", "4"}, {"period", "16"}}),
      make_policy_config("raas", {{"budget", "24"}}),
      make_policy_config("caote", {{"budget", "24"}, {"recent", "8"}}),
      make_policy_config("obcache", {{"budget", "24"}, {"recent", "8"}}),
      make_policy_config("streaming", {{"budget", "24"}}),
      // Its sentences' penalties come from the hidden rows the pass downloads.
      make_policy_config("skipkv", {{"budget", "24"}, {"window", "4"}, {"period", "16"}, {"max_sentence", "5"},
                                    {"tau", "0.5"}}),
  };
  const auto prompt = prompt_of(40, 6);
  for (const PolicyConfig& policy : policies) {
    SCOPED_TRACE(policy.to_string());
    const Generation cpu_run = generate(ComputeDevice::kCpu, *m.model, &policy, prompt, 40);
    const Generation gpu_run = generate(ComputeDevice::kCuda, *m.model, &policy, prompt, 40);
    EXPECT_GT(cpu_run.evicted, 0);
    EXPECT_EQ(gpu_run.evicted, cpu_run.evicted);
    EXPECT_EQ(gpu_run.tokens, cpu_run.tokens);
    expect_close(gpu_run.logits, cpu_run.logits, 2e-3f);
  }
}

// Two ranks on the one device, joined over Gloo (the host all-reduce path):
// the same tokens as one rank on the device.
TEST_F(CudaForwardTest, TwoRanksOverGlooEqualOneRank) {
  TinyModel m = load_tiny_model("cuda_fwd_tp", spec(DType::kQ8_0));
  const auto prompt = prompt_of(25, 7);
  const Generation one = generate(ComputeDevice::kCuda, *m.model, nullptr, prompt, 24);
  std::mutex mutex;
  std::vector<Generation> per_rank(2);
  run_ranks(2, [&](TensorParallelGroup& group) {
    Generation g = generate(ComputeDevice::kCuda, *m.model, group, nullptr, prompt, 24);
    std::lock_guard<std::mutex> lock(mutex);
    per_rank[size_t(group.rank())] = std::move(g);
  });
  for (const Generation& g : per_rank) {
    EXPECT_EQ(g.tokens, one.tokens);
    expect_close(g.logits, one.logits, 2e-3f);
  }
}

// CUDA graphs: decode steps replayed from captured graphs give the logits of
// the same pass launching kernel by kernel, bit for bit (attention launches
// are sized by slot bucket either way), as a sequence crosses a bucket (256
// slots) and the batch changes from two sequences to one and back; every
// decode step replayed, in both precisions.
TEST_F(CudaForwardTest, GraphReplaysGiveTheLaunchedLogits) {
  TinyModel m = load_tiny_model("cuda_fwd_graphs", spec(DType::kQ4_1));
  for (auto precision : {cpu::ActivationPrecision::kF32, cpu::ActivationPrecision::kInt8}) {
    SCOPED_TRACE(precision == cpu::ActivationPrecision::kInt8 ? "int8" : "f32");
    std::vector<float> results[2];
    for (bool graphs : {false, true}) {
      ModelShard shard(*m.model, 0, 1);
      SoloGroup solo;
      const ModelConfig& c = shard.config();
      KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 16, 0});
      ThreadPool pool(2);
      CudaForwardPass pass(shard, solo, cache, pool, 0, precision, graphs);
      cache.add_sequence(1);
      cache.add_sequence(2);
      const auto long_prompt = prompt_of(250, 10), short_prompt = prompt_of(40, 11);
      BatchItem first{1, long_prompt, 0, false};
      int32_t next[2] = {argmax(pass.run({&first, 1})), 0};
      BatchItem second{2, short_prompt, 0, false};
      next[1] = argmax(pass.run({&second, 1}));
      int32_t pos[2] = {250, 40};
      const int steps = 12;
      for (int step = 0; step < steps; ++step) {
        const bool both = step % 3 != 1;
        std::vector<BatchItem> batch{{1, {&next[0], 1}, pos[0], false}};
        if (both) batch.push_back({2, {&next[1], 1}, pos[1], false});
        const std::span<const float> logits = pass.run(batch);
        results[graphs].insert(results[graphs].end(), logits.begin(), logits.end());
        for (size_t i = 0; i < batch.size(); ++i) {
          next[i] = argmax(logits.subspan(i * size_t(c.n_vocab), size_t(c.n_vocab)));
          ++pos[i];
        }
      }
      // Every decode step; neither prompt.
      EXPECT_EQ(pass.graph_replays(), graphs ? size_t(steps) : 0u);
    }
    EXPECT_EQ(results[1], results[0]);
  }
}

TEST_F(CudaForwardTest, BadInputIsRefusedAndTheCacheStaysUsable) {
  TinyModel m = load_tiny_model("cuda_fwd_bad", spec(DType::kQ8_0));
  ModelShard shard(*m.model, 0, 1);
  SoloGroup solo;
  const ModelConfig& c = shard.config();
  KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 16, 16 * 1024});  // a few pages
  ThreadPool pool(1);
  CudaForwardPass pass(shard, solo, cache, pool, 0);
  EXPECT_GT(pass.weight_bytes(), 0u);
  cache.add_sequence(1);
  const std::vector<int32_t> bad{1, c.n_vocab};
  BatchItem item{1, bad, 0, false};
  EXPECT_THROW(pass.run({&item, 1}), Error);
  const auto huge = prompt_of(4000, 8);
  BatchItem too_long{1, huge, 0, false};
  try {
    pass.run({&too_long, 1});
    ADD_FAILURE() << "a prompt over the KV capacity ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
  }
  const auto ok = prompt_of(8, 9);
  BatchItem fine{1, ok, 0, false};
  EXPECT_EQ(pass.run({&fine, 1}).size(), size_t(c.n_vocab));
  // Feeding a position the sequence already caches: refused, nothing changed.
  BatchItem again{1, ok, 4, false};
  try {
    pass.run({&again, 1});
    ADD_FAILURE() << "a pass over cached positions ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("already caches position 7"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.n_slots(1, 0, 0), 8);
  BatchItem next{1, {ok.data(), 1}, 8, false};
  EXPECT_EQ(pass.run({&next, 1}).size(), size_t(c.n_vocab));
  // A cache that already holds pages cannot be mirrored.
  EXPECT_THROW(CudaForwardPass(shard, solo, cache, pool, 0), Error);
  KvCache other({c.n_layer, c.n_head_kv, c.head_dim, 16, 0});
  try {
    CudaForwardPass(shard, solo, other, pool, 1 << 20);
    ADD_FAILURE() << "a device that does not exist was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
  }
}

}  // namespace
}  // namespace lazykv
