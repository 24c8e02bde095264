#include "worker/parallel/gloo_group.h"

#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace lazykv {
namespace {

constexpr size_t kSliceFloats = size_t(1) << 15;

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
    // Synchronous pairs: a collective reads its peers' bytes on the calling
    // thread instead of handing every message through Gloo's event-loop
    // thread. On a loopback all-reduce of one decode token's hidden state
    // that is ~10x less latency (bench/step_protocol_bench.cc), and the
    // forward pass makes two of them per layer. Not busy-polling: a waiting
    // rank gives its core to the compute threads.
    for (int peer = 0; peer < world_; ++peer) {
      if (peer != rank_) context->getPair(peer)->setSync(true, false);
    }
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
    // Every rank must end with the same bits. With two ranks the plain ring
    // gives that (each adds the other's value to its own, and IEEE addition
    // commutes) in one exchange; with more, each chunk is summed along the
    // ring by one rank and the result passed on. Synchronous pairs write
    // before they read, so a slice must fit the sockets' buffers or every
    // rank blocks in its send: sums go in slices of kSliceFloats (128 KiB),
    // the same on every rank. The algorithm objects register their buffers
    // per call (cheap next to the transfer) and work in place.
    for (size_t first = 0; first < n; first += kSliceFloats) {
      const int count = int(std::min(kSliceFloats, n - first));
      std::vector<float*> buffers{data + first};
      if (world_ == 2) {
        gloo::AllreduceRing<float> ring(context_, buffers, count);
        ring.run();
      } else {
        gloo::AllreduceRingChunked<float> ring(context_, buffers, count);
        ring.run();
      }
    }
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
      std::vector<uint64_t*> buffers{&size};
      gloo::BroadcastOneToAll<uint64_t> sizes(context_, buffers, 1, root);
      sizes.run();
    }
    if (size > uint64_t(std::numeric_limits<int>::max())) {
      throw Error(ErrorCode::kInvalidArgument, "broadcast of " + std::to_string(size) + " bytes: over 2 GiB");
    }
    if (rank_ != root) bytes.assign(size_t(size), 0);
    if (size == 0) return;
    std::vector<uint8_t*> buffers{bytes.data()};
    gloo::BroadcastOneToAll<uint8_t> payload(context_, buffers, int(bytes.size()), root);
    payload.run();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("broadcast", e);
  }
}

}  // namespace lazykv
