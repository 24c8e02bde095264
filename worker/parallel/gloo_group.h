// A tensor-parallel group over Gloo's TCP transport (CPU all-reduce).
// Ranks find each other through a rendezvous directory that every rank can
// read and write (a local directory for ranks on one machine, a shared mount
// across machines): each rank publishes its listening address there, then the
// ranks connect as a full mesh.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "worker/parallel/group.h"

namespace gloo {
class Context;
}

namespace lazykv {

struct GlooGroupOptions {
  int rank = 0;
  int world = 1;
  // Rendezvous directory; created if missing. Use a fresh (empty) one for
  // each start of the group: addresses left by an earlier run would be read
  // as the peers'.
  std::string rendezvous_dir;
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
  // options.timeout).
  explicit GlooGroup(const GlooGroupOptions& options);
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
  uint32_t next_tag_ = 1;
  std::string broken_;  // why the group is unusable; empty while it works
};

}  // namespace lazykv
