// The coordinator's side of a tensor-parallel group's rendezvous: it opens
// JoinGroup (lazykv.worker.v1) on every rank, tells each its rank, and relays
// every rendezvous entry a rank writes to all the others until each rank has
// joined or failed. The ranks need no shared directory or store of their
// own, and a restarted rank is taken back by forming the group again.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace grpc {
class Channel;
}

namespace lazykv {

struct GroupRank {
  std::shared_ptr<grpc::Channel> channel;
  std::string name;  // in errors: "worker HOST:PORT"
};

// `ranks` in rank order. Returns once every rank has joined, with each
// rank's instance id (its process, as its heartbeats report it); throws
// Error(kUnavailable) naming each rank that failed or did not answer in time.
// A rank still running a step gets `timeout` to finish it before the
// rendezvous starts; the rendezvous then gets `timeout` of its own. Every rank
// drops the sequences it held.
std::vector<uint64_t> form_tensor_parallel_group(const std::vector<GroupRank>& ranks,
                                                 std::chrono::milliseconds timeout);

}  // namespace lazykv
