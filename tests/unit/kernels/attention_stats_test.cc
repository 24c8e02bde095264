// The policy statistics recorded by attention_group in its softmax pass, the
// probabilities-only attention_probs, and gather_keys, against a double
// precision reference over the same f16 keys.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/fp16.h"
#include "kernels/cpu/ops.h"
#include "tests/unit/kernels/kernel_test_util.h"

namespace lazykv::cpu {
namespace {

// f16 KV pages holding n slots: keys transposed per page, values by row.
struct TestPages {
  TestPages(int n, int head_dim, int page_slots, uint32_t seed) : n(n), D(head_dim), page_slots(page_slots) {
    const int n_pages = (n + page_slots - 1) / page_slots;
    const std::vector<float> k = testing::random_floats(size_t(n) * D, seed, 1.5f);
    const std::vector<float> v = testing::random_floats(size_t(n) * D, seed + 1);
    keys_f16.assign(size_t(n_pages) * page_slots * D, 0);
    values_f16.assign(size_t(n_pages) * page_slots * D, 0);
    keys.resize(size_t(n) * D);
    for (int s = 0; s < n; ++s) {
      const int page = s / page_slots, c = s % page_slots;
      for (int d = 0; d < D; ++d) {
        const uint16_t kh = fp32_to_fp16(k[size_t(s) * D + d]);
        keys_f16[size_t(page) * page_slots * D + size_t(d) * page_slots + c] = kh;
        keys[size_t(s) * D + d] = fp16_to_fp32(kh);
        values_f16[size_t(page) * page_slots * D + size_t(c) * D + d] = fp32_to_fp16(v[size_t(s) * D + d]);
      }
      positions.push_back(s);
    }
    for (int p = 0; p < n_pages; ++p) {
      key_ptrs.push_back(keys_f16.data() + size_t(p) * page_slots * D);
      value_ptrs.push_back(values_f16.data() + size_t(p) * page_slots * D);
    }
  }
  KvPages view() const { return {key_ptrs.data(), value_ptrs.data(), positions.data(), n, page_slots}; }

  // softmax(scale q.k) in double over slots with position <= max_pos.
  std::vector<double> probs(const float* q, int64_t max_pos, float scale) const {
    std::vector<double> p(size_t(n), 0.0);
    double max = -INFINITY;
    for (int s = 0; s <= max_pos && s < n; ++s) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += double(q[d]) * keys[size_t(s) * D + d];
      p[size_t(s)] = dot * scale;
      max = std::max(max, p[size_t(s)]);
    }
    double sum = 0;
    for (int s = 0; s <= max_pos && s < n; ++s) sum += (p[size_t(s)] = std::exp(p[size_t(s)] - max));
    for (int s = 0; s < n; ++s) p[size_t(s)] = s <= max_pos ? p[size_t(s)] / sum : 0.0;
    return p;
  }

  int n, D, page_slots;
  std::vector<uint16_t> keys_f16, values_f16;
  std::vector<float> keys;
  std::vector<int32_t> positions;
  std::vector<const uint16_t*> key_ptrs, value_ptrs;
};

TEST(AttentionStatsTest, HitsAndSumsMatchReferenceProbabilities) {
  const int n = 150, D = 64, G = 3;
  const int64_t max_pos = 140;  // the last slots are masked
  const float scale = 1.0f / 8.0f, alpha = 0.01f;
  const TestPages pages(n, D, 64, 7);
  const std::vector<float> q = testing::random_floats(size_t(G) * D, 9, 1.5f);

  std::vector<uint8_t> hits(n, 0);
  hits[145] = 1;  // set before the call: flags are only ever set, never cleared
  std::vector<float> attn(n, 1.0f);  // sums accumulate onto what is there
  const AttentionStats stats{alpha, hits.data(), attn.data()};
  std::vector<float> scores(size_t(G) * n), out(size_t(G) * D);
  attention_group(q.data(), G, D, pages.view(), max_pos, scale, scores.data(), out.data(), nullptr, &stats);

  int n_hits = 0, n_checked = 0;
  for (int s = 0; s < n; ++s) {
    double sum = 0;
    bool hit = false, borderline = false;
    for (int g = 0; g < G; ++g) {
      const double p = pages.probs(q.data() + g * D, max_pos, scale)[size_t(s)];
      sum += p;
      hit = hit || p >= alpha;
      borderline = borderline || std::abs(p - alpha) < 1e-6;
    }
    EXPECT_NEAR(attn[size_t(s)], 1.0 + sum, 1e-5) << "slot " << s;
    if (s == 145) {
      EXPECT_EQ(hits[size_t(s)], 1) << "a flag set before the call stays set";
      continue;
    }
    if (borderline) continue;
    ++n_checked;
    EXPECT_EQ(hits[size_t(s)] != 0, hit) << "slot " << s;
    n_hits += hit;
  }
  EXPECT_GT(n_hits, 0);
  EXPECT_LT(n_hits, n_checked);  // the threshold separates: some slots hit, some do not
}

TEST(AttentionStatsTest, NullStatsLeaveOutputsUnchanged) {
  const int n = 100, D = 64, G = 2;
  const TestPages pages(n, D, 64, 3);
  const std::vector<float> q = testing::random_floats(size_t(G) * D, 4);
  std::vector<float> scores(size_t(G) * n), out_a(size_t(G) * D), out_b(size_t(G) * D);
  std::vector<uint8_t> hits(n, 0);
  const AttentionStats stats{0.02f, hits.data(), nullptr};
  attention_group(q.data(), G, D, pages.view(), n, 0.125f, scores.data(), out_a.data(), nullptr, nullptr);
  attention_group(q.data(), G, D, pages.view(), n, 0.125f, scores.data(), out_b.data(), nullptr, &stats);
  EXPECT_EQ(out_a, out_b);  // recording statistics never changes the attention output
}

TEST(AttentionStatsTest, ProbsOnlyMatchesAttentionGroupScores) {
  const int n = 130, D = 64, G = 4;
  const TestPages pages(n, D, 64, 11);
  const std::vector<float> q = testing::random_floats(size_t(G) * D, 12);
  std::vector<float> scores(size_t(G) * n), out(size_t(G) * D), probs(size_t(G) * n);
  attention_group(q.data(), G, D, pages.view(), 120, 0.125f, scores.data(), out.data(), nullptr, nullptr);
  attention_probs(q.data(), G, D, pages.view(), 120, 0.125f, probs.data());
  EXPECT_EQ(scores, probs);
  for (int g = 0; g < G; ++g) {
    const std::vector<double> ref = pages.probs(q.data() + g * D, 120, 0.125f);
    for (int s = 0; s < n; ++s) EXPECT_NEAR(probs[size_t(g) * n + s], ref[size_t(s)], 1e-6);
  }
}

TEST(AttentionStatsTest, GatherKeysUndoesThePageLayout) {
  const int n = 70, D = 32;
  const TestPages pages(n, D, 16, 5);
  std::vector<float> keys(size_t(n) * D);
  gather_keys(pages.view(), D, keys.data());
  EXPECT_EQ(keys, pages.keys);
}

}  // namespace
}  // namespace lazykv::cpu
