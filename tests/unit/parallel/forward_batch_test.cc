// reserve_batch across tensor-parallel ranks: every rank runs a pass or none
// does, also when one rank's own preparation (a GPU pass's buffers) runs out
// of memory after its KV was reserved.
#include "worker/forward_batch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "common/error.h"
#include "parallel_test_util.h"

namespace lazykv {
namespace {

TEST(ReserveBatch, OneRanksPreparationOutOfMemoryFailsEveryRankAndTheGroupGoesOn) {
  std::atomic<int> prepared{0};
  run_ranks(2, [&](TensorParallelGroup& group) {
    KvCache cache({2, 1, 8, 4, 0});
    cache.add_sequence(1);
    const std::vector<int32_t> tokens{1, 2, 3};
    const BatchItem item{1, tokens, 0, false};
    const auto full_on_rank_0 = [&] {
      if (group.rank() == 0) throw Error(ErrorCode::kOutOfMemory, "device full");
    };
    try {
      reserve_batch({&item, 1}, cache, group, full_on_rank_0);
      ADD_FAILURE() << "rank " << group.rank() << " went ahead";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
      if (group.rank() == 0) {
        EXPECT_NE(std::string(e.what()).find("device full"), std::string::npos) << e.what();
      }
    }
    // The group is still in step: the next batch prepares and passes on both.
    reserve_batch({&item, 1}, cache, group, [&] { ++prepared; });
    EXPECT_EQ(cache.n_slots(1, 0, 0), 0);  // reserved, not appended
  });
  EXPECT_EQ(prepared.load(), 2);
}

TEST(ReserveBatch, OneRankPreparesAfterReserving) {
  SoloGroup solo;
  KvCache cache({2, 1, 8, 4, 0});
  cache.add_sequence(1);
  const std::vector<int32_t> tokens(9, 1);
  const BatchItem item{1, tokens, 0, false};
  size_t pages_seen = 0;
  reserve_batch({&item, 1}, cache, solo, [&] { pages_seen = cache.page_ids(1, 0, 0).size(); });
  EXPECT_EQ(pages_seen, 3u);  // 9 slots in pages of 4
}

}  // namespace
}  // namespace lazykv
