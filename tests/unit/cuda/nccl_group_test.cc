// The NCCL communicator against the CPU reference: sums and broadcasts must
// equal what the Gloo group computes. Ranks are threads, one CUDA device
// each, meeting through Gloo's HashStore like the CPU tests. Skips itself
// without a CUDA device (a group of two needs two devices: NCCL refuses two
// ranks on one GPU); compiled only where NCCL is found.
#ifdef LAZYKV_HAVE_NCCL

#include "worker/parallel/nccl/nccl_group.h"

#include <cuda_runtime_api.h>
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/error.h"
#include "kernels/cuda/ops.h"

namespace lazykv {
namespace {

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

TEST(NcclGroup, AGroupOfOneLeavesDataAsItIs) {
  if (!cuda::cuda_device_available()) GTEST_SKIP() << "no CUDA device: NCCL is not exercised";
  gloo::rendezvous::HashStore store;
  NcclGroup group(NcclGroupOptions{}, store);
  std::vector<float> data = {1.5f, -2.0f, 3.25f};
  group.all_reduce_sum(data.data(), data.size());
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  std::vector<uint8_t> bytes = {1, 2, 3};
  group.broadcast(bytes, 0);
  EXPECT_EQ(bytes, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_THROW(group.broadcast(bytes, 1), Error);
}

TEST(NcclGroup, TwoRanksSumHostAndDeviceDataAndBroadcast) {
  if (!cuda::cuda_device_available() || device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> sums(2);
  std::vector<std::vector<uint8_t>> received(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  const size_t n = 100'003;  // not a multiple of any chunk size
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        NcclGroupOptions options;
        options.rank = r;
        options.world = 2;
        options.device = r;
        options.timeout = std::chrono::seconds(60);
        NcclGroup group(options, store);
        std::vector<float> data(n);
        for (size_t i = 0; i < n; ++i) data[i] = float(i % 97) * (r == 0 ? 1.0f : 0.5f);
        group.all_reduce_sum(data.data(), n);
        sums[size_t(r)] = data;
        std::vector<uint8_t> bytes;
        if (r == 1) bytes.assign(5000, 7);
        group.broadcast(bytes, 1);
        received[size_t(r)] = bytes;
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(sums[0][i], float(i % 97) * 1.5f) << i;
  }
  EXPECT_EQ(sums[0], sums[1]);
  EXPECT_EQ(received[0], std::vector<uint8_t>(5000, 7));
}

TEST(NcclGroup, ARankWhosePeerNeverComesTimesOut) {
  if (!cuda::cuda_device_available()) GTEST_SKIP() << "no CUDA device: NCCL is not exercised";
  gloo::rendezvous::HashStore store;
  NcclGroupOptions options;
  options.rank = 0;  // publishes its id; rank 1 never initialises
  options.world = 2;
  options.timeout = std::chrono::milliseconds(500);
  const auto start = std::chrono::steady_clock::now();
  try {
    NcclGroup group(options, store);
    FAIL() << "a group of two formed with one rank";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("timed out"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

}  // namespace
}  // namespace lazykv

#endif  // LAZYKV_HAVE_NCCL
