// lazykv serve: the coordinator and one in-process worker (CPU, or a GPU with
// --device cuda), serving the
// OpenAI-compatible HTTP API (and optionally gRPC) until SIGTERM or SIGINT,
// then draining: no new requests, running ones finish within --drain-seconds,
// exit 0.
#include <cstdio>

#include "cli/commands.h"
#include "cli/serving.h"
#include "common/error.h"
#include "common/model_registry.h"
#include "worker/local_worker.h"

namespace lazykv {

int run_serve(const std::vector<std::string>& args) {
  Flags flags("serve");
  add_local_worker_flags(flags);
  add_serving_flags(flags);
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const ServiceConfig service = service_config_from_flags(flags, resolve_model_path(flags.get("model")));
  const int cuda_device = check_device_flags(flags, 0);  // before the model loads: fail fast
  const sigset_t signals = block_termination_signals();

  LoadedModel m = load_model(flags.get("model"), cuda_device < 0 ? FilePages::kHuge : FilePages::kMapped);
  const LocalWorkerOptions worker_options = local_worker_options_from_flags(flags, *m.tokenizer);
  LocalWorker worker(*m.model, worker_options);

  metrics::Registry registry;
  Scheduler scheduler(worker, *m.tokenizer, registry, scheduler_options_from_flags(flags));
  ServeOptions options;
  options.role = "serve";
  options.detail = "kv policy " + service.default_policy.to_string() + ", " +
                   std::to_string(worker_options.kv_capacity_bytes >> 20) + " MiB KV cache" +
                   (cuda_device >= 0 ? ", forward pass on CUDA device " + std::to_string(cuda_device) : "");
  return serve_until_signal(flags, signals, *m.tokenizer, scheduler, registry, service, options);
}

}  // namespace lazykv
