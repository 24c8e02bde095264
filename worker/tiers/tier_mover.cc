#include "worker/tiers/tier_mover.h"

#include <cstdio>

#include "common/error.h"
#include "common/random.h"
#include "common/seeded_random.h"
#include "kvstore/client/kvstore_client.h"
#include "kvstore/local_block_store.h"

namespace lazykv::tiers {

void Fetch::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [this] { return ready(); });
}

bool Fetch::wait_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return done_.wait_until(lock, deadline, [this] { return ready(); });
}

void Fetch::finish(State state, std::string error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::move(error);
    state_.store(state, std::memory_order_release);
  }
  done_.notify_all();
}

TierMover::TierMover(std::unique_ptr<kvstore::BlockStore> store, uint64_t max_queued_bytes, const std::string& why)
    : store_(std::move(store)),
      description_(store_ ? store_->describe() : "tiers off: " + why),
      max_queued_bytes_(max_queued_bytes) {
  if (!store_) {
    available_ = false;
    stats_.available = false;
    stats_.last_error = why;
    return;
  }
  for (size_t i = 0; i < kLanes; ++i) lanes_.push_back(std::make_unique<Lane>());
  for (auto& lane : lanes_) lane->thread = std::thread([this, l = lane.get()] { loop(*l); });
}

TierMover::~TierMover() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  for (auto& lane : lanes_) {
    lane->work.notify_all();
    lane->thread.join();
  }
}

size_t TierMover::lane_of(const kvstore::BlockKey& key) {
  // (The layer once went in as layer << 16, which no lane index below 2^16
  // could see: every layer of a head shared one lane.)
  return size_t(splitmix64_at(key.sequence, (uint64_t(key.layer) << 32) | uint64_t(key.kv_head)) % kLanes);
}

void TierMover::enqueue(size_t lane, Op op) {
  Lane& l = *lanes_[lane];
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued_bytes_ += op.queued_bytes;
    l.queue.push_back(std::move(op));
  }
  l.work.notify_one();
}

bool TierMover::idle_locked() const {
  for (const auto& lane : lanes_) {
    if (!lane->queue.empty() || lane->busy) return false;
  }
  return true;
}

namespace {

// A store that cannot be reached ends the tiers; any other failure (a bad
// block, a failed allocation) is that op's alone.
bool unreachable(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  return error != nullptr && error->code() == ErrorCode::kUnavailable;
}

}  // namespace

void TierMover::failed(const std::exception& e, bool fatal) {
  std::shared_ptr<kvstore::BlockStore> closing;  // released after the lock: closing may take a while
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.failures;
  stats_.last_error = e.what();
  if (fatal && available_.exchange(false)) {
    stats_.available = false;
    closing = std::move(store_);
    std::fprintf(stderr, "[tiers] %s is unavailable (%s); continuing without tiers\n", description_.c_str(),
                 e.what());
  }
}

std::shared_ptr<kvstore::BlockStore> TierMover::live_store() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return available() ? store_ : nullptr;
}

bool TierMover::put(const kvstore::BlockKey& key, std::vector<uint8_t> bytes, kvstore::BlockHint hint) {
  const uint64_t size = bytes.size();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!available() || queued_bytes_ + size > max_queued_bytes_) {
      ++stats_.refused;
      return false;
    }
  }
  auto payload = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  enqueue(lane_of(key), Op{[this, key, payload, hint] {
               const std::shared_ptr<kvstore::BlockStore> store = live_store();
               if (!store) return;
               try {
                 store->put(key, *payload, hint);
                 std::lock_guard<std::mutex> lock(mutex_);
                 ++stats_.blocks_demoted;
                 stats_.bytes_demoted += payload->size();
               } catch (const std::exception& e) {  // not only Error: bad_alloc must not end the thread
                 failed(e, unreachable(e));
               }
             },
             size});
  return true;
}

std::shared_ptr<Fetch> TierMover::fetch(const kvstore::BlockKey& key, size_t bytes, kvstore::BlockHint hint) {
  return start_fetch(key, bytes, [key, hint](kvstore::BlockStore& store, std::span<uint8_t> out) {
    return store.get(key, out, hint);
  });
}

std::shared_ptr<Fetch> TierMover::fetch_rows(const kvstore::BlockKey& key, kvstore::RowSelection selection,
                                             kvstore::BlockHint hint) {
  const size_t bytes = selection.bytes();
  return start_fetch(key, bytes, [key, selection = std::move(selection), hint](kvstore::BlockStore& store,
                                                                               std::span<uint8_t> out) {
    return store.get_rows(key, selection, out, hint);
  });
}

