#include "coordinator/worker_client/remote_worker.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <vector>

#include "common/metrics/metric_names.h"
#include "common/random.h"
#include "worker/service/step_codec.h"
#include "worker/service/worker_service.h"

namespace lazykv {

namespace pb = ::lazykv::worker::v1;
using Clock = std::chrono::steady_clock;

struct RemoteWorker::Stub {
  std::unique_ptr<pb::Worker::Stub> stub;
  // The open Steps stream (used by the scheduler's thread only); none before
  // the first step and after a broken one.
  std::unique_ptr<grpc::ClientContext> steps_context;
  std::unique_ptr<grpc::ClientReaderWriter<pb::StepPlan, pb::StepResult>> steps;
};

namespace {

std::string status_text(const grpc::Status& status) {
  std::string code;
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE: code = "unavailable"; break;
    case grpc::StatusCode::DEADLINE_EXCEEDED: code = "deadline exceeded"; break;
    case grpc::StatusCode::CANCELLED: code = "cancelled"; break;
    case grpc::StatusCode::INTERNAL: code = "internal"; break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: code = "resource exhausted"; break;
    case grpc::StatusCode::UNIMPLEMENTED: code = "unimplemented (not a lazykv worker?)"; break;
    default: code = "grpc code " + std::to_string(int(status.error_code())); break;
  }
  return status.error_message().empty() ? code : code + ": " + status.error_message();
}

std::string seconds_text(std::chrono::milliseconds ms) {
  const double s = double(ms.count()) / 1000.0;
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

// gRPC deadlines are wall-clock time points.
std::chrono::system_clock::time_point deadline_after(Clock::duration d) {
  return std::chrono::system_clock::now() + std::chrono::duration_cast<std::chrono::system_clock::duration>(d);
}

bool same_shape(const WorkerInfo& a, const WorkerInfo& b) {
  return a.n_ctx == b.n_ctx && a.n_vocab == b.n_vocab && a.kv_capacity_bytes == b.kv_capacity_bytes &&
         a.kv_bytes_per_token == b.kv_bytes_per_token && a.kv_page_bytes == b.kv_page_bytes &&
         a.page_slots == b.page_slots && a.n_layer == b.n_layer && a.n_head_kv == b.n_head_kv &&
         a.n_group == b.n_group && a.rank == b.rank && a.world == b.world &&
         a.unavailable_policies == b.unavailable_policies;
}

}  // namespace

RemoteWorker::RemoteWorker(const std::string& address, const RemoteWorkerOptions& options)
    : address_(address), options_(options), session_(random_u64() | 1) {
  const size_t colon = address_.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address_.size()) {
    throw Error(ErrorCode::kInvalidArgument, "worker address '" + address_ + "' is not HOST:PORT");
  }
  if (options_.heartbeat_interval.count() <= 0) {
    throw Error(ErrorCode::kInvalidArgument, "the heartbeat interval must be > 0");
  }
  if (options_.heartbeat_misses < 1) throw Error(ErrorCode::kInvalidArgument, "heartbeat misses must be >= 1");
  if (options_.step_timeout.count() <= 0) throw Error(ErrorCode::kInvalidArgument, "the step timeout must be > 0");

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxWorkerMessageBytes);
  args.SetMaxSendMessageSize(kMaxWorkerMessageBytes);
  // Reconnect quickly to a restarted worker (gRPC's default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(address_, grpc::InsecureChannelCredentials(), args);
  stub_ = std::make_unique<Stub>();
  stub_->stub = pb::Worker::NewStub(channel_);

  // Connect: Info, waiting for the channel, retried with backoff until the timeout.
  const auto deadline = Clock::now() + options_.connect_timeout;
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(deadline_after(std::min<Clock::duration>(deadline - Clock::now(), std::chrono::seconds(2))));
    pb::WorkerInfo reply;
    const grpc::Status status = stub_->stub->Info(&context, pb::InfoRequest(), &reply);
    if (status.ok()) {
      info_ = rpc::from_proto(reply);
      break;
    }
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) throw unavailable(status_text(status));
    if (Clock::now() >= deadline) {
      throw unavailable("did not answer within " + seconds_text(options_.connect_timeout) + " (" +
                        status_text(status) + ")");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
  uint64_t instance = 0;
  if (heartbeat_once(&instance)) instance_id_ = instance;
  if (options_.metrics) options_.metrics->gauge(metrics::kWorkerUp, {options_.label}).set(1);
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

RemoteWorker::~RemoteWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (stub_ && stub_->steps) {
    stub_->steps_context->TryCancel();
    stub_->steps->Finish();
  }
}

