// The draft a policy may ask for before it compacts (laq's lookahead):
// a few tokens decoded greedily on a compressed copy of a sequence's cache,
// through the ordinary forward pass, then thrown away; or tokens the policy
// gives (epicache's patched prompt), fed in one pass on a copy. Only their queries
// are kept; they go to the policy, which compacts the real cache with them.
// The worker and the eval harness call this after sampling a step (the eval
// harness also after a prefill block), for every sequence whose policy's
// draft_wanted() is above 0.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "worker/forward.h"
#include "worker/kv_cache.h"
#include "worker/parallel/group.h"
#include "worker/policy/policy.h"

namespace lazykv {

// The scratch sequences drafts run in, kDraftSeq + i for the i-th of the
// drafts run together: no request may have these ids.
inline constexpr SeqId kDraftSeq = std::numeric_limits<SeqId>::min();
inline constexpr int32_t kMaxDrafts = 1 << 20;
inline bool is_draft_seq(SeqId seq) { return seq >= kDraftSeq && seq < kDraftSeq + kMaxDrafts; }

struct DraftRun {
  std::vector<int32_t> tokens;  // fed to the draft: `token`, then the greedy ones (or the policy's own)
  bool out_of_memory = false;   // the cache had no room for the copy or a token: fewer queries
};

struct DraftRequest {
  SeqId seq = 0;
  EvictionPolicy* policy = nullptr;  // its draft_wanted() > 0
  int32_t token = -1;                // the token sampled for `seq`, fed first (unused when the policy gives its draft)
  int32_t pos = 0;                   // its position: the draft's first
};

// Every request's draft at once: one forward pass per draft token over all
// the drafts still running (a copy that does not fit drops out alone; a
// pass that does not fit ends them all), then each policy's end_draft.
// Returns one DraftRun per request.
std::vector<DraftRun> run_drafts(ForwardBackend& forward, KvCache& cache, TensorParallelGroup& group,
                                 std::span<const DraftRequest> requests, size_t n_vocab, size_t row_stride);

// Copies the policy's draft slots of `seq` into a scratch sequence, feeds
// `token` at `pos` and then each greedy successor, policy.draft_wanted()
// tokens in all (logits rows of `row_stride`, the first `n_vocab`
// samplable), and ends the policy's draft with their queries. The copy is
// removed whatever happens. In a tensor-parallel group every rank calls it
// (or run_drafts) for the same sequences in the same order, and all run out
// of memory together. One request of run_drafts.
DraftRun run_draft(ForwardBackend& forward, KvCache& cache, TensorParallelGroup& group, SeqId seq,
                   EvictionPolicy& policy, int32_t token, int32_t pos, size_t n_vocab, size_t row_stride);

}  // namespace lazykv
