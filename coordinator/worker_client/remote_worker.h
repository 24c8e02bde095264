// A worker in another process, reached over gRPC (lazykv.worker.v1.Worker):
// the coordinator's scheduler drives it exactly like the in-process
// LocalWorker. Steps travel over one Steps stream, opened at the first step
// and again after it breaks. A background thread sends heartbeats (and
// cancels a step past its deadline); after
// `heartbeat_misses` failures in a row the worker is declared dead: alive()
// turns false, lazykv_worker_up{worker=label} goes to 0, a step in flight is
// cancelled and every step fails at once (Error kUnavailable) until a
// heartbeat succeeds again. A worker that comes back (the same process after a
// network blip, or a restarted one on the same address) is used again.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/metrics/registry.h"
#include "worker/step_executor.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace lazykv {

struct RemoteWorkerOptions {
  std::chrono::milliseconds connect_timeout{30000};    // the first Info call, retried with backoff
  std::chrono::milliseconds step_timeout{60000};       // one Step (a big prefill on CPU can take seconds)
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{0};      // one Heartbeat's deadline; 0: the interval
  int heartbeat_misses = 3;                            // failures in a row before the worker is dead
  metrics::Registry* metrics = nullptr;                // sets lazykv_worker_up{worker=label} when given
  std::string label = "0";
  std::function<void(const std::string&)> log;         // state changes (down, up, restarted); none: quiet
  std::function<void(bool alive)> on_alive_change;     // from the heartbeat thread, when alive() changes
};

class RemoteWorker final : public StepExecutor {
 public:
  // Connects to "host:port" and fetches the worker's info; throws
  // Error(kUnavailable) naming the address when it does not answer within
  // connect_timeout.
  explicit RemoteWorker(const std::string& address, const RemoteWorkerOptions& options = {});
  ~RemoteWorker() override;
  RemoteWorker(const RemoteWorker&) = delete;
  RemoteWorker& operator=(const RemoteWorker&) = delete;

  WorkerInfo info() const override;  // as fetched at connect
  // Throws Error(kUnavailable, "worker HOST:PORT: ...") when the worker is
  // dead or the call fails. A plan that only releases sequences never throws:
  // its releases are kept and sent with the next plan that reaches the worker
  // (dropped if the worker turns out to have restarted), so a scheduler
  // retrying them does not spin against a dead worker.
  StepResult step(const StepPlan& plan) override;

  bool alive() const override { return alive_.load(); }
  const std::string& address() const { return address_; }
  uint64_t instance_id() const { return instance_id_.load(); }  // the worker process's, from heartbeats
  // The connection, for calls beside the step protocol (JoinGroup).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  struct Stub;
  void heartbeat_loop();
  bool heartbeat_once(uint64_t* instance);
  void set_alive(bool alive, const std::string& why);
  Error unavailable(const std::string& why) const;

  const std::string address_;
  const RemoteWorkerOptions options_;
  const uint64_t session_;  // sent with every plan: a worker drops what an earlier session left behind
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
  WorkerInfo info_;
  std::atomic<bool> alive_{true};
  std::atomic<uint64_t> instance_id_{0};

  std::mutex mutex_;                       // guards what follows
  std::set<SeqId> deferred_release_;       // releases not yet delivered
  grpc::ClientContext* in_flight_ = nullptr;  // the Steps call while a step runs: cancelled when the worker is
                                              // declared dead or the step passes its deadline
  std::chrono::steady_clock::time_point step_deadline_;
  bool step_timed_out_ = false;
  bool stopping_ = false;
  std::condition_variable wake_;
  std::thread heartbeat_;
};

}  // namespace lazykv
