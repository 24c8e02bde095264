#include "cli/serving.h"

#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <thread>

#include "cli/commands.h"
#include "cli/http_flags.h"
#include "common/error.h"
#include "coordinator/api/openai_response.h"
#include "coordinator/grpc/grpc_api.h"
#include "coordinator/http/http_server.h"

namespace lazykv {

namespace {
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
}  // namespace

void add_serving_flags(Flags& flags) {
  flags.add("served-model-name", "", "the model name clients send; default: the model file's name without .gguf")
      .add("host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
      .add("port", "8000", "HTTP port (0: any free port, printed at start)")
      .add("grpc-port", "-1", "gRPC port of the lazykv.v1 API and grpc.health.v1: -1 off, 0 any free port")
      .add("max-batch", "32", "sequences decoded together in one step")
      .add("max-waiting", "256", "queued sequences; beyond it requests get 503 with Retry-After")
      .add("max-prefill-tokens", "512",
           "prompt tokens run per step; longer prompts are prefilled in chunks over several steps "
           "(with an evicting policy: whole, in a step of their own)")
      .add("max-decode-stall-ms", "150",
           "while sequences are decoding, how much a step's prompt tokens may delay their next token; the chunk "
           "follows from the measured cost of prompt tokens (at least 16 a step, docs/serving.md); 0: no bound")
      .add("max-tokens-cap", "0", "largest max_tokens a request may ask for; 0 is the context")
      .add("max-n", "16", "largest n (choices per prompt)")
      .add("reasoning-parser", "auto",
           "how chat replies split into reasoning_content and content: think (<think> ... </think>; also "
           "deepseek_r1, qwen3), none, or auto (think when the chat template mentions <think>)")
      .add("api-key", "", "accepted API key (repeatable; LAZYKV_API_KEY in the environment); none: no authentication")
      .add("max-concurrent-per-key", "0",
           "requests in flight per API key (without keys: for all requests together); 0 is unlimited")
      .add("drain-seconds", "30",
           "on SIGTERM or SIGINT, how long running requests may take to finish; a second signal ends them at once");
  add_http_flags(flags);
  add_policy_flags(flags);
}

ServiceConfig service_config_from_flags(const Flags& flags, const std::string& model_path) {
  ServiceConfig service;
  service.model_id = flags.get("served-model-name");
  if (service.model_id.empty()) {
    const std::filesystem::path p(model_path);
    service.model_id = p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
  }
  service.default_policy = policy_from_flags(flags);
  service.limits.max_tokens_cap = int32_t(flags.get_int_in("max-tokens-cap", 0, kMaxInt32));
  service.limits.max_n = int(flags.get_int_in("max-n", 1, kMaxInt32));
  if (flags.get("reasoning-parser") != "auto") service.reasoning = parse_reasoning_format(flags.get("reasoning-parser"));
  const int64_t per_key = flags.get_int_in("max-concurrent-per-key", 0, kMaxInt32);
  if (per_key > 0) service.key_limiter = std::make_shared<KeyLimiter>(int(per_key));
  for (const std::string& key : flags.get_all("api-key")) {
    if (!key.empty()) service.api_keys.push_back(key);
  }
  if (service.api_keys.empty() && !flags.get("api-key").empty()) service.api_keys.push_back(flags.get("api-key"));
  service.version = LAZYKV_VERSION;
  return service;
}

SchedulerOptions scheduler_options_from_flags(const Flags& flags) {
  SchedulerOptions options;
  options.max_batch = int(flags.get_int_in("max-batch", 1, kMaxInt32));
  options.max_waiting = int(flags.get_int_in("max-waiting", 1, kMaxInt32));
  options.max_prefill_tokens = int32_t(flags.get_int_in("max-prefill-tokens", 1, kMaxInt32));
  options.max_decode_stall = std::chrono::milliseconds(flags.get_int_in("max-decode-stall-ms", 0, 3'600'000));
  return options;
}

void add_local_worker_flags(Flags& flags) {
  flags.add("model", "default", "model: a .gguf file, a Hugging Face directory, or 'default'")
      .add("threads", "0", "CPU threads for the model; 0 is all cores")
      .add("activations", "f32", "matmul activation precision: f32 (exact) or int8 (llama.cpp-style)")
      .add("ctx", "0", "context limit per sequence in tokens; 0 is the model's training context")
      .add("kv-cache-mib", "1024", "KV cache capacity in MiB (all sequences together)")
      .add("prefix-cache-mib", "0",
           "prompt KV reuse: up to this many MiB of the KV cache keep prompt pages for later prompts that start "
           "the same way (given back when sequences need the room); 0 is off")
      .add_switch("prefix-cache-tiers",
                  "with --prefix-cache-mib: prompt blocks also go to the tiers (the --kvstore every worker of the "
                  "node shares, or this process's host and NVMe tiers), and a prompt fetches from there what the "
                  "prefix cache lacks")
      .add("device", "cpu", "where the forward pass runs: cpu, or cuda (a GPU; needs a build with the CUDA toolkit)")
      .add("cuda-device", "-1",
           "with --device cuda or --collective nccl: this rank's CUDA device (-1: rank modulo the devices)")
      .add_switch("no-cuda-graphs", "with --device cuda: launch a decode step's kernels one by one instead of "
                                    "replaying a captured CUDA graph");
  add_tier_flags(flags);
}

int check_device_flags(const Flags& flags, int rank) {
  return check_compute_device(parse_compute_device(flags.get("device")),
                              int(flags.get_int_in("cuda-device", -1, kMaxInt32)), rank);
}

LocalWorkerOptions local_worker_options_from_flags(const Flags& flags, const Tokenizer& tokenizer, int rank) {
  const int64_t kv_mib = flags.get_int_in("kv-cache-mib", 1, int64_t(1) << 30);  // up to 1 PiB
  configure_tiers_from_flags(flags);
  LocalWorkerOptions options;
  options.threads = int(flags.get_int_in("threads", 0, 4096));
  options.n_ctx = int32_t(flags.get_int_in("ctx", 0, kMaxInt32));
  options.n_vocab = tokenizer.n_vocab();
  options.kv_capacity_bytes = size_t(kv_mib) << 20;
  options.prefix_cache_bytes = size_t(flags.get_int_in("prefix-cache-mib", 0, kv_mib)) << 20;
  options.prefix_tiers = flags.get_bool("prefix-cache-tiers");
  if (options.prefix_tiers && options.prefix_cache_bytes == 0) {
    throw Error(ErrorCode::kInvalidArgument, "--prefix-cache-tiers needs a prefix cache (--prefix-cache-mib > 0)");
  }
  options.precision = parse_activations(flags.get("activations"));
  options.device = parse_compute_device(flags.get("device"));
  options.cuda_device = check_device_flags(flags, rank);
  options.cuda_graphs = !flags.get_bool("no-cuda-graphs");
  return options;
}

sigset_t block_termination_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return signals;
}

SecondSignal::SecondSignal(const sigset_t& signals, const char* role)
    : thread_([this, signals, role] {
        const timespec tick{0, 100'000'000};
        while (!done_) {
          const int signal = sigtimedwait(&signals, nullptr, &tick);
          if (signal > 0) {
            std::fprintf(stderr, "lazykv %s: second %s: ending running requests now\n", role,
                         signal == SIGTERM ? "SIGTERM" : "SIGINT");
            received_ = true;
            return;
          }
        }
      }) {}

SecondSignal::~SecondSignal() {
  done_ = true;
  thread_.join();
}

void wait_while_draining(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline,
                         const SecondSignal& second) {
  while (!done() && !second.received() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::chrono::milliseconds millis_flag(const Flags& flags, const std::string& name, double scale) {
  const double value = flags.get_double(name) * scale;
  if (!(value >= 1)) throw Error(ErrorCode::kInvalidArgument, "--" + name + " must be at least 1 ms");
  return std::chrono::milliseconds(int64_t(value));
}

int serve_until_signal(const Flags& flags, const sigset_t& signals, const Tokenizer& tokenizer, SequenceQueue& scheduler,
                       metrics::Registry& registry, const ServiceConfig& service, const ServeOptions& options) {
  const int64_t grpc_port = flags.get_int_in("grpc-port", -1, 65535);  // -1: off
  const double drain_seconds = flags.get_double("drain-seconds");
  if (drain_seconds < 0) throw Error(ErrorCode::kInvalidArgument, "--drain-seconds must be >= 0");
  const char* role = options.role.c_str();
  const auto& unavailable = scheduler.worker_info().unavailable_policies;
  if (const auto it = unavailable.find(service.default_policy.name); it != unavailable.end()) {
    throw Error(ErrorCode::kInvalidArgument, "--kv-policy " + it->first + " cannot run on this model: " + it->second);
  }

  ServiceConfig shared = service;
  shared.constraints = std::make_shared<grammar::ConstraintCache>(tokenizer);
  OpenAiService api(tokenizer, scheduler, registry, shared);
  api.set_ready(options.ready);
  if (options.live_api != nullptr) *options.live_api = &api;
  http::ServerOptions http_options = http_options_from_flags(flags, role);
  http_options.error_body = api::status_error_body;
  http_options.check_header = [&api](const http::Request& head) { return api.check_header(head); };
  http_options.on_own_answer = [&api](int status) { api.count_server_answer(status); };
  http::Server server(http_options, [&api](const http::Request& r, http::ResponseWriter& w) { api.handle(r, w); });
  server.start();
  GrpcApi grpc_api(tokenizer, scheduler, registry, shared);
  std::unique_ptr<GrpcServer> grpc_server;
  if (grpc_port >= 0) {
    grpc_server = std::make_unique<GrpcServer>(http_options.host, int(grpc_port), grpc_api, GrpcApi::kServiceName, 0,
                                               grpc_api.interceptors());
  }

  const std::string url = "http://" + http_options.host + ":" + std::to_string(server.port());
  std::printf("lazykv %s: model '%s' (%s) listening on %s\n", role, service.model_id.c_str(), options.detail.c_str(),
              url.c_str());
  std::printf("try:\n  curl %s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
              "    -d '{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"What is 12*7?\"}], "
              "\"max_tokens\": 64}'\n",
              url.c_str(), service.model_id.c_str());
  if (grpc_server) std::printf("lazykv %s: gRPC on %s:%d\n", role, http_options.host.c_str(), grpc_server->port());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "lazykv %s: %s received, draining (up to %.0f s; a second signal ends it now)\n", role,
               signal == SIGTERM ? "SIGTERM" : "SIGINT", drain_seconds);
  const SecondSignal second(signals, role);
  if (options.live_api != nullptr) *options.live_api = nullptr;
  api.set_ready(false);
  if (grpc_server) grpc_server->set_serving(false);
  scheduler.drain();
  server.stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                std::chrono::duration<double>(drain_seconds));
  wait_while_draining([&] { return scheduler.running() == 0 && scheduler.waiting() == 0; }, deadline, second);
  const bool idle = scheduler.running() == 0 && scheduler.waiting() == 0;
  // Request threads write their last bytes, within the same deadline.
  wait_while_draining([&] { return api.in_flight() == 0 && grpc_api.in_flight() == 0; }, deadline, second);
  // Sequences still running now end with a clear error, which their request
  // threads get 2 s to write (0.5 s after a second signal; gRPC:
  // UNAVAILABLE; calls still running after that are cancelled).
  scheduler.stop("the server is shutting down");
  const auto last_words = std::chrono::milliseconds(second.received() ? 500 : 2000);
  const auto last_writes = std::chrono::steady_clock::now() + last_words;
  server.stop(last_words);
  if (grpc_server) grpc_server->shutdown(last_writes);
  std::fprintf(stderr, "lazykv %s: stopped (%s)\n", role,
               idle ? "all requests finished"
                    : second.received() ? "running requests ended by a second signal" : "drain deadline passed");
  return 0;
}

}  // namespace lazykv
