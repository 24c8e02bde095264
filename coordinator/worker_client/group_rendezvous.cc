#include "coordinator/worker_client/group_rendezvous.h"

#include <grpcpp/grpcpp.h>

#include <mutex>
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
  bool joined = false;
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
};

}  // namespace

void form_tensor_parallel_group(const std::vector<GroupRank>& ranks, std::chrono::milliseconds timeout) {
  const size_t world = ranks.size();
  if (world == 0) throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: no ranks");
  if (timeout.count() <= 0) throw Error(ErrorCode::kInvalidArgument, "tensor-parallel group: timeout must be > 0");
  // The ranks time their own rendezvous; the calls get a little longer so a
  // rank's own error (not our deadline) is what comes back.
  const auto deadline = std::chrono::system_clock::now() + timeout + std::chrono::seconds(5);
  std::vector<std::unique_ptr<Link>> links;
  for (size_t r = 0; r < world; ++r) {
    auto link = std::make_unique<Link>();
    link->stub = pb::Worker::NewStub(ranks[r].channel);
    link->context.set_deadline(deadline);
    link->stream = link->stub->JoinGroup(&link->context);
    links.push_back(std::move(link));
  }
  // Every rank learns its place before any entry is relayed.
  for (size_t r = 0; r < world; ++r) {
    pb::GroupMessage m;
    m.mutable_join()->set_rank(int32_t(r));
    m.mutable_join()->set_world(int32_t(world));
    m.mutable_join()->set_timeout_ms(uint32_t(timeout.count()));
    links[r]->write(m);
  }
  std::vector<std::thread> relays;
  for (size_t r = 0; r < world; ++r) {
    relays.emplace_back([&, r] {
      Link& self = *links[r];
      pb::GroupMessage m;
      while (self.stream->Read(&m)) {
        if (m.has_entry()) {
          for (size_t q = 0; q < world; ++q) {
            if (q != r) links[q]->write(m);
          }
        } else if (m.has_joined()) {
          self.joined = true;
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
  }
  for (std::thread& t : relays) t.join();
  std::string errors;
  for (size_t r = 0; r < world; ++r) {
    links[r]->close();
    const grpc::Status status = links[r]->stream->Finish();
    if (links[r]->joined) continue;
    std::string why = links[r]->failure;
    if (why.empty()) {
      why = status.ok() ? "ended the rendezvous without joining" : status.error_message();
      if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) why = "did not join in time";
    }
    errors += (errors.empty() ? "" : "; ") + ranks[r].name + " (rank " + std::to_string(r) + "): " + why;
  }
  if (!errors.empty()) throw Error(ErrorCode::kUnavailable, "the tensor-parallel group did not form: " + errors);
}

}  // namespace lazykv
