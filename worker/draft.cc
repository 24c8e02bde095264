#include "worker/draft.h"

#include <algorithm>
#include <memory>

#include "common/error.h"
#include "worker/sampler.h"

namespace lazykv {
namespace {

// Rides along the draft's passes: never evicts, keeps every query.
class DraftCapture final : public EvictionPolicy {
 public:
  DraftCapture(const EvictionPolicy& owner, int32_t tokens)
      : EvictionPolicy(PolicyConfig{}, unbounded(owner.shape()), owner.heads_per_layer(),
                       Needs{.keep_queries = tokens}) {}

  // Appends the owner's chosen slots of one head of `from` to `to`; false
  // when the cache is full.
  bool copy_head(int layer, int head, KvCache& cache, SeqId from, SeqId to, std::span<const int32_t> slots) {
    const size_t n = slots.size(), row = size_t(shape().head_dim);
    positions_.resize(n);
    k_.resize(n * row);
    v_.resize(n * row);
    const std::span<const int32_t> pos = cache.positions(from, layer, head);
    for (size_t i = 0; i < n; ++i) {
      positions_[i] = pos[size_t(slots[i])];
      cache.read_slot(from, layer, head, slots[i], k_.data() + i * row, v_.data() + i * row);
    }
    zeros_.assign(n, 0);
    return append_slots(layer, head, cache, to, positions_, k_.data(), v_.data(), zeros_, zeros_);
  }

  // The queries kept so far, oldest first, as DraftQueries wants them.
  DraftQueries queries(int32_t first_pos) const {
    DraftQueries out;
    out.first_pos = first_pos;
    const size_t stride = size_t(queries_per_head()) * size_t(shape().head_dim);
    for (int layer = 0; layer < shape().n_layer; ++layer) {
      for (int h = 0; h < heads_per_layer(); ++h) {
        const auto kept = recent_queries(head_state(layer, h));
        out.tokens = int32_t(kept.size());
        std::vector<float>& rows = out.heads.emplace_back();
        for (const auto& [pos, q] : kept) rows.insert(rows.end(), q, q + stride);
      }
    }
    return out;
  }

 protected:
  void select(int, std::span<Head>, const KvCache&, SeqId, std::vector<std::vector<int32_t>>&) override {}

 private:
  static PolicyShape unbounded(PolicyShape shape) {
    shape.max_len = 0;     // the ring must hold every draft token
    shape.prompt_len = 0;  // ... and a draft in the owner's prompt (epicache's) keeps its queries too
    return shape;
  }
  std::vector<int32_t> positions_, zeros_;
  std::vector<uint16_t> k_, v_;
};

// Copies the draft slots of every head; false when the cache is full.
bool copy_draft_slots(DraftCapture& capture, const DraftRequest& r, KvCache& cache, SeqId to) {
  std::vector<int32_t> keep;
  for (int layer = 0; layer < r.policy->shape().n_layer; ++layer) {
    for (int h = 0; h < r.policy->heads_per_layer(); ++h) {
      r.policy->draft_slots(layer, h, cache, r.seq, keep);
      if (!capture.copy_head(layer, h, cache, r.seq, to, keep)) return false;
    }
  }
  return true;
}

}  // namespace

std::vector<DraftRun> run_drafts(ForwardBackend& forward, KvCache& cache, TensorParallelGroup& group,
                                 std::span<const DraftRequest> requests, size_t n_vocab, size_t row_stride) {
  if (requests.size() > size_t(kMaxDrafts)) throw Error(ErrorCode::kInternal, "draft: too many drafts at once");
  const size_t n = requests.size();
  std::vector<DraftRun> runs(n);
  std::vector<std::unique_ptr<DraftCapture>> captures;
  std::vector<int32_t> wanted(n), next(n);
  std::vector<std::span<const int32_t>> given(n);  // a policy's own draft tokens, fed in the first pass
  struct Remove {  // the copies go whatever happens
    KvCache& cache;
    size_t added = 0;
    ~Remove() {
      for (size_t i = 0; i < added; ++i) cache.remove_sequence(kDraftSeq + SeqId(i));
    }
  } remove{cache};
  std::vector<float> full(n, 0.0f);  // per request: its copy did not fit (on some rank)
  for (size_t i = 0; i < n; ++i) {
    const DraftRequest& r = requests[i];
    wanted[i] = r.policy->draft_wanted();
    given[i] = r.policy->draft_tokens();
    if (!given[i].empty() && int32_t(given[i].size()) != wanted[i]) {
      throw Error(ErrorCode::kInternal, "run_drafts: a policy gives " + std::to_string(given[i].size()) +
                                            " draft tokens and wants " + std::to_string(wanted[i]));
    }
    if (given[i].empty() && r.token < 0) {
      throw Error(ErrorCode::kInternal, "run_drafts: a greedy draft needs the sampled token (" +
                                            std::to_string(r.token) + ")");
    }
    next[i] = r.token;
    captures.push_back(std::make_unique<DraftCapture>(*r.policy, wanted[i]));
    cache.add_sequence(kDraftSeq + SeqId(i), r.policy->heads_per_layer());
    ++remove.added;
    if (!copy_draft_slots(*captures[i], r, cache, kDraftSeq + SeqId(i))) full[i] = 1;
  }
  if (group.world() > 1 && n > 0) group.all_reduce_sum(full.data(), n);
  for (size_t i = 0; i < n; ++i) runs[i].out_of_memory = full[i] > 0;
  // One pass per draft token over every draft still running; given drafts
  // go whole in the first.
  std::vector<BatchItem> items;
  std::vector<size_t> owner;
  for (int32_t t = 0;; ++t) {
    items.clear();
    owner.clear();
    for (size_t i = 0; i < n; ++i) {
      if (runs[i].out_of_memory || t >= wanted[i] || (!given[i].empty() && t > 0)) continue;
      const std::span<const int32_t> tokens = given[i].empty() ? std::span<const int32_t>(&next[i], 1) : given[i];
      items.push_back(BatchItem{kDraftSeq + SeqId(i), tokens, requests[i].pos + t, false, captures[i].get()});
      owner.push_back(i);
    }
    if (items.empty()) break;
    std::span<const float> logits;
    try {
      logits = forward.run(items);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kOutOfMemory) throw;
      for (size_t i : owner) runs[i].out_of_memory = true;  // every rank alike: reserve_batch agrees
      break;
    }
    for (size_t k = 0; k < owner.size(); ++k) {
      const size_t i = owner[k];
      if (!given[i].empty()) {
        runs[i].tokens.assign(given[i].begin(), given[i].end());
        continue;
      }
      runs[i].tokens.push_back(next[i]);
      next[i] = argmax(logits.subspan(k * row_stride, std::min(n_vocab, row_stride)));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const DraftQueries draft = captures[i]->queries(requests[i].pos);
    requests[i].policy->end_draft(draft, cache, requests[i].seq, &forward.policy_pool());
  }
  return runs;
}

DraftRun run_draft(ForwardBackend& forward, KvCache& cache, TensorParallelGroup& group, SeqId seq,
                   EvictionPolicy& policy, int32_t token, int32_t pos, size_t n_vocab, size_t row_stride) {
  const DraftRequest request{seq, &policy, token, pos};
  return run_drafts(forward, cache, group, {&request, 1}, n_vocab, row_stride).front();
}

}  // namespace lazykv
