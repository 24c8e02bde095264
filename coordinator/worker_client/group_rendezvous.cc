#include "coordinator/worker_client/group_rendezvous.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>

#include "common/error.h"
#include "lazykv/worker/v1/worker.grpc.pb.h"

namespace lazykv {
namespace {

namespace pb = ::lazykv::worker::v1;

// One rank's JoinGroup call. Writes come from every rank's relay thread, so
// they are serialised; reads only from this rank's own thread.
struct Link {
  std::unique_ptr<pb::Worker::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<pb::GroupMessage, pb::GroupMessage>> stream;
  std::mutex write_mutex;
  bool writes_done = false;
  bool ready = false;
  bool joined = false;
  uint64_t instance_id = 0;
  std::string failure;  // the rank's own reason, when it sent one

  void write(const pb::GroupMessage& m) {
    std::lock_guard lock(write_mutex);
    if (!writes_done) stream->Write(m);  // a broken stream shows in Finish
  }
  void close() {
    std::lock_guard lock(write_mutex);
    if (!writes_done) stream->WritesDone();
    writes_done = true;
  }
  // Ends the call once (gRPC allows one Finish) and returns its status.
  const grpc::Status& finish() {
    if (!status) {
      close();
      status = stream->Finish();
    }
    return *status;
  }
  std::optional<grpc::Status> status;
};

using Links = std::vector<std::unique_ptr<Link>>;

// Runs body(r) for every rank on its own thread and waits for all of them.
template <typename Body>
void for_each_rank(size_t world, Body body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < world; ++r) threads.emplace_back([&body, r] { body(r); });
  for (std::thread& t : threads) t.join();
}

// Ends every call and throws naming each rank that did not get to `joined`
// (its own reason first, else the call's status).
// After a failed phase 1 only the rank that ended it and those that were not
// ready are named: the ready ones were stopped because of another rank.
void finish(const Links& links, const std::vector<GroupRank>& ranks, bool phase1_failed,
            size_t phase1_culprit = SIZE_MAX) {
  std::string errors;
  for (size_t r = 0; r < links.size(); ++r) {
    const grpc::Status status = links[r]->finish();
    if (links[r]->joined) continue;
    std::string why = links[r]->failure;
    if (why.empty()) {
      if (phase1_failed && r != phase1_culprit &&
          (links[r]->ready || status.error_code() == grpc::StatusCode::CANCELLED)) {
        continue;
      }
      why = status.ok() ? "ended the rendezvous without joining" : status.error_message();
      if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        why = links[r]->ready ? "did not join in time" : "did not become ready in time (still running a step?)";
      }
    }
    errors += (errors.empty() ? "" : "; ") + ranks[r].name + " (rank " + std::to_string(r) + "): " + why;
  }
  if (phase1_failed && errors.empty()) errors = "a rank ended the formation before every rank was ready";
  if (!errors.empty()) throw Error(ErrorCode::kUnavailable, "the tensor-parallel group did not form: " + errors);
}

}  // namespace

std::vector<uint64_t> form_tensor_parallel_group(const std::vector<GroupRank>& ranks,
                                                 std::chrono::milliseconds timeout) {
  const size_t world = ranks.size();
  if (world == 0) throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: no ranks");
  if (timeout.count() <= 0) throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: timeout must be > 0");
  // Each phase is timed by the ranks themselves (a rank waits `timeout` for
  // its running step, then `timeout` for its peers); the calls get a little
  // longer so that a rank's own error, not our deadline, is what comes back.
  const auto deadline = std::chrono::system_clock::now() + 2 * timeout + std::chrono::seconds(5);
  Links links;
  for (size_t r = 0; r < world; ++r) {
    auto link = std::make_unique<Link>();
    link->stub = pb::Worker::NewStub(ranks[r].channel);
    link->context.set_deadline(deadline);
    link->stream = link->stub->JoinGroup(&link->context);
    links.push_back(std::move(link));
  }
  for (size_t r = 0; r < world; ++r) {
    pb::GroupMessage m;
    m.mutable_join()->set_rank(int32_t(r));
    m.mutable_join()->set_world(int32_t(world));
    m.mutable_join()->set_timeout_ms(uint32_t(timeout.count()));
    links[r]->write(m);
  }

  // Phase 1: every rank ready. A rank that fails cancels every call, so the
  // others stop waiting.
  std::atomic<bool> phase1_failed{false};
  size_t culprit = SIZE_MAX;  // the first rank that failed phase 1
  for_each_rank(world, [&](size_t r) {
    Link& self = *links[r];
    pb::GroupMessage m;
    if (self.stream->Read(&m)) {
      if (m.has_ready()) {
        self.ready = true;
        return;
      }
      self.failure = m.has_failed() ? m.failed() : "answered the join with something other than ready";
    } else {
      self.finish();  // its status, before a cancel could hide it
    }
    if (!phase1_failed.exchange(true)) {
      culprit = r;
      for (auto& link : links) link->context.TryCancel();
    }
  });
  if (phase1_failed) finish(links, ranks, /*phase1_failed=*/true, culprit);

  // Phase 2: the rendezvous, every entry relayed to every other rank.
  for (size_t r = 0; r < world; ++r) {
    pb::GroupMessage m;
    m.set_start(true);
    links[r]->write(m);
  }
  for_each_rank(world, [&](size_t r) {
    Link& self = *links[r];
    pb::GroupMessage m;
    while (self.stream->Read(&m)) {
      if (m.has_entry()) {
        for (size_t q = 0; q < world; ++q) {
          if (q != r) links[q]->write(m);
        }
      } else if (m.has_joined()) {
        self.joined = true;
        self.instance_id = m.joined().instance_id();
        break;
      } else if (m.has_failed()) {
        self.failure = m.failed();
        break;
      }
    }
    // A rank that failed will never publish the rest: end every call, so
    // the ranks still waiting for its entries fail now, not at the timeout.
    if (!self.joined) {
      for (auto& link : links) link->close();
    }
  });
  finish(links, ranks, /*phase1_failed=*/false);
  std::vector<uint64_t> instances;
  for (const auto& link : links) instances.push_back(link->instance_id);
  return instances;
}

}  // namespace lazykv
