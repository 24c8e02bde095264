#include "worker/service/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "common/error.h"
#include "common/random.h"
#include "worker/service/relay_store.h"
#include "worker/service/step_codec.h"

namespace lazykv {

WorkerService::WorkerService(StepExecutor& executor, WorkerServiceHooks hooks)
    : executor_(executor),
      hooks_(std::move(hooks)),
      info_(executor.info()),
      instance_id_(random_u64()),
      started_(std::chrono::steady_clock::now()) {}

grpc::Status WorkerService::Info(grpc::ServerContext*, const ::lazykv::worker::v1::InfoRequest*,
                                 ::lazykv::worker::v1::WorkerInfo* response) {
  rpc::to_proto(info_, response);
  return grpc::Status::OK;
}

grpc::Status WorkerService::Steps(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<::lazykv::worker::v1::StepResult, ::lazykv::worker::v1::StepPlan>* stream) {
  ::lazykv::worker::v1::StepPlan request;
  while (stream->Read(&request)) {
    ::lazykv::worker::v1::StepResult response;
    const grpc::Status status = run_step(request, &response);
    if (!status.ok()) return status;
    if (!stream->Write(response)) break;  // the coordinator went away
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::run_step(const ::lazykv::worker::v1::StepPlan& request,
                                     ::lazykv::worker::v1::StepResult* response) {
  StepPlan plan = rpc::from_proto(request);
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
    if (request.session() != 0 && request.session() != session_) {
      // A new coordinator: the sequences of the last one would hold KV memory
      // forever, and its ids would collide with the new one's.
      if (session_ != 0 && hooks_.release_all) {
        const int64_t held = hooks_.sequences ? hooks_.sequences() : -1;
        hooks_.release_all();
        std::fprintf(stderr,
                     "lazykv worker: plans from a new coordinator session; dropped the %lld sequences of the last "
                     "one (a worker serves one coordinator at a time)\n",
                     static_cast<long long>(held));
      }
      session_ = request.session();
    }
    result = executor_.step(plan);
    if (hooks_.sequences) sequences_ = hooks_.sequences();
  } catch (const Error& e) {
    // The executor itself is broken (or a rank has no group yet); the
    // coordinator ends the running sequences.
    const auto code = e.code() == ErrorCode::kUnavailable ? grpc::StatusCode::UNAVAILABLE : grpc::StatusCode::INTERNAL;
    return grpc::Status(code, std::string("step failed: ") + e.what());
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string("step failed (internal error): ") + e.what());
  }
  ++steps_;
  result.failed.insert(result.failed.begin(), rejected.begin(), rejected.end());
  for (const auto& r : rejected) result.invalid.push_back(r.first);  // a policy that does not validate: the request's fault
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

grpc::Status WorkerService::JoinGroup(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<::lazykv::worker::v1::GroupMessage, ::lazykv::worker::v1::GroupMessage>* stream) {
  namespace pb = ::lazykv::worker::v1;
  pb::GroupMessage first;
  if (!stream->Read(&first) || !first.has_join()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "JoinGroup starts with a GroupJoin message");
  }
  const pb::GroupJoin& join = first.join();
  const std::string self =
      "rank " + std::to_string(info_.rank) + " of " + std::to_string(info_.world) + " (lazykv worker --rank --world)";
  if (!hooks_.join || info_.world <= 1) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this worker is not a tensor-parallel rank (started with --world 1)");
  }
  if (join.rank() != info_.rank || join.world() != info_.world) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "the coordinator expects rank " + std::to_string(join.rank()) + " of " +
                            std::to_string(join.world()) + " here, but this worker is " + self +
                            ": give the coordinator one --worker per rank, in rank order");
  }
  if (join.timeout_ms() == 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "GroupJoin timeout_ms is 0");
  const std::chrono::milliseconds timeout(join.timeout_ms());

  // Phase 1: no step runs from here until the rendezvous ends. A step still
  // running (stuck in a collective of the broken group) ends within its
  // collective timeout; the peers' rendezvous clocks start only after it.
  std::unique_lock step_lock(step_mutex_, std::defer_lock);
  if (!step_lock.try_lock_for(timeout)) {
    pb::GroupMessage m;
    m.set_failed(self + " is still running a step after " + std::to_string(timeout.count()) + " ms");
    stream->Write(m);
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, m.failed());
  }
  {
    pb::GroupMessage ready;
    ready.set_ready(true);
    pb::GroupMessage start;
    if (!stream->Write(ready) || !stream->Read(&start) || !start.has_start()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator ended the rendezvous before every rank was ready");
    }
  }

  std::mutex write_mutex;  // the rendezvous thread and this one both write
  auto write = [&](const pb::GroupMessage& m) {
    std::lock_guard lock(write_mutex);
    return stream->Write(m);
  };
  RelayStore store(
      [&](const std::string& key, const std::vector<char>& value) {
        pb::GroupMessage m;
        m.mutable_entry()->set_key(key);
        m.mutable_entry()->set_value(value.data(), value.size());
        if (!write(m)) throw Error(ErrorCode::kUnavailable, "the coordinator's JoinGroup stream broke");
      },
      timeout);
  // Entries relayed from the peers; the coordinator ends its side once every
  // rank has joined (or failed), which ends this reader.
  std::thread reader([&] {
    pb::GroupMessage m;
    while (stream->Read(&m)) {
      if (m.has_entry()) store.deliver(m.entry().key(), std::vector<char>(m.entry().value().begin(), m.entry().value().end()));
    }
    store.close("the coordinator ended the rendezvous");
  });
  grpc::Status status = grpc::Status::OK;
  try {
    hooks_.join(timeout, store);
    if (hooks_.sequences) sequences_ = hooks_.sequences();
  } catch (const std::exception& e) {
    status = grpc::Status(grpc::StatusCode::UNAVAILABLE, self + " could not join its group: " + e.what());
  }
  step_lock.unlock();
  pb::GroupMessage outcome;
  if (status.ok()) {
    outcome.mutable_joined()->set_instance_id(instance_id_);
  } else {
    outcome.set_failed(status.error_message());
  }
  if (!write(outcome) && status.ok()) {
    status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator's JoinGroup stream broke");
  }
  reader.join();
  return status;
}

}  // namespace lazykv
