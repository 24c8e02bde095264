// The worker's gRPC face: lazykv.worker.v1.Worker over a StepExecutor (the
// in-process LocalWorker). Steps run one at a time (the executor owns one KV
// cache); Info and Heartbeat never wait for a running step, so a long step
// does not look like a dead worker. A tensor-parallel rank also answers
// JoinGroup: the coordinator relays the ranks' rendezvous entries and the
// `join` function forms the group, under the step lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "lazykv/worker/v1/worker.grpc.pb.h"
#include "worker/step_executor.h"

namespace gloo::rendezvous {
class Store;
}

namespace lazykv {

// Forms this rank's group through `store` (its peers' entries relayed by the
// coordinator), replacing any group it was in and dropping the sequences it
// held. Throws Error when the group does not form within `timeout`.
using JoinGroupFn = std::function<void(std::chrono::milliseconds timeout, gloo::rendezvous::Store& store)>;

// What the service needs of the worker beside its StepExecutor; each optional.
struct WorkerServiceHooks {
  std::function<int64_t()> sequences;  // sequences held: read after each step (under the step lock) for Heartbeat
  std::function<void()> release_all;   // drops every sequence: run when plans come from a new coordinator session
  JoinGroupFn join;                    // on a tensor-parallel rank (the executor's info().world > 1)
};

class WorkerService final : public ::lazykv::worker::v1::Worker::Service {
 public:
  static constexpr const char* kServiceName = "lazykv.worker.v1.Worker";  // served with common/rpc/grpc_server.h

  explicit WorkerService(StepExecutor& executor, WorkerServiceHooks hooks = {});

  grpc::Status Info(grpc::ServerContext* context, const ::lazykv::worker::v1::InfoRequest* request,
                    ::lazykv::worker::v1::WorkerInfo* response) override;
  grpc::Status Steps(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<::lazykv::worker::v1::StepResult, ::lazykv::worker::v1::StepPlan>* stream) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const ::lazykv::worker::v1::HeartbeatRequest* request,
                         ::lazykv::worker::v1::HeartbeatResponse* response) override;
  grpc::Status JoinGroup(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<::lazykv::worker::v1::GroupMessage, ::lazykv::worker::v1::GroupMessage>* stream)
      override;

  uint64_t instance_id() const { return instance_id_; }
  int64_t steps() const { return steps_.load(); }

 private:
  grpc::Status run_step(const ::lazykv::worker::v1::StepPlan& request, ::lazykv::worker::v1::StepResult* response);

  StepExecutor& executor_;
  const WorkerServiceHooks hooks_;
  const WorkerInfo info_;
  const uint64_t instance_id_;
  const std::chrono::steady_clock::time_point started_;
  std::timed_mutex step_mutex_;  // one step (or group formation) at a time
  uint64_t session_ = 0;         // the coordinator session of the last plan (under step_mutex_)
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> sequences_{0};
};

// Largest message either side accepts: a step plan carries whole prompts.
inline constexpr int kMaxWorkerMessageBytes = 256 << 20;


}  // namespace lazykv
