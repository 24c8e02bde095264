// Choosing where the forward pass runs: names, the checks made before a model
// loads, and the CPU pass the factory makes. The CUDA pass itself is compared
// with the CPU one in tests/unit/cuda (where a device is present).
#include "worker/compute_device.h"

#include <gtest/gtest.h>

#include <string>

#include "../error_code_of.h"
#include "../tiny_model_fixture.h"
#include "common/error.h"

namespace lazykv {
namespace {

bool cuda_device_present() {
  return code_of([] { check_compute_device(ComputeDevice::kCuda, -1, 0); }) == std::nullopt;
}

TEST(ComputeDevice, NamesRoundTripAndUnknownOnesListTheValid) {
  EXPECT_EQ(parse_compute_device("cpu"), ComputeDevice::kCpu);
  EXPECT_EQ(parse_compute_device("cuda"), ComputeDevice::kCuda);
  EXPECT_STREQ(compute_device_name(ComputeDevice::kCuda), "cuda");
  std::string message;
  EXPECT_EQ(code_of([] { parse_compute_device("tpu"); }, &message), ErrorCode::kInvalidArgument);
  EXPECT_EQ(message, "unknown device 'tpu': use cpu or cuda");
}

TEST(ComputeDevice, TheCpuNeedsNothing) {
  EXPECT_EQ(check_compute_device(ComputeDevice::kCpu, 7, 3), -1);
}

TEST(ComputeDevice, CudaWithoutADeviceOrWithoutTheBuildIsRefusedSayingWhy) {
  if (cuda_device_present()) GTEST_SKIP() << "a CUDA device is present";
  std::string message;
  EXPECT_EQ(code_of([] { check_compute_device(ComputeDevice::kCuda, -1, 0); }, &message), ErrorCode::kUnavailable);
  if (cuda_backend_built()) {
    EXPECT_NE(message.find("--device cuda: no CUDA device is usable"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("built without the CUDA backend"), std::string::npos) << message;
  }
  EXPECT_EQ(code_of([] { check_compute_device(ComputeDevice::kCuda, -2, 0); }), ErrorCode::kInvalidArgument);
  // The factory refuses the same way rather than failing later.
  TinyModel m = load_tiny_model("compute_device");
  ModelShard shard(*m.model, 0, 1);
  SoloGroup solo;
  const ModelConfig& c = shard.config();
  KvCache cache({c.n_layer, c.n_head_kv, c.head_dim, 16, 0});
  ThreadPool pool(1);
  EXPECT_EQ(code_of([&] {
              make_forward_backend(ComputeDevice::kCuda, 0, shard, solo, cache, pool, cpu::ActivationPrecision::kF32);
            }),
            ErrorCode::kUnavailable);
}

TEST(ComputeDevice, TheCpuBackendIsTheForwardPass) {
  TinyModel m = load_tiny_model("compute_device_cpu");
  ModelShard shard(*m.model, 0, 1);
  SoloGroup solo;
  const ModelConfig& c = shard.config();
  KvCache a({c.n_layer, c.n_head_kv, c.head_dim, 16, 0}), b({c.n_layer, c.n_head_kv, c.head_dim, 16, 0});
  ThreadPool pool(1);
  const auto backend =
      make_forward_backend(ComputeDevice::kCpu, -1, shard, solo, a, pool, cpu::ActivationPrecision::kF32);
  ForwardPass direct(*m.model, b, pool);
  a.add_sequence(1);
  b.add_sequence(1);
  const std::vector<int32_t> prompt{5, 9, 17, 3};
  BatchItem item{1, prompt, 0, false};
  const auto x = backend->run({&item, 1});
  const std::vector<float> from_backend(x.begin(), x.end());
  const auto y = direct.run({&item, 1});
  EXPECT_EQ(from_backend, std::vector<float>(y.begin(), y.end()));
}

}  // namespace
}  // namespace lazykv
