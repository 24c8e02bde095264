// lazykv serve: the coordinator and one in-process CPU worker, serving the
// OpenAI-compatible HTTP API (and, with --grpc-port, the lazykv.v1 gRPC API)
// until SIGTERM or SIGINT, then draining: no new requests, running ones
// finish within --drain-seconds, exit 0.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <pthread.h>
#include <thread>

#include "cli/commands.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/metrics/registry.h"
#include "common/model_registry.h"
#include "coordinator/api/openai_response.h"
#include "coordinator/grpc/grpc_api.h"
#include "coordinator/http/http_server.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/server/openai_service.h"
#include "worker/local_worker.h"

namespace lazykv {
namespace {

// The name clients pass as "model": --served-model-name, else the model file's stem.
std::string served_name(const Flags& flags) {
  if (!flags.get("served-model-name").empty()) return flags.get("served-model-name");
  std::filesystem::path path(resolve_model_path(flags.get("model")));
  if (path.extension() == ".gguf") return path.stem().string();
  return path.filename().string();
}

}  // namespace

int run_serve(const std::vector<std::string>& args) {
  Flags flags("serve");
  flags.add("model", "default", "model: a .gguf file, a Hugging Face directory, or 'default'")
      .add("served-model-name", "", "the model name clients send; default: the model file's name without .gguf")
      .add("host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
      .add("port", "8000", "HTTP port (0: any free port, printed at start)")
      .add("grpc-port", "-1", "gRPC port of the lazykv.v1 API and grpc.health.v1 (-1: off; 0: any free port)")
      .add("threads", "0", "CPU threads for the model; 0 is all cores")
      .add("activations", "f32", "matmul activation precision: f32 (exact) or int8 (llama.cpp-style)")
      .add("ctx", "0", "context limit per sequence in tokens; 0 is the model's training context")
      .add("kv-cache-mib", "1024", "KV cache capacity in MiB (all sequences together)")
      .add("max-batch", "32", "sequences decoded together in one step")
      .add("max-waiting", "256", "queued sequences; beyond it requests get 503 with Retry-After")
      .add("max-prefill-tokens", "4096", "prompt tokens admitted per step (one prompt always fits)")
      .add("max-tokens-cap", "0", "largest max_tokens a request may ask for; 0 is the context")
      .add("max-n", "16", "largest n (choices per prompt)")
      .add("max-body-bytes", "4194304", "largest request body; larger ones get 413")
      .add("api-key", "", "accepted API key (repeatable; LAZYKV_API_KEY in the environment); none: no authentication")
      .add("max-concurrent-per-key", "0",
           "requests in flight per API key (without keys: for all requests together); 0 is unlimited")
      .add("drain-seconds", "30", "on SIGTERM, how long running requests may take to finish");
  add_policy_flags(flags);
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const int64_t port = flags.get_int("port");
  if (port < 0 || port > 65535) throw Error(ErrorCode::kInvalidArgument, "--port must be in [0, 65535]");
  const int64_t grpc_port = flags.get_int("grpc-port");
  if (grpc_port < -1 || grpc_port > 65535) {
    throw Error(ErrorCode::kInvalidArgument, "--grpc-port must be -1 (off) or in [0, 65535]");
  }
  const int64_t kv_mib = flags.get_int("kv-cache-mib");
  if (kv_mib < 1) throw Error(ErrorCode::kInvalidArgument, "--kv-cache-mib must be >= 1");
  const double drain_seconds = flags.get_double("drain-seconds");
  if (drain_seconds < 0) throw Error(ErrorCode::kInvalidArgument, "--drain-seconds must be >= 0");

  ServiceConfig service;
  service.model_id = served_name(flags);
  service.default_policy = policy_from_flags(flags);
  service.limits.max_tokens_cap = int32_t(flags.get_int("max-tokens-cap"));
  service.limits.max_n = int(flags.get_int("max-n"));
  service.max_concurrent_per_key = int(flags.get_int("max-concurrent-per-key"));
  for (const std::string& key : flags.get_all("api-key")) {
    if (!key.empty()) service.api_keys.push_back(key);
  }
  if (service.api_keys.empty() && !flags.get("api-key").empty()) service.api_keys.push_back(flags.get("api-key"));
  service.version = LAZYKV_VERSION;

  // Signals go to the main thread only (blocked before any thread starts).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  LoadedModel m = load_model(flags.get("model"));
  LocalWorkerOptions worker_options;
  worker_options.threads = int(flags.get_int("threads"));
  worker_options.n_ctx = int32_t(flags.get_int("ctx"));
  worker_options.n_vocab = m.tokenizer->n_vocab();
  worker_options.kv_capacity_bytes = size_t(kv_mib) << 20;
  worker_options.precision = parse_activations(flags.get("activations"));
  LocalWorker worker(*m.model, worker_options);

  metrics::Registry registry;
  SchedulerOptions scheduler_options;
  scheduler_options.max_batch = int(flags.get_int("max-batch"));
  scheduler_options.max_waiting = int(flags.get_int("max-waiting"));
  scheduler_options.max_prefill_tokens = int32_t(flags.get_int("max-prefill-tokens"));
  Scheduler scheduler(worker, *m.tokenizer, registry, scheduler_options);
  OpenAiService api(*m.tokenizer, scheduler, registry, service);

  http::ServerOptions http_options;
  http_options.host = flags.get("host");
  http_options.port = uint16_t(port);
  http_options.max_body_bytes = size_t(flags.get_int("max-body-bytes"));
  http_options.error_body = [](int status, const std::string& message) {
    return api::error_body(api::ApiError(status, status >= 500 ? "server_error" : "invalid_request_error", message));
  };
  http::Server server(http_options, [&api](const http::Request& r, http::ResponseWriter& w) { api.handle(r, w); });
  server.start();
  GrpcApi grpc_api(*m.tokenizer, scheduler, registry, service);
  std::unique_ptr<GrpcServer> grpc_server;
  if (grpc_port >= 0) grpc_server = std::make_unique<GrpcServer>(http_options.host, int(grpc_port), grpc_api);

  const std::string url = "http://" + http_options.host + ":" + std::to_string(server.port());
  std::printf("lazykv serve: model '%s' (kv policy %s, %lld MiB KV cache) listening on %s\n", service.model_id.c_str(),
              service.default_policy.to_string().c_str(), static_cast<long long>(kv_mib), url.c_str());
  std::printf("try:\n  curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
              "    -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"What is 12*7?\"}], "
              "\"max_tokens\": 64}'\n",
              url.c_str(), service.model_id.c_str());
  if (grpc_server) std::printf("lazykv serve: gRPC on %s:%d\n", http_options.host.c_str(), grpc_server->port());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "lazykv serve: %s received, draining (up to %.0f s)\n", signal == SIGTERM ? "SIGTERM" : "SIGINT",
               drain_seconds);
  api.set_ready(false);
  if (grpc_server) grpc_server->set_serving(false);
  scheduler.drain();
  server.stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                std::chrono::duration<double>(drain_seconds));
  const bool idle = scheduler.wait_idle(deadline);
  // Request threads write their last bytes, within the same deadline.
  while ((api.in_flight() > 0 || grpc_api.in_flight() > 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Sequences still running past the deadline end with a clear error, which
  // their request threads get 2 s to write (gRPC: UNAVAILABLE; calls still
  // running after that are cancelled).
  scheduler.stop("the server is shutting down");
  const auto last_writes = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
  server.stop(std::chrono::milliseconds(2000));
  if (grpc_server) grpc_server->shutdown(last_writes);
  std::fprintf(stderr, "lazykv serve: stopped (%s)\n", idle ? "all requests finished" : "drain deadline passed");
  return 0;
}

}  // namespace lazykv
