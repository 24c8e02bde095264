#include "worker/draft.h"

#include <algorithm>

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

  // Appends the owner's chosen slots of one head; false when the cache is full.
  bool copy_head(int layer, int head, KvCache& cache, SeqId from, std::span<const int32_t> slots) {
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
    return append_slots(layer, head, cache, kDraftSeq, positions_, k_.data(), v_.data(), zeros_, zeros_);
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
    shape.max_len = 0;  // the ring must hold every draft token
    return shape;
  }
  std::vector<int32_t> positions_, zeros_;
  std::vector<uint16_t> k_, v_;
};

// Copies the draft slots of every head; false when some rank's cache is full.
bool copy_draft_slots(DraftCapture& capture, EvictionPolicy& policy, KvCache& cache, TensorParallelGroup& group,
                      SeqId seq) {
  std::vector<int32_t> keep;
  float full = 0;
  for (int layer = 0; layer < policy.shape().n_layer && full == 0; ++layer) {
    for (int h = 0; h < policy.heads_per_layer() && full == 0; ++h) {
      policy.draft_slots(layer, h, cache, seq, keep);
      if (!capture.copy_head(layer, h, cache, seq, keep)) full = 1;
    }
  }
  if (group.world() > 1) group.all_reduce_sum(&full, 1);
  return full == 0;
}

}  // namespace

DraftRun run_draft(ForwardBackend& forward, KvCache& cache, TensorParallelGroup& group, SeqId seq,
                   EvictionPolicy& policy, int32_t token, int32_t pos, size_t n_vocab, size_t row_stride) {
  const int32_t wanted = policy.draft_wanted();
  DraftRun run;
  DraftCapture capture(policy, wanted);
  cache.add_sequence(kDraftSeq, policy.heads_per_layer());
  struct Remove {
    KvCache& cache;
    ~Remove() { cache.remove_sequence(kDraftSeq); }
  } remove{cache};
  run.out_of_memory = !copy_draft_slots(capture, policy, cache, group, seq);
  for (int32_t i = 0; i < wanted && !run.out_of_memory; ++i) {
    const BatchItem item{kDraftSeq, {&token, 1}, pos + i, false, &capture};
    std::span<const float> logits;
    try {
      logits = forward.run({&item, 1});
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kOutOfMemory) throw;
      run.out_of_memory = true;
      break;
    }
    run.tokens.push_back(token);
    token = argmax(logits.subspan(0, std::min(n_vocab, row_stride)));
  }
  const DraftQueries draft = capture.queries(pos);
  policy.end_draft(draft, cache, seq);
  return run;
}

}  // namespace lazykv
