// The mover's failure rules with a store that fails on purpose: only an
// unreachable store turns the tiers off; any other failure, even one that is
// not a lazykv::Error (a failed allocation), fails that one operation and the
// mover's threads go on. And a row fetch against a real in-process store.
#include "worker/tiers/tier_mover.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <new>
#include <stdexcept>

#include "common/error.h"
#include "kvstore/local_block_store.h"

namespace lazykv::tiers {
namespace {

class FaultyStore final : public kvstore::BlockStore {
 public:
  explicit FaultyStore(std::atomic<bool>& closed) : closed_(closed) {}
  ~FaultyStore() override { closed_ = true; }
  std::atomic<bool> unreachable{false};
  void put(const kvstore::BlockKey&, std::span<const uint8_t>, kvstore::BlockHint) override {
    if (unreachable) throw Error(ErrorCode::kUnavailable, "kvstore gone");
    throw std::bad_alloc();
  }
  size_t get(const kvstore::BlockKey&, std::span<uint8_t>, kvstore::BlockHint) override {
    if (unreachable) throw Error(ErrorCode::kUnavailable, "kvstore gone");
    throw std::runtime_error("not an Error");
  }
  size_t get_rows(const kvstore::BlockKey& key, const kvstore::RowSelection&, std::span<uint8_t> out,
                  kvstore::BlockHint hint) override {
    return get(key, out, hint);
  }
  bool drop(const kvstore::BlockKey&) override { return false; }
  size_t drop_sequence(uint64_t, uint64_t) override { return 0; }
  kvstore::TierStoreStats stats() override { return {}; }
  std::string describe() const override { return "faulty test store"; }

 private:
  std::atomic<bool>& closed_;
};

TEST(TierMover, AFailureThatIsNotAnErrorFailsOneOperationAndTheThreadsGoOn) {
  std::atomic<bool> closed{false};
  auto owned = std::make_unique<FaultyStore>(closed);
  FaultyStore* store = owned.get();
  TierMover mover(std::move(owned));
  const kvstore::BlockKey key{1, 2, 0, 0, 0, 16};
  ASSERT_TRUE(mover.put(key, std::vector<uint8_t>(64, 7), {}));
  std::shared_ptr<Fetch> fetch = mover.fetch(key, 64, {});
  ASSERT_NE(fetch, nullptr);
  fetch->wait();
  EXPECT_EQ(fetch->state(), Fetch::State::kFailed);
  EXPECT_EQ(fetch->error(), "not an Error");
  mover.flush();
  EXPECT_TRUE(mover.available()) << "a failed allocation is not a dead kvstore";
  EXPECT_EQ(mover.stats().failures, 2u);

  // The same lanes still run: an unreachable store now turns the tiers off,
  // and is closed (a kvstore that was only slow then drops this worker's blocks).
  EXPECT_FALSE(closed);
  store->unreachable = true;
  std::shared_ptr<Fetch> second = mover.fetch(key, 64, {});
  ASSERT_NE(second, nullptr);
  second->wait();
  EXPECT_EQ(second->state(), Fetch::State::kFailed);
  mover.flush();
  EXPECT_FALSE(mover.available());
  EXPECT_TRUE(closed) << "the store must be closed once the tiers turn off";
  EXPECT_EQ(mover.fetch(key, 64, {}), nullptr);
  EXPECT_EQ(mover.store_stats().puts, 0u);
}

// One head's blocks across the layers run on every lane, not one lane for
// all of them (calls on a lane are serial, each a round trip to the kvstore);
// a block's own operations stay on one lane, in order.
TEST(TierMover, OneHeadsLayersSpreadOverTheLanes) {
  for (uint64_t seq : {1ull, 2ull, 77ull}) {
    std::set<size_t> lanes;
    for (uint32_t layer = 0; layer < 30; ++layer) {
      kvstore::BlockKey key;
      key.sequence = seq;
      key.layer = layer;
      const size_t lane = TierMover::lane_of(key);
      ASSERT_LT(lane, TierMover::kLanes);
      lanes.insert(lane);
      key.first_position = 64;  // another block of the same (layer, head): the same lane
      EXPECT_EQ(TierMover::lane_of(key), lane);
    }
    EXPECT_EQ(lanes.size(), TierMover::kLanes) << "sequence " << seq;
  }
}

// A row fetch through an in-process tier store: only the named rows come
// back, counted as fetched bytes; a selection that does not fit the block
// fails that fetch alone.
TEST(TierMover, ARowFetchBringsOnlyTheNamedRows) {
  kvstore::TierStoreOptions options;
  options.host_capacity_bytes = 1 << 20;
  options.host_alloc_unit = 4096;
  TierMover mover(std::make_unique<kvstore::LocalBlockStore>(options));
  const kvstore::BlockKey key{1, 2, 0, 0, 100, 8};  // 8 K rows then 8 V rows of 4 bytes
  std::vector<uint8_t> block(64);
  for (size_t i = 0; i < block.size(); ++i) block[i] = uint8_t(i);
  ASSERT_TRUE(mover.put(key, block, {}));
  const std::shared_ptr<Fetch> fetch = mover.fetch_rows(key, kvstore::RowSelection{{1, 6}, 4}, {});
  ASSERT_NE(fetch, nullptr);
  fetch->wait();
  ASSERT_EQ(fetch->state(), Fetch::State::kDone) << fetch->error();
  const std::vector<uint8_t> expected{4, 5, 6, 7, 24, 25, 26, 27, 36, 37, 38, 39, 56, 57, 58, 59};
  EXPECT_EQ(fetch->bytes(), expected);
  EXPECT_EQ(mover.stats().bytes_fetched, 16u);
  const std::shared_ptr<Fetch> bad = mover.fetch_rows(key, kvstore::RowSelection{{8}, 4}, {});
  bad->wait();
  EXPECT_EQ(bad->state(), Fetch::State::kFailed);
  mover.flush();
  EXPECT_TRUE(mover.available()) << "a bad selection is not a dead kvstore";
  EXPECT_EQ(mover.stats().failures, 1u);
}

}  // namespace
}  // namespace lazykv::tiers
