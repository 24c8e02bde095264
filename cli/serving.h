// What `lazykv serve` and `lazykv coordinator` share: the API and scheduler
// flags, and running the HTTP (and optionally gRPC) APIs over a scheduler
// until SIGTERM or SIGINT, then draining.
#pragma once

#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "common/flags.h"
#include "common/host_port.h"
#include "common/metrics/registry.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/server/openai_service.h"
#include "coordinator/server/service_config.h"
#include "worker/local_worker.h"

namespace lazykv {

// --served-model-name, --host, --port, --grpc-port, the scheduler and request
// limits, API keys, --drain-seconds and the default policy's flags.
void add_serving_flags(Flags& flags);
// Error(kInvalidArgument) for out-of-range values.
ServiceConfig service_config_from_flags(const Flags& flags, const std::string& model_path);
SchedulerOptions scheduler_options_from_flags(const Flags& flags);

// --model, --threads, --activations, --ctx, --kv-cache-mib, --prefix-cache-mib, --device,
// --cuda-device: the model a worker runs, and where.
void add_local_worker_flags(Flags& flags);
// --device and --cuda-device checked before a model loads (check_compute_device):
// the CUDA device rank `rank` will use, -1 for the CPU.
int check_device_flags(const Flags& flags, int rank);
// Error(kInvalidArgument) for out-of-range values; n_vocab from the tokenizer.
LocalWorkerOptions local_worker_options_from_flags(const Flags& flags, const Tokenizer& tokenizer, int rank = 0);

// Blocks SIGTERM and SIGINT in this thread and every thread started after it
// (so only sigwait sees them) and ignores SIGPIPE. Call before any thread starts.
sigset_t block_termination_signals();

struct ServeOptions {
  std::string role;    // "serve", "coordinator": the log prefix
  std::string detail;  // for the start line, e.g. "kv policy full, 1024 MiB KV cache"
  // Set to the HTTP service while it serves (null again when draining), so a
  // caller can follow a worker's health with set_ready().
  std::atomic<OpenAiService*>* live_api = nullptr;
  bool ready = true;   // /ready at start
};

// After the first SIGTERM or SIGINT: watches for a second one, which cuts
// the drain short.
class SecondSignal {
 public:
  SecondSignal(const sigset_t& signals, const char* role);
  ~SecondSignal();
  bool received() const { return received_; }

 private:
  std::atomic<bool> done_{false};
  std::atomic<bool> received_{false};
  std::thread thread_;
};

// Waits until `done` holds, the deadline passes or a second signal comes.
void wait_while_draining(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline,
                         const SecondSignal& second);

// A duration flag given in units of `scale` milliseconds (1000: seconds);
// Error(kInvalidArgument) below 1 ms.
std::chrono::milliseconds millis_flag(const Flags& flags, const std::string& name, double scale);

// Starts the APIs, prints the URL and a curl example, waits for a signal,
// then drains: /ready and gRPC health turn unavailable, new requests get 503,
// running ones finish within --drain-seconds, the rest end with an error.
// Returns the exit code (0).
int serve_until_signal(const Flags& flags, const sigset_t& signals, const Tokenizer& tokenizer, SequenceQueue& scheduler,
                       metrics::Registry& registry, const ServiceConfig& service, const ServeOptions& options);

}  // namespace lazykv
