// A tensor-parallel group over Gloo's TCP transport (CPU all-reduce).
// Ranks find each other through a Gloo rendezvous store: each rank publishes
// its listening addresses there, then the ranks connect as a full mesh. In a
// deployment the store is the coordinator's relay (worker/service/relay_store.h,
// the JoinGroup call); in-process tests use Gloo's own HashStore.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "worker/parallel/group.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace lazykv {

struct GlooGroupOptions {
  int rank = 0;
  int world = 1;
  // Address this rank listens on for its peers (a hostname or IP that the
  // other ranks can reach).
  std::string hostname = "127.0.0.1";
  // Bound on the rendezvous and on every collective: a peer that is gone or
  // stuck turns into an Error within this time instead of a hang.
  std::chrono::milliseconds timeout{30000};
};

class GlooGroup final : public TensorParallelGroup {
 public:
  // Blocks until every rank has joined (or throws Error(kUnavailable) after
  // options.timeout). `store` is fresh for each forming of the group (keys
  // left by an earlier one would be read as the peers') and is used only
  // during construction.
  GlooGroup(const GlooGroupOptions& options, gloo::rendezvous::Store& store);
  ~GlooGroup() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void all_reduce_sum(float* data, size_t n) override;
  void broadcast(std::vector<uint8_t>& bytes, int root = 0) override;

 private:
  void check_usable() const;
  [[noreturn]] void fail(const char* what, const std::exception& e);

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::Context> context_;
  std::string broken_;  // why the group is unusable; empty while it works
};

}  // namespace lazykv
