// lazykv router: one OpenAI API address in front of several replicas (each
// a `lazykv serve`, or a `lazykv coordinator` with its worker ranks). It
// binds each request to a replica late, by prefix affinity and then least
// outstanding tokens, probes every replica's /ready, and moves a request
// that a dead replica never took to another (coordinator/router/). Its only
// state is the affinity table, so several routers can run side by side.
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "cli/http_flags.h"
#include "cli/serving.h"
#include "common/error.h"
#include "coordinator/api/openai_response.h"
#include "coordinator/router/router_service.h"

namespace lazykv {
namespace {

router::RouterOptions router_options_from_flags(const Flags& flags) {
  router::RouterOptions o;
  o.replicas = flags.get_all("replica");
  o.set.max_requests = int(flags.get_int_in("max-requests-per-replica", 1, 4096));
  o.set.affinity_slack_tokens = flags.get_int_in("affinity-slack-tokens", 0, int64_t(1) << 40);
  o.set.affinity_wait = std::chrono::milliseconds(flags.get_int_in("affinity-wait-ms", 0, 600'000));
  o.set.affinity_capacity = size_t(flags.get_int_in("affinity-table-size", 1, int64_t(1) << 30));
  o.set.affinity_ttl = millis_flag(flags, "affinity-ttl-seconds", 1000);
  o.set.max_waiting = size_t(flags.get_int_in("max-waiting", 0, int64_t(1) << 20));
  o.upstream.connect_timeout = millis_flag(flags, "connect-timeout-ms", 1);
  o.upstream.read_timeout = millis_flag(flags, "read-timeout-seconds", 1000);
  o.health_interval = millis_flag(flags, "health-interval-ms", 1);
  o.queue_timeout = millis_flag(flags, "queue-timeout-seconds", 1000);
  o.default_max_tokens = flags.get_int_in("default-max-tokens", 1, int64_t(1) << 24);
  return o;
}

}  // namespace

int run_router(const std::vector<std::string>& args) {
  Flags flags("router");
  flags.add("replica", "", "HOST:PORT of a replica's HTTP API (`lazykv serve` or `lazykv coordinator`); repeat it")
      .add("host", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
      .add("port", "8000", "HTTP port (0: any free port, printed at start)")
      .add("max-requests-per-replica", "32",
           "requests in flight on one replica; more wait in the router (set it to the replicas' --max-batch, so "
           "nothing queues inside a replica that may die)")
      .add("affinity-slack-tokens", "8192",
           "a request goes to the replica that served its prompt's prefix unless that replica's outstanding tokens "
           "exceed the least loaded one's by more than this")
      .add("affinity-wait-ms", "1000",
           "how long a request waits for its prefix's replica when that one is full, before another takes it")
      .add("affinity-table-size", "100000", "prefix keys remembered (256 prompt bytes each), least recent dropped")
      .add("affinity-ttl-seconds", "600", "a prefix key older than this is not used")
      .add("max-waiting", "256", "requests waiting for a replica's free slot; more get 503")
      .add("queue-timeout-seconds", "60", "longest wait for a free slot before 503")
      .add("health-interval-ms", "1000", "period (and timeout) of each replica's /ready probe")
      .add("connect-timeout-ms", "2000", "to connect to a replica, and again to send it a request (name lookup aside)")
      .add("read-timeout-seconds", "600", "longest silence from a replica during a request")
      .add("default-max-tokens", "256", "the load estimate of a request that names no max_tokens")
      .add("drain-seconds", "30", "on SIGTERM: how long running requests may take to finish");
  add_http_flags(flags);
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const double drain_seconds = flags.get_double("drain-seconds");
  if (drain_seconds < 0) throw Error(ErrorCode::kInvalidArgument, "--drain-seconds must be >= 0");
  const router::RouterOptions options = router_options_from_flags(flags);
  const sigset_t signals = block_termination_signals();
  metrics::Registry registry;
  router::RouterService service(options, registry);
  http::ServerOptions http_options = http_options_from_flags(flags, "router");
  http_options.error_body = api::status_error_body;
  // Every request holds a handler thread while it waits or runs, so there are
  // enough for all of them (the ones past max_waiting are answered 503); the
  // router's own paths never wait, so they are answered on the I/O threads.
  if (!flags.is_set("http-handler-threads")) {
    http_options.handler_threads =
        int(options.replicas.size()) * options.set.max_requests + int(options.set.max_waiting) + 16;
  }
  http_options.probe_paths = {"/health", "/ready", "/metrics", "/router/replicas"};
  http::Server server(http_options, [&service](const http::Request& r, http::ResponseWriter& w) { service.handle(r, w); });
  service.start_probes();
  server.start();
  std::string names;
  for (const std::string& r : options.replicas) names += (names.empty() ? "" : ", ") + r;
  std::printf("lazykv router: %zu replicas (%s) listening on http://%s:%d\n", options.replicas.size(), names.c_str(),
              http_options.host.c_str(), int(server.port()));
  std::fflush(stdout);

  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "lazykv router: %s received, draining (up to %.0f s; a second signal ends it now)\n",
               signal == SIGTERM ? "SIGTERM" : "SIGINT", drain_seconds);
  const SecondSignal second(signals, "router");
  service.set_draining();
  server.stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(drain_seconds * 1000));
  wait_while_draining([&service] { return service.in_flight() == 0; }, deadline, second);
  server.stop(std::chrono::milliseconds(second.received() ? 0 : 500));
  std::fprintf(stderr, "lazykv router: stopped\n");
  return 0;
}

}  // namespace lazykv
