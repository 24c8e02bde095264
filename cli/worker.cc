// lazykv worker: one model on this machine's CPU behind the coordinator's
// step protocol (gRPC, lazykv.worker.v1.Worker), until SIGTERM or SIGINT.
// The coordinator (`lazykv coordinator --worker HOST:PORT`) tokenizes,
// schedules and serves HTTP; this process only runs steps.
// With --world N > 1 it is one rank of a tensor-parallel group: it holds its
// shard of the model and serves the step protocol on its own --listen; the
// coordinator (`--worker` once per rank, in rank order) arranges the ranks'
// rendezvous (JoinGroup; Gloo over TCP between the ranks, or NCCL with
// --collective nccl), forms the group again when a rank restarts, and sends
// every step to every rank.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <cstdio>

#include "cli/commands.h"
#include "cli/serving.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/rpc/grpc_server.h"
#include "worker/local_worker.h"
#include "worker/parallel/collective.h"
#include "worker/parallel/group_membership.h"
#include "worker/service/worker_service.h"

namespace lazykv {
int run_worker(const std::vector<std::string>& args) {
  Flags flags("worker");
  add_local_worker_flags(flags);
  flags.add("listen", "127.0.0.1:7001", "HOST:PORT for the coordinator's step protocol (port 0: any free port, printed)")
      .add("rank", "0", "this worker's rank in its tensor-parallel group")
      .add("world", "1", "ranks in the tensor-parallel group (each holds its share of the heads and MLP)")
      .add("tp-host", "127.0.0.1", "with --world > 1: the address this rank's peers reach it on (Gloo)")
      .add("collective", "gloo",
           "the tensor-parallel all-reduce: gloo (TCP) or nccl (through this rank's CUDA device; every rank the same)");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const int64_t world = flags.get_int("world");
  const int64_t rank = flags.get_int("rank");
  if (world < 1) throw Error(ErrorCode::kInvalidArgument, "--world must be >= 1");
  if (rank < 0 || rank >= world) throw Error(ErrorCode::kInvalidArgument, "--rank must be in [0, --world)");
  GroupSpec group_spec;
  group_spec.collective = parse_collective(flags.get("collective"));
  group_spec.rank = int(rank);
  group_spec.world = int(world);
  group_spec.hostname = flags.get("tp-host");
  group_spec.cuda_device = int(flags.get_int("cuda-device"));
  // Before the model loads: fail fast. One rank joins no group, so needs none.
  const int cuda_device = world > 1 ? check_collective(group_spec) : -1;
  const int forward_device = check_device_flags(flags, int(rank));
  const auto [host, port] = parse_host_port(flags.get("listen"), "--listen");
  const sigset_t signals = block_termination_signals();

  // The ranks of a group each read a shard: they share the page cache's copy.
  const bool private_weights = forward_device < 0 && world == 1;
  LoadedModel m = load_model(flags.get("model"), private_weights ? FilePages::kHuge : FilePages::kMapped);
  const LocalWorkerOptions options = local_worker_options_from_flags(flags, *m.tokenizer, int(rank));
  // The group forms when the coordinator connects (JoinGroup), and again
  // when it asks after a rank restarted; until then steps are refused.
  GroupMembership membership{int(rank), int(world)};
  if (world == 1) membership.join(std::make_unique<SoloGroup>());
  LocalWorker worker(*m.model, options, membership);
  JoinGroupFn join;
  if (world > 1) {
    join = [&](std::chrono::milliseconds timeout, gloo::rendezvous::Store& store) {
      std::fprintf(stderr, "lazykv worker: rank %lld of %lld joining its group\n", static_cast<long long>(rank),
                   static_cast<long long>(world));
      worker.release_all();  // the peers' halves of these caches are gone
      membership.leave();
      GroupSpec spec = group_spec;
      spec.timeout = timeout;
      membership.join(form_group(spec, store));
      std::fprintf(stderr, "lazykv worker: rank %lld joined group %d\n", static_cast<long long>(rank),
                   membership.joins());
    };
  }
  WorkerService service(worker, {.sequences = [&worker] { return int64_t(worker.n_sequences()); },
                                 .release_all = [&worker] { worker.release_all(); },
                                 .join = join});
  GrpcServer server(host, port, service, WorkerService::kServiceName, kMaxWorkerMessageBytes);
  const int bound_port = server.port();

  const std::string shown_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  std::printf("lazykv worker: listening on %s:%d\n", shown_host.c_str(), bound_port);
  std::printf("lazykv worker: rank %lld of %lld, n_ctx %d, %lld MiB KV cache\n", static_cast<long long>(rank),
              static_cast<long long>(world), worker.info().n_ctx, static_cast<long long>(options.kv_capacity_bytes >> 20));
  if (forward_device >= 0) std::printf("lazykv worker: forward pass on CUDA device %d\n", forward_device);
  if (world > 1) {
    if (cuda_device >= 0) {
      std::printf("lazykv worker: all-reduce over nccl on CUDA device %d\n", cuda_device);
    } else {
      std::printf("lazykv worker: all-reduce over %s\n", collective_name(group_spec.collective));
    }
  }
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