WorkerInfo RemoteWorker::info() const { return info_; }

Error RemoteWorker::unavailable(const std::string& why) const {
  return Error(ErrorCode::kUnavailable, "worker " + address_ + ": " + why);
}

StepResult RemoteWorker::step(const StepPlan& plan) {
  const bool release_only = plan.start.empty() && plan.items.empty();
  auto defer = [&] {
    std::lock_guard lock(mutex_);
    deferred_release_.insert(plan.release.begin(), plan.release.end());
    return StepResult{};
  };
  const std::string dead_reason = "declared dead (missed " + std::to_string(options_.heartbeat_misses) +
                                  " heartbeats, one every " + seconds_text(options_.heartbeat_interval) + ")";
  if (!alive_) {
    if (release_only) return defer();
    throw unavailable(dead_reason);
  }

  pb::StepPlan request;
  rpc::to_proto(plan, &request);
  request.set_session(session_);
  std::vector<SeqId> deferred;
  {
    std::lock_guard lock(mutex_);
    deferred.assign(deferred_release_.begin(), deferred_release_.end());
  }
  for (SeqId seq : deferred) {
    if (std::find(plan.release.begin(), plan.release.end(), seq) == plan.release.end()) request.add_release(seq);
  }
  auto open_stream = [&] {
    {
      // The heartbeat thread may cancel in_flight_: never leave it pointing
      // at a context about to be freed.
      std::lock_guard lock(mutex_);
      in_flight_ = nullptr;
    }
    stub_->steps.reset();
    stub_->steps_context = std::make_unique<grpc::ClientContext>();
    stub_->steps = stub_->stub->Steps(stub_->steps_context.get());
    std::lock_guard lock(mutex_);
    in_flight_ = stub_->steps_context.get();
  };
  const bool reused = stub_->steps != nullptr;
  if (!reused) open_stream();
  bool declared_dead = false;
  {
    std::lock_guard lock(mutex_);
    in_flight_ = stub_->steps_context.get();
    step_deadline_ = Clock::now() + options_.step_timeout;
    step_timed_out_ = false;
    // Declared dead since the check above: set_alive found no step to cancel,
    // and a hung worker would hold this one until its deadline.
    declared_dead = !alive_;
    if (declared_dead) in_flight_ = nullptr;
  }
  if (declared_dead) {
    if (release_only) return defer();
    throw unavailable(dead_reason);
  }
  wake_.notify_all();  // the heartbeat thread watches the deadline
  bool written = stub_->steps->Write(request);
  bool retry = false;
  {
    std::lock_guard lock(mutex_);
    retry = !written && reused && !step_timed_out_ && alive_;
  }
  if (retry) {
    // The stream broke while idle (the worker restarted, a connection
    // dropped): this plan never reached the worker, so it goes once more on a
    // new stream.
    stub_->steps->Finish();
    open_stream();
    written = stub_->steps->Write(request);
  }
  pb::StepResult reply;
  const bool ok = written && stub_->steps->Read(&reply);
  bool timed_out = false;
  {
    std::lock_guard lock(mutex_);
    in_flight_ = nullptr;
    timed_out = step_timed_out_;
    if (ok) {
      for (SeqId seq : deferred) deferred_release_.erase(seq);
    }
  }
  if (ok) return rpc::from_proto(reply);
  // The stream is over: its status says why; the next step opens a new one.
  const grpc::Status status = stub_->steps->Finish();
  {
    std::lock_guard lock(mutex_);
    in_flight_ = nullptr;
  }
  stub_->steps.reset();
  stub_->steps_context.reset();
  if (release_only) return defer();
  if (timed_out) throw unavailable("the step passed its deadline of " + seconds_text(options_.step_timeout));
  if (status.error_code() == grpc::StatusCode::CANCELLED && !alive_) throw unavailable(dead_reason);
  if (status.ok()) throw unavailable("the worker ended the step stream");
  throw unavailable(status_text(status));
}

