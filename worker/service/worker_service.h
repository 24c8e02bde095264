// The worker's gRPC face: lazykv.worker.v1.Worker over a StepExecutor (the
// in-process LocalWorker). Steps run one at a time (the executor owns one KV
// cache); Info and Heartbeat never wait for a running step, so a long step
// does not look like a dead worker.
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

namespace lazykv {

class WorkerService final : public ::lazykv::worker::v1::Worker::Service {
 public:
  // `sequences`, when given, is read after each step (under the step lock)
  // and reported by Heartbeat.
  static constexpr const char* kServiceName = "lazykv.worker.v1.Worker";  // served with common/rpc/grpc_server.h

  explicit WorkerService(StepExecutor& executor, std::function<int64_t()> sequences = {});

  grpc::Status Info(grpc::ServerContext* context, const ::lazykv::worker::v1::InfoRequest* request,
                    ::lazykv::worker::v1::WorkerInfo* response) override;
  grpc::Status Step(grpc::ServerContext* context, const ::lazykv::worker::v1::StepPlan* request,
                    ::lazykv::worker::v1::StepResult* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const ::lazykv::worker::v1::HeartbeatRequest* request,
                         ::lazykv::worker::v1::HeartbeatResponse* response) override;

  uint64_t instance_id() const { return instance_id_; }
  int64_t steps() const { return steps_.load(); }

 private:
  StepExecutor& executor_;
  std::function<int64_t()> sequences_fn_;
  const WorkerInfo info_;
  const uint64_t instance_id_;
  const std::chrono::steady_clock::time_point started_;
  std::mutex step_mutex_;  // one step at a time
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> sequences_{0};
};

// Largest message either side accepts: a step plan carries whole prompts.
inline constexpr int kMaxWorkerMessageBytes = 256 << 20;


}  // namespace lazykv
