// The kvstore as a separate process (`lazykv kvstore`, LAZYKV_BIN) reached
// over gRPC and UCX on loopback by KvstoreClient: blocks demoted and
// promoted with their bytes verified, over tcp and shared memory; the
// kvstore killed in the middle of a transfer (an error within the peer
// timeout, never a hang); restarted on the same RocksDB path (tier-2 blocks
// come back verified); an abort storm of 1,000 cancels during transfers
// (zero leases and zero leaked blocks afterwards); a worker that goes away
// leaves no block behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "kvstore/client/kvstore_client.h"

extern char** environ;

namespace lazykv::kvstore {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A `lazykv kvstore` child process; killed (SIGKILL) when destroyed.
class KvstoreProcess {
 public:
  explicit KvstoreProcess(std::vector<std::string> extra) {
    const char* bin = std::getenv("LAZYKV_BIN");
    if (bin == nullptr) throw Error(ErrorCode::kNotFound, "LAZYKV_BIN is not set (ctest sets it)");
    std::vector<std::string> args = {bin, "kvstore", "--listen", "127.0.0.1:0", "--peer-timeout-ms", "1500"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (pipe(out) != 0) throw Error(ErrorCode::kIo, "pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    const int rc = posix_spawn(&pid_, bin, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    if (rc != 0) throw Error(ErrorCode::kIo, "cannot start " + std::string(bin));
    stdout_ = fdopen(out[0], "r");
    // The banner names both ports.
    const std::regex control(R"(control \(gRPC\) on 127\.0\.0\.1:(\d+))");
    const std::regex data(R"(data \(UCX\) on 127\.0\.0\.1:(\d+))");
    char line[512];
    while ((control_port_ == 0 || data_port_ == 0) && std::fgets(line, sizeof line, stdout_) != nullptr) {
      std::cmatch m;
      if (std::regex_search(line, m, control)) control_port_ = std::stoi(m[1]);
      if (std::regex_search(line, m, data)) data_port_ = std::stoi(m[1]);
    }
    if (control_port_ == 0 || data_port_ == 0) throw Error(ErrorCode::kIo, "the kvstore did not start");
  }
  ~KvstoreProcess() { kill_now(); }
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    if (stdout_ != nullptr) std::fclose(stdout_);
    stdout_ = nullptr;
  }
  // SIGTERM and the exit status.
  int stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    std::fclose(stdout_);
    stdout_ = nullptr;
    return status;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(control_port_); }

 private:
  pid_t pid_ = -1;
  FILE* stdout_ = nullptr;
  int control_port_ = 0;
  int data_port_ = 0;
};

KvstoreClientOptions client_options(const KvstoreProcess& kvstore, const std::string& transports = "") {
  KvstoreClientOptions o;
  o.address = kvstore.address();
  o.transport.transports = transports;
  o.transport.peer_timeout = 1500ms;
  o.timeout = 3000ms;
  return o;
}

BlockKey key_of(uint64_t sequence, uint32_t layer, uint32_t head, uint32_t bytes) {
  return BlockKey{0xfeedbeef, sequence, layer, head, 0, bytes / 256};
}

// The bytes a block holds: derived from its key, so any mix-up is visible.
std::vector<uint8_t> payload_of(const BlockKey& key, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  std::mt19937_64 rng(key.sequence * 1000003 + key.layer * 131 + key.kv_head);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, bytes - i));
  }
  return out;
}

std::string temp_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

class KvstoreProcessTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvstoreProcessTest, DemotedBlocksComeBackByteForByte) {
  KvstoreProcess kvstore({"--host-capacity-mib", "64", "--transports", GetParam()});
  KvstoreClient client(client_options(kvstore, GetParam()));
  EXPECT_FALSE(client.transport().empty());
  std::vector<BlockKey> keys;
  for (uint32_t layer = 0; layer < 4; ++layer) {
    for (uint32_t head = 0; head < 4; ++head) {
      for (uint32_t bytes : {4096u, 65536u, 1u << 20}) {
        const BlockKey key = key_of(1 + bytes, layer, head, bytes);
        client.put(key, payload_of(key, bytes), BlockHint{10});
        keys.push_back(key);
      }
    }
  }
  std::vector<uint8_t> out(1 << 20);
  for (const BlockKey& key : keys) {
    const size_t n = client.get(key, out);
    ASSERT_EQ(n, size_t(key.count) * 256);
    EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + n), payload_of(key, n)) << key.to_string();
  }
  // Row gets: the kvstore gathers the named K and V rows and sends only them.
  for (const BlockKey& key : {keys.front(), keys.back()}) {
    const std::vector<uint8_t> block = payload_of(key, size_t(key.count) * 256);
    const RowSelection selection{{0, 2, key.count - 1}, 128};
    std::vector<uint8_t> expected;
    for (uint32_t half : {0u, key.count}) {
      for (uint32_t row : selection.rows) {
        expected.insert(expected.end(), block.begin() + (half + row) * 128, block.begin() + (half + row + 1) * 128);
      }
    }
    ASSERT_EQ(client.get_rows(key, selection, out), expected.size());
    EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + std::ptrdiff_t(expected.size())), expected);
  }
  try {
    client.get_rows(keys.front(), RowSelection{{keys.front().count}, 128}, out);
    ADD_FAILURE() << "a row past the block was served";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  // A read lease ends when its payload has left the kvstore (the send's
  // completion), which may come just after the client holds the bytes.
  TierStoreStats stats = client.stats();
  for (int i = 0; i < 200 && stats.leases != 0; ++i) {
    std::this_thread::sleep_for(10ms);
    stats = client.stats();
  }
  EXPECT_EQ(stats.host_blocks, keys.size());
  EXPECT_EQ(stats.leases, 0u);
  // A block the kvstore never had, and a buffer too small: clear errors.
  try {
    client.get(key_of(999, 0, 0, 4096), out);
    ADD_FAILURE() << "a missing block was served";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
  }
  std::vector<uint8_t> small(100);
  try {
    client.get(keys.back(), small);
    ADD_FAILURE() << "a block was written past its buffer";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  EXPECT_EQ(client.drop_sequence(0xfeedbeef, 1 + 4096), 16u);
  EXPECT_EQ(client.stats().host_blocks, keys.size() - 16);
  EXPECT_EQ(kvstore.stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(Transports, KvstoreProcessTest, ::testing::Values("tcp", "shm,tcp"),
                         [](const auto& info) { return info.param == "tcp" ? "tcp" : "shm"; });

TEST(KvstoreProcess, KilledMidTransferIsAnErrorWithinThePeerTimeoutAndLaterCallsFailFast) {
  KvstoreProcess kvstore({"--host-capacity-mib", "256", "--transports", "tcp"});
  KvstoreClient client(client_options(kvstore, "tcp"));
  std::atomic<bool> failed{false};
  std::atomic<int> puts{0};
  Clock::time_point failed_at;
  ErrorCode code = ErrorCode::kInternal;
  std::thread writer([&] {
    for (uint64_t i = 0; !failed; ++i) {
      const BlockKey key = key_of(i % 32, 0, 0, 4 << 20);
      try {
        client.put(key, payload_of(key, 4 << 20));
        ++puts;
      } catch (const Error& e) {
        failed_at = Clock::now();
        code = e.code();
        failed = true;
      }
    }
  });
  while (puts < 3) std::this_thread::sleep_for(1ms);
  const auto killed_at = Clock::now();
  kvstore.kill_now();
  writer.join();
  EXPECT_EQ(code, ErrorCode::kUnavailable);
  EXPECT_LT(failed_at - killed_at, 5s) << "the dead kvstore was noticed late";
  // Every later call fails at once instead of waiting out a timeout.
  const auto before = Clock::now();
  std::vector<uint8_t> out(4096);
  EXPECT_THROW(client.get(key_of(1, 0, 0, 4096), out), Error);
  EXPECT_LT(Clock::now() - before, 1s);
  EXPECT_FALSE(client.connected());
}

TEST(KvstoreProcess, RestartedOnTheSameRocksDbServesItsTier2BlocksVerified) {
  const std::string dir = temp_dir("lazykv-kvstore-restart");
  const std::vector<std::string> args = {"--host-capacity-mib", "4", "--alloc-unit-kib", "64", "--nvme-path", dir,
                                         "--transports", "tcp"};
  std::vector<BlockKey> keys;
  size_t nvme_blocks = 0;
  {
    KvstoreProcess kvstore(args);
    KvstoreClient client(client_options(kvstore, "tcp"));
    // 32 blocks of 512 KiB into a 4 MiB host tier: most go down to tier 2
    // (predicted reuse within the admission horizon).
    for (uint64_t i = 0; i < 32; ++i) {
      const BlockKey key = key_of(100 + i, 1, 2, 512 << 10);
      client.put(key, payload_of(key, 512 << 10), BlockHint{100});
      keys.push_back(key);
    }
    nvme_blocks = client.stats().nvme_blocks;
    ASSERT_GE(nvme_blocks, 24u);
    kvstore.kill_now();  // no clean shutdown: the write-ahead log must carry it
  }
  KvstoreProcess kvstore(args);
  KvstoreClient client(client_options(kvstore, "tcp"));
  EXPECT_EQ(client.stats().nvme_blocks, nvme_blocks);
  size_t served = 0;
  std::vector<uint8_t> out(512 << 10);
  for (const BlockKey& key : keys) {
    try {
      ASSERT_EQ(client.get(key, out), out.size());
      EXPECT_EQ(out, payload_of(key, out.size())) << key.to_string();
      ++served;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();  // it was only in the host tier
    }
  }
  EXPECT_GE(served, nvme_blocks);
  EXPECT_EQ(kvstore.stop(), 0);
  std::filesystem::remove_all(dir);
}

// A worker that goes away (exits, is killed, its connection drops) can never
// read or drop its blocks again: the kvstore drops them, in both tiers, so
// they do not hold its capacity forever. A shared block it put (a prompt
// block, under a fingerprint of its own) stays for the other workers.
TEST(KvstoreProcess, TheBlocksOfAWorkerThatIsGoneAreDroppedFromBothTiers) {
  const std::string dir = temp_dir("lazykv-kvstore-peer-gone");
  KvstoreProcess kvstore({"--host-capacity-mib", "4", "--alloc-unit-kib", "64", "--nvme-path", dir,
                          "--transports", "tcp"});
  const BlockKey shared{0x5eed, 7, 0, 0, 0, 64};
  {
    KvstoreClient gone(client_options(kvstore, "tcp"));
    gone.put(shared, payload_of(shared, 64 << 10), BlockHint{.steps_until_use = 1, .shared = true});
    for (uint64_t i = 0; i < 32; ++i) {
      const BlockKey key = key_of(100 + i, 1, 2, 512 << 10);
      gone.put(key, payload_of(key, 512 << 10), BlockHint{100});
    }
    const TierStoreStats stats = gone.stats();
    ASSERT_GT(stats.host_blocks, 0u);
    ASSERT_GT(stats.nvme_blocks, 0u);
  }  // gone without a drop_sequence
  KvstoreClient next(client_options(kvstore, "tcp"));
  TierStoreStats stats = next.stats();
  for (const auto deadline = Clock::now() + 10s; stats.host_blocks + stats.nvme_blocks > 1 && Clock::now() < deadline;) {
    std::this_thread::sleep_for(50ms);
    stats = next.stats();
  }
  EXPECT_EQ(stats.host_blocks + stats.nvme_blocks, 1u);
  EXPECT_LT(stats.nvme_used_bytes + stats.host_used_bytes, 512u << 10);  // no 512 KiB block of the gone worker
  std::vector<uint8_t> out(64 << 10);
  EXPECT_EQ(next.get(shared, out, BlockHint{}), out.size());
  EXPECT_EQ(out, payload_of(shared, out.size()));
  EXPECT_EQ(kvstore.stop(), 0);
  std::filesystem::remove_all(dir);
}

TEST(KvstoreProcess, AnAbortStormOfAThousandCancelsLeavesNoLeaseAndNoBlock) {
  KvstoreProcess kvstore({"--host-capacity-mib", "64", "--transports", "tcp"});
  KvstoreClient client(client_options(kvstore, "tcp"));
  constexpr uint64_t kSequences = 1000;
  constexpr size_t kBytes = 256 << 10;
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> cancelled{0};
  std::vector<std::thread> threads;
  // Writers put a sequence's blocks while the canceller drops the sequences
  // they are working on: every cancel races transfers in flight.
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      for (uint64_t s = next++; s < kSequences; s = next++) {
        for (uint32_t layer = 0; layer < 4; ++layer) {
          const BlockKey key = key_of(s, layer, 0, kBytes);
          try {
            client.put(key, payload_of(key, kBytes));
          } catch (const Error& e) {
            // Dropped while in flight, or no room while the storm runs.
            EXPECT_TRUE(e.code() == ErrorCode::kNotFound || e.code() == ErrorCode::kOutOfMemory) << e.what();
          }
        }
      }
    });
  }
  threads.emplace_back([&] {
    for (uint64_t s = 0; s < kSequences; ++s) {
      while (next.load() <= s) std::this_thread::yield();
      client.drop_sequence(0xfeedbeef, s);
      ++cancelled;
    }
  });
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(cancelled.load(), kSequences);
  // Blocks that landed after their cancel are dropped by a second sweep,
  // the way a worker drops a finished sequence.
  for (uint64_t s = 0; s < kSequences; ++s) client.drop_sequence(0xfeedbeef, s);
  const TierStoreStats stats = client.stats();
  EXPECT_EQ(stats.leases, 0u);
  EXPECT_EQ(stats.zombie_blocks, 0u);
  EXPECT_EQ(stats.host_blocks, 0u);
  EXPECT_EQ(stats.host_used_bytes, 0u);
  EXPECT_GE(stats.puts, 1000u);
  EXPECT_EQ(kvstore.stop(), 0);
}

}  // namespace
}  // namespace lazykv::kvstore