bool RemoteWorker::heartbeat_once(uint64_t* instance) {
  grpc::ClientContext context;
  const auto timeout =
      options_.heartbeat_timeout.count() > 0 ? options_.heartbeat_timeout : options_.heartbeat_interval;
  context.set_deadline(deadline_after(std::max(timeout, std::chrono::milliseconds(100))));
  pb::HeartbeatResponse reply;
  const grpc::Status status = stub_->stub->Heartbeat(&context, pb::HeartbeatRequest(), &reply);
  if (!status.ok()) return false;
  *instance = reply.instance_id();
  return true;
}

void RemoteWorker::set_alive(bool alive, const std::string& why) {
  alive_ = alive;
  if (options_.metrics) options_.metrics->gauge(metrics::kWorkerUp, {options_.label}).set(alive ? 1 : 0);
  if (!alive) {
    // A step waiting on a hung worker ends now rather than at its deadline.
    std::lock_guard lock(mutex_);
    if (in_flight_) in_flight_->TryCancel();
  }
  if (options_.log) options_.log("worker " + address_ + (alive ? " is up: " : " is down: ") + why);
  if (options_.on_alive_change) options_.on_alive_change(alive);
}

void RemoteWorker::heartbeat_loop() {
  int misses = 0;
  std::unique_lock lock(mutex_);
  auto next_beat = Clock::now() + options_.heartbeat_interval;
  for (;;) {
    // Wake for the next heartbeat, or earlier for a running step's deadline
    // (step() notifies when it starts one).
    const bool watching = in_flight_ != nullptr && !step_timed_out_;
    wake_.wait_until(lock, watching ? std::min(next_beat, step_deadline_) : next_beat);
    if (stopping_) return;
    if (in_flight_ != nullptr && !step_timed_out_ && Clock::now() >= step_deadline_) {
      step_timed_out_ = true;
      in_flight_->TryCancel();
    }
    if (Clock::now() < next_beat) continue;
    next_beat = Clock::now() + options_.heartbeat_interval;
    lock.unlock();
    uint64_t instance = 0;
    if (heartbeat_once(&instance)) {
      misses = 0;
      const uint64_t known = instance_id_.exchange(instance);
      const bool restarted = known != 0 && known != instance;
      if (restarted) {
        {
          std::lock_guard guard(mutex_);
          deferred_release_.clear();  // the new process holds none of them
        }
        if (options_.log) options_.log("worker " + address_ + " restarted (a new process; its sequences are gone)");
        grpc::ClientContext context;
        context.set_deadline(deadline_after(std::max(options_.heartbeat_interval, std::chrono::milliseconds(1000))));
        pb::WorkerInfo reply;
        if (stub_->stub->Info(&context, pb::InfoRequest(), &reply).ok() &&
            !same_shape(rpc::from_proto(reply), info_) && options_.log) {
          options_.log("warning: worker " + address_ +
                       " restarted with a different model, context or KV cache; the coordinator still plans with "
                       "the first one's limits (restart the coordinator)");
        }
      }
      if (!alive_) set_alive(true, restarted ? "a restarted worker answers" : "heartbeats answered again");
    } else if (++misses >= options_.heartbeat_misses && alive_) {
      set_alive(false, "missed " + std::to_string(misses) + " heartbeats in a row");
    }
    lock.lock();
  }
}

}  // namespace lazykv
