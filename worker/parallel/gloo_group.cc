#include "worker/parallel/gloo_group.h"

#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "common/error.h"

namespace lazykv {
namespace {

constexpr uint32_t kAllReduceTag = 1;
constexpr uint32_t kBroadcastTag = 2;

std::string describe(int rank, int world) {
  return "tensor-parallel rank " + std::to_string(rank) + " of " + std::to_string(world);
}

}  // namespace

GlooGroup::GlooGroup(const GlooGroupOptions& options, gloo::rendezvous::Store& store)
    : rank_(options.rank), world_(options.world), timeout_(options.timeout) {
  if (world_ < 1 || rank_ < 0 || rank_ >= world_) {
    throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: rank " + std::to_string(rank_) +
                                                 " is outside a world of " + std::to_string(world_));
  }
  if (timeout_.count() <= 0) throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: timeout must be > 0");
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank_, world_);
    context->setTimeout(timeout_);
    context->connectFullMesh(store, device);
    context_ = std::move(context);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable, describe(rank_, world_) + ": rendezvous failed: " + e.what());
  }
}

GlooGroup::~GlooGroup() = default;

void GlooGroup::check_usable() const {
  if (!broken_.empty()) throw Error(ErrorCode::kUnavailable, describe(rank_, world_) + " is unusable: " + broken_);
}

void GlooGroup::fail(const char* what, const std::exception& e) {
  broken_ = std::string(what) + " failed: " + e.what();
  throw Error(ErrorCode::kUnavailable, describe(rank_, world_) + ": " + broken_);
}

void GlooGroup::all_reduce_sum(float* data, size_t n) {
  check_usable();
  if (world_ == 1 || n == 0) return;
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    // Ring: each segment is reduced on one rank and passed on, so every rank
    // receives the same sums.
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(kAllReduceTag);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    fail("all-reduce", e);
  }
}

void GlooGroup::broadcast(std::vector<uint8_t>& bytes, int root) {
  check_usable();
  if (root < 0 || root >= world_) {
    throw Error(ErrorCode::kInvalidArgument, "broadcast root " + std::to_string(root) + " outside the group");
  }
  if (world_ == 1) return;
  try {
    // Size first, so the receivers can make room.
    uint64_t size = rank_ == root ? uint64_t(bytes.size()) : 0;
    {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(&size, 1);
      opts.setRoot(root);
      opts.setTag(kBroadcastTag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    }
    if (rank_ != root) bytes.assign(size_t(size), 0);
    if (size == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(bytes.data(), bytes.size());
    opts.setRoot(root);
    opts.setTag(kBroadcastTag);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  } catch (const std::exception& e) {
    fail("broadcast", e);
  }
}

}  // namespace lazykv