std::shared_ptr<Fetch> TierMover::start_fetch(const kvstore::BlockKey& key, size_t bytes, Read read) {
  if (!available()) return nullptr;
  auto fetch = std::make_shared<Fetch>();
  enqueue(lane_of(key), Op{[this, key, bytes, read = std::move(read), fetch] {
               const std::shared_ptr<kvstore::BlockStore> store = live_store();
               if (!store) {
                 fetch->finish(Fetch::State::kFailed, "tiers unavailable");
                 return;
               }
               try {
                 fetch->bytes_.resize(bytes);
                 const size_t got = read(*store, fetch->bytes_);
                 if (got != bytes) {
                   throw Error(ErrorCode::kIo, "block " + key.to_string() + " came back with " + std::to_string(got) +
                                                   " bytes, expected " + std::to_string(bytes));
                 }
                 {
                   std::lock_guard<std::mutex> lock(mutex_);
                   ++stats_.blocks_fetched;
                   stats_.bytes_fetched += got;
                 }
                 fetch->finish(Fetch::State::kDone);
               } catch (const std::exception& e) {
                 failed(e, unreachable(e));
                 fetch->bytes_.clear();
                 fetch->finish(Fetch::State::kFailed, e.what());
               }
             },
             0});
  return fetch;
}

void TierMover::drop(const kvstore::BlockKey& key) {
  if (!available()) return;
  enqueue(lane_of(key), Op{[this, key] {
               const std::shared_ptr<kvstore::BlockStore> store = live_store();
               if (!store) return;
               try {
                 store->drop(key);
               } catch (const std::exception& e) {
                 failed(e, unreachable(e));
               }
             },
             0});
}

void TierMover::drop_sequence(uint64_t model_fingerprint, uint64_t sequence) {
  if (!available()) return;
  // A barrier across the lanes: the last lane to reach it drops, after every
  // op queued before it anywhere.
  auto waiting = std::make_shared<std::atomic<size_t>>(kLanes);
  for (size_t lane = 0; lane < kLanes; ++lane) {
    enqueue(lane, Op{[this, model_fingerprint, sequence, waiting] {
                       if (waiting->fetch_sub(1) != 1) return;
                       const std::shared_ptr<kvstore::BlockStore> store = live_store();
                       if (!store) return;
                       try {
                         store->drop_sequence(model_fingerprint, sequence);
                       } catch (const std::exception& e) {
                         failed(e, unreachable(e));
                       }
                     },
                     0});
  }
}

void TierMover::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return idle_locked(); });
}

kvstore::TierStoreStats TierMover::store_stats() {
  const std::shared_ptr<kvstore::BlockStore> store = live_store();
  if (!store) return {};
  try {
    return store->stats();
  } catch (const Error&) {
    return {};
  }
}

MoverStats TierMover::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  MoverStats s = stats_;
  s.available = available();
  return s;
}

void TierMover::loop(Lane& lane) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    lane.work.wait(lock, [&] { return stopping_ || !lane.queue.empty(); });
    if (lane.queue.empty()) {
      if (stopping_) return;
      continue;
    }
    Op op = std::move(lane.queue.front());
    lane.queue.pop_front();
    lane.busy = true;
    lock.unlock();
    op.run();
    lock.lock();
    queued_bytes_ -= op.queued_bytes;
    lane.busy = false;
    if (idle_locked()) idle_.notify_all();
  }
}

// --- the process's tiers ---------------------------------------------------------

namespace {

std::mutex process_mutex;
TierConfig process_config;
std::shared_ptr<TierMover> process_mover;

std::shared_ptr<TierMover> build_mover(const TierConfig& config) {
  if (config.kvstore_address.empty()) {
    kvstore::TierStoreOptions options;
    options.host_capacity_bytes = config.host_tier_bytes;
    options.host_alloc_unit = config.host_alloc_unit;
    options.step_seconds = config.step_seconds;
    options.nvme_path = config.nvme_path;
    options.nvme_capacity_bytes = config.nvme_tier_bytes;
    return std::make_shared<TierMover>(std::make_unique<kvstore::LocalBlockStore>(options));
  }
  try {
    kvstore::KvstoreClientOptions options;
    options.address = config.kvstore_address;
    options.transport.transports = config.transports;
    auto client = std::make_unique<kvstore::KvstoreClient>(options);
    std::fprintf(stderr, "[tiers] demoting to %s\n", client->describe().c_str());
    return std::make_shared<TierMover>(std::move(client));
  } catch (const Error& e) {
    std::fprintf(stderr, "[tiers] kvstore %s unreachable (%s); running without tiers\n",
                 config.kvstore_address.c_str(), e.what());
    return std::make_shared<TierMover>(nullptr, 0, e.what());
  }
}

}  // namespace

void configure_tiers(const TierConfig& config) {
  std::lock_guard<std::mutex> lock(process_mutex);
  process_config = config;
  process_mover.reset();
}

std::shared_ptr<TierMover> process_tiers() {
  std::lock_guard<std::mutex> lock(process_mutex);
  if (!process_mover) process_mover = build_mover(process_config);
  return process_mover;
}

void shutdown_tiers() {
  std::shared_ptr<TierMover> mover;
  {
    std::lock_guard<std::mutex> lock(process_mutex);
    mover = std::move(process_mover);
  }
  if (mover) mover->flush();
}

uint64_t next_tier_sequence() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

uint64_t process_fingerprint() {
  static const uint64_t fingerprint = random_u64();
  return fingerprint;
}

}  // namespace lazykv::tiers
