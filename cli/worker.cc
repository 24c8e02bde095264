// lazykv worker: one model on this machine's CPU behind the coordinator's
// step protocol (gRPC, lazykv.worker.v1.Worker), until SIGTERM or SIGINT.
// The coordinator (`lazykv coordinator --worker HOST:PORT`) tokenizes,
// schedules and serves HTTP; this process only runs steps.
#include <grpcpp/grpcpp.h>

#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "cli/serving.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/rpc/grpc_server.h"
#include "worker/local_worker.h"
#include "worker/service/worker_service.h"

namespace lazykv {
int run_worker(const std::vector<std::string>& args) {
  Flags flags("worker");
  add_local_worker_flags(flags);
  flags.add("listen", "127.0.0.1:7001", "HOST:PORT for the coordinator's step protocol (port 0: any free port, printed)")
      .add("rank", "0", "this worker's rank in its tensor-parallel group")
      .add("world", "1", "ranks in the tensor-parallel group (only 1 is implemented)");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const int64_t world = flags.get_int("world");
  const int64_t rank = flags.get_int("rank");
  if (world < 1) throw Error(ErrorCode::kInvalidArgument, "--world must be >= 1");
  if (rank < 0 || rank >= world) throw Error(ErrorCode::kInvalidArgument, "--rank must be in [0, --world)");
  if (world > 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "--world " + std::to_string(world) +
                    ": tensor parallelism across ranks is not implemented yet; run one worker with --world 1");
  }
  const auto [host, port] = parse_host_port(flags.get("listen"), "--listen");
  const sigset_t signals = block_termination_signals();

  LoadedModel m = load_model(flags.get("model"));
  const LocalWorkerOptions options = local_worker_options_from_flags(flags, *m.tokenizer);
  LocalWorker worker(*m.model, options);
  WorkerService service(worker, [&worker] { return int64_t(worker.n_sequences()); });
  GrpcServer server(host, port, service, WorkerService::kServiceName, kMaxWorkerMessageBytes);
  const int bound_port = server.port();

  const std::string shown_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::printf("lazykv worker: listening on %s:%d\n", shown_host.c_str(), bound_port);
  std::printf("lazykv worker: rank %lld of %lld, n_ctx %d, %lld MiB KV cache\n", static_cast<long long>(rank),
              static_cast<long long>(world), worker.info().n_ctx, static_cast<long long>(options.kv_capacity_bytes >> 20));
  std::fflush(stdout);

  int signal = 0;
  sigwait(&signals, &signal);
  std::fprintf(stderr, "lazykv worker: %s received, stopping\n", signal == SIGTERM ? "SIGTERM" : "SIGINT");
  // A step in flight gets a few seconds to finish; the coordinator sees the rest fail.
  server.shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(5));
  std::fprintf(stderr, "lazykv worker: stopped after %lld steps\n", static_cast<long long>(service.steps()));
  return 0;
}

}  // namespace lazykv
