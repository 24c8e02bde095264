#include "worker/service/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <random>

#include "common/error.h"
#include "worker/service/step_codec.h"

namespace lazykv {

namespace {

uint64_t random_instance_id() {
  std::random_device device;
  return (uint64_t(device()) << 32) ^ uint64_t(device()) ^
         uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace

WorkerService::WorkerService(StepExecutor& executor, std::function<int64_t()> sequences)
    : executor_(executor),
      sequences_fn_(std::move(sequences)),
      info_(executor.info()),
      instance_id_(random_instance_id()),
      started_(std::chrono::steady_clock::now()) {}

grpc::Status WorkerService::Info(grpc::ServerContext*, const ::lazykv::worker::v1::InfoRequest*,
                                 ::lazykv::worker::v1::WorkerInfo* response) {
  rpc::to_proto(info_, response);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Step(grpc::ServerContext*, const ::lazykv::worker::v1::StepPlan* request,
                                 ::lazykv::worker::v1::StepResult* response) {
  StepPlan plan = rpc::from_proto(*request);
  // Sequences whose policy does not validate never reach the executor; they
  // are reported first (the scheduler keeps the first reason per sequence).
  std::vector<std::pair<SeqId, std::string>> rejected;
  std::erase_if(plan.start, [&](SequenceStart& s) {
    try {
      s.policy = rpc::validate_policy(s.policy);
      return false;
    } catch (const Error& e) {
      rejected.emplace_back(s.seq, e.what());
      return true;
    }
  });
  if (!rejected.empty()) {
    std::erase_if(plan.items, [&](const StepItem& it) {
      return std::any_of(rejected.begin(), rejected.end(), [&](const auto& r) { return r.first == it.seq; });
    });
  }
  StepResult result;
  try {
    std::lock_guard lock(step_mutex_);
    result = executor_.step(plan);
    if (sequences_fn_) sequences_ = sequences_fn_();
  } catch (const Error& e) {
    // The executor itself is broken; the coordinator ends the running sequences.
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string("step failed: ") + e.what());
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string("step failed (internal error): ") + e.what());
  }
  ++steps_;
  result.failed.insert(result.failed.begin(), rejected.begin(), rejected.end());
  rpc::to_proto(result, response);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Heartbeat(grpc::ServerContext*, const ::lazykv::worker::v1::HeartbeatRequest*,
                                      ::lazykv::worker::v1::HeartbeatResponse* response) {
  response->set_instance_id(instance_id_);
  response->set_uptime_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
  response->set_steps(steps_.load());
  response->set_sequences(sequences_.load());
  return grpc::Status::OK;
}

}  // namespace lazykv
