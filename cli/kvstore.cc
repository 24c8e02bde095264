// lazykv kvstore: the node's tier 1 (host DRAM pool) and tier 2 (RocksDB)
// for demoted KV blocks, until SIGTERM or SIGINT. Workers reach it over gRPC
// (control: --listen) and UCX (data: --data-port); /metrics and /health are
// served over HTTP when --metrics-port is set.
#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "cli/serving.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/metrics/registry.h"
#include "common/rpc/grpc_server.h"
#include "coordinator/http/http_server.h"
#include "kvstore/service/kvstore_service.h"

namespace lazykv {
namespace {

uint64_t mib_flag(const Flags& flags, const std::string& name, int64_t min) {
  const int64_t value = flags.get_int(name);
  if (value < min) throw Error(ErrorCode::kInvalidArgument, "--" + name + " must be >= " + std::to_string(min));
  return uint64_t(value) << 20;
}

}  // namespace

int run_kvstore(const std::vector<std::string>& args) {
  Flags flags("kvstore");
  flags.add("listen", "127.0.0.1:7100", "HOST:PORT of the gRPC control plane (port 0: any free port, printed)")
      .add("data-port", "0", "UCX data-plane port on the --listen host (0: any free port, printed)")
      .add("transports", "", "UCX transports (UCX_TLS syntax): tcp, shm,tcp, rc,cuda_copy... (empty: UCX chooses)")
      .add("peer-timeout-ms", "3000", "a worker silent this long is declared dead and its leases end")
      .add("host-capacity-mib", "1024", "tier 1: host DRAM pool size")
      .add("alloc-unit-kib", "64", "tier 1: allocation unit (the pool is carved in multiples of it)")
      .add("replacement", "guard", "tier 1 replacement: guard, follow-prediction or lru")
      .add("nvme-path", "", "tier 2: RocksDB directory (empty: no tier 2, tier-1 victims are dropped)")
      .add("nvme-capacity-mib", "16384", "tier 2: budget over stored block bytes")
      .add("nvme-admit-horizon", "4096",
           "tier 2 admission: a tier-1 victim is written only if its predicted reuse is at most this many steps away")
      .add("step-ms", "20",
           "one decode step on the workers, in ms: the unit of their reuse predictions and of --nvme-admit-horizon")
      .add("metrics-port", "-1", "HTTP port for /metrics and /health on the --listen host (-1: off, 0: any)");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const auto [host, port] = parse_host_port(flags.get("listen"), "--listen");
  const int64_t data_port = flags.get_int("data-port");
  if (data_port < 0 || data_port > 65535) throw Error(ErrorCode::kInvalidArgument, "--data-port must be in [0, 65535]");
  const int64_t metrics_port = flags.get_int("metrics-port");
  if (metrics_port < -1 || metrics_port > 65535) {
    throw Error(ErrorCode::kInvalidArgument, "--metrics-port must be -1 (off) or in [0, 65535]");
  }
  const int64_t timeout_ms = flags.get_int("peer-timeout-ms");
  if (timeout_ms < 100) throw Error(ErrorCode::kInvalidArgument, "--peer-timeout-ms must be >= 100");
  const int64_t unit_kib = flags.get_int("alloc-unit-kib");
  if (unit_kib < 4) throw Error(ErrorCode::kInvalidArgument, "--alloc-unit-kib must be >= 4");
  const int64_t horizon = flags.get_int("nvme-admit-horizon");
  if (horizon < 0) throw Error(ErrorCode::kInvalidArgument, "--nvme-admit-horizon must be >= 0");

  kvstore::KvstoreServiceOptions options;
  options.tiers.host_capacity_bytes = mib_flag(flags, "host-capacity-mib", 1);
  options.tiers.host_alloc_unit = uint64_t(unit_kib) << 10;
  if (options.tiers.host_capacity_bytes % options.tiers.host_alloc_unit != 0) {
    throw Error(ErrorCode::kInvalidArgument, "--host-capacity-mib must be a multiple of --alloc-unit-kib");
  }
  options.tiers.replacement = flags.get("replacement");
  options.tiers.nvme_path = flags.get("nvme-path");
  options.tiers.nvme_capacity_bytes = mib_flag(flags, "nvme-capacity-mib", 1);
  options.tiers.nvme_admit_horizon_steps = uint64_t(horizon);
  const double step_ms = flags.get_double("step-ms");
  if (!(step_ms > 0)) throw Error(ErrorCode::kInvalidArgument, "--step-ms must be > 0");
  options.tiers.step_seconds = step_ms / 1000.0;
  options.transport.transports = flags.get("transports");
  options.transport.peer_timeout = std::chrono::milliseconds(timeout_ms);
  options.data_host = host;
  options.data_port = uint16_t(data_port);

  const sigset_t signals = block_termination_signals();
  metrics::Registry registry;
  kvstore::KvstoreService service(options, &registry);
  GrpcServer control(host, port, service, kvstore::KvstoreService::kServiceName);

  std::unique_ptr<http::Server> metrics_server;
  if (metrics_port >= 0) {
    http::ServerOptions http_options;
    http_options.host = host;
    http_options.port = uint16_t(metrics_port);
    metrics_server = std::make_unique<http::Server>(http_options, [&registry](const http::Request& request,
                                                                              http::ResponseWriter& writer) {
      if (request.method == "GET" && request.path == "/metrics") {
        writer.send(200, metrics::Registry::kContentType, registry.render());
      } else if (request.method == "GET" && request.path == "/health") {
        writer.send(200, "application/json", "{\"status\":\"ok\"}");
      } else {
        writer.send(404, "application/json", "{\"error\":{\"message\":\"not found\"}}");
      }
    });
    metrics_server->start();
  }

  const std::string shown_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::printf("lazykv kvstore: control (gRPC) on %s:%d\n", shown_host.c_str(), control.port());
  std::printf("lazykv kvstore: data (UCX) on %s:%u\n", shown_host.c_str(), unsigned(service.data_port()));
  if (metrics_server) std::printf("lazykv kvstore: metrics on http://%s:%u/metrics\n", shown_host.c_str(), unsigned(metrics_server->port()));
  std::printf("lazykv kvstore: host tier %llu MiB (%s), nvme tier %s\n",
              static_cast<unsigned long long>(options.tiers.host_capacity_bytes >> 20),
              options.tiers.replacement.c_str(),
              options.tiers.nvme_path.empty() ? "off" : options.tiers.nvme_path.c_str());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "lazykv kvstore: %s received, stopping\n", signal == SIGTERM ? "SIGTERM" : "SIGINT");
  control.set_serving(false);
  control.shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(2));
  if (metrics_server) metrics_server->stop();
  return 0;
}

}  // namespace lazykv
