// Choosing and forming a tensor-parallel group's collective: ranks as threads
// meeting through Gloo's HashStore, as in group_test.cc. NCCL itself runs only
// on a CUDA device (tests/unit/cuda/nccl_group_test.cc); here it is the
// refusals that every machine can check.
#include "worker/parallel/collective.h"

#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <optional>
#include <thread>
#include <vector>

#include "../error_code_of.h"
#include "common/error.h"

namespace lazykv {
namespace {

using namespace std::chrono_literals;

bool cuda_device_present() {
  if (!nccl_built()) return false;
  GroupSpec spec;
  spec.collective = Collective::kNccl;
  return code_of([&] { check_collective(spec); }) == std::nullopt;
}

TEST(Collective, ParsesItsTwoNamesAndListsThemForAnyOther) {
  EXPECT_EQ(parse_collective("gloo"), Collective::kGloo);
  EXPECT_EQ(parse_collective("nccl"), Collective::kNccl);
  EXPECT_STREQ(collective_name(Collective::kGloo), "gloo");
  EXPECT_STREQ(collective_name(Collective::kNccl), "nccl");
  std::string message;
  EXPECT_EQ(code_of([] { parse_collective("mpi"); }, &message), ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("'mpi'"), std::string::npos) << message;
  EXPECT_NE(message.find("gloo, nccl"), std::string::npos) << message;
  EXPECT_EQ(code_of([] { parse_collective("NCCL"); }), ErrorCode::kInvalidArgument);
}

TEST(Collective, GlooNeedsNoDevice) {
  GroupSpec spec;
  spec.cuda_device = 3;  // ignored: Gloo runs on the CPU
  EXPECT_EQ(check_collective(spec), -1);
}

TEST(Collective, NcclWithoutADeviceOrWithoutTheBuildIsRefusedSayingWhy) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is present: NCCL would be usable";
  GroupSpec spec;
  spec.collective = Collective::kNccl;
  std::string message;
  EXPECT_EQ(code_of([&] { check_collective(spec); }, &message), ErrorCode::kUnavailable);
  if (nccl_built()) {
    EXPECT_NE(message.find("no CUDA device is usable"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("built without NCCL"), std::string::npos) << message;
  }
  spec.cuda_device = -2;
  EXPECT_EQ(code_of([&] { check_collective(spec); }), ErrorCode::kInvalidArgument);
}

TEST(Collective, NcclPicksTheRanksDeviceAndRefusesOneThatIsMissing) {
  if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
  GroupSpec spec;
  spec.collective = Collective::kNccl;
  EXPECT_EQ(check_collective(spec), 0);
  spec.cuda_device = 1 << 20;
  std::string message;
  EXPECT_EQ(code_of([&] { check_collective(spec); }, &message), ErrorCode::kUnavailable);
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
}

// Runs form_group on one thread per spec; the groups' sums of (rank + 1), or
// each rank's error code and message.
struct Formed {
  std::vector<float> sums;
  std::vector<std::optional<ErrorCode>> codes;
  std::vector<std::string> messages;
};

Formed form_and_sum(const std::vector<GroupSpec>& specs) {
  gloo::rendezvous::HashStore store;
  Formed formed{std::vector<float>(specs.size(), 0.0f), std::vector<std::optional<ErrorCode>>(specs.size()),
                std::vector<std::string>(specs.size())};
  std::vector<std::thread> threads;
  for (size_t r = 0; r < specs.size(); ++r) {
    threads.emplace_back([&, r] {
      formed.codes[r] = code_of(
          [&] {
            std::unique_ptr<TensorParallelGroup> group = form_group(specs[r], store);
            float value = float(r + 1);
            group->all_reduce_sum(&value, 1);
            formed.sums[r] = value;
          },
          &formed.messages[r]);
    });
  }
  for (std::thread& t : threads) t.join();
  return formed;
}

std::vector<GroupSpec> specs_of(std::vector<Collective> collectives) {
  std::vector<GroupSpec> specs;
  for (size_t r = 0; r < collectives.size(); ++r) {
    GroupSpec spec;
    spec.collective = collectives[r];
    spec.rank = int(r);
    spec.world = int(collectives.size());
    spec.timeout = 10s;
    specs.push_back(spec);
  }
  return specs;
}

TEST(Collective, RanksThatAgreeOnGlooFormAGroup) {
  const Formed formed = form_and_sum(specs_of({Collective::kGloo, Collective::kGloo, Collective::kGloo}));
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(formed.codes[r], std::nullopt) << formed.messages[r];
    EXPECT_EQ(formed.sums[r], 6.0f);
  }
}

TEST(Collective, RanksThatDisagreeEachSaySoInsteadOfWaiting) {
  const auto start = std::chrono::steady_clock::now();
  const Formed formed = form_and_sum(specs_of({Collective::kGloo, Collective::kNccl}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "a mismatch must not wait for the timeout";
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(formed.codes[r], ErrorCode::kInvalidArgument) << formed.messages[r];
    EXPECT_NE(formed.messages[r].find("every rank of a group must use the same one"), std::string::npos)
        << formed.messages[r];
  }
  EXPECT_NE(formed.messages[0].find("rank 0 uses --collective gloo but rank 1 uses nccl"), std::string::npos)
      << formed.messages[0];
  EXPECT_NE(formed.messages[1].find("rank 1 uses --collective nccl but rank 0 uses gloo"), std::string::npos)
      << formed.messages[1];
}

TEST(Collective, ARankWhosePeersNeverComeTimesOut) {
  GroupSpec spec;
  spec.world = 2;
  spec.timeout = 300ms;
  gloo::rendezvous::HashStore store;
  std::string message;
  EXPECT_EQ(code_of([&] { form_group(spec, store); }, &message), ErrorCode::kUnavailable);
  EXPECT_NE(message.find("rendezvous failed"), std::string::npos) << message;
}

TEST(Collective, ARankOutsideItsWorldIsRefused) {
  GroupSpec spec;
  spec.rank = 2;
  spec.world = 2;
  gloo::rendezvous::HashStore store;
  EXPECT_EQ(code_of([&] { form_group(spec, store); }), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace lazykv
