// lazykv: one binary, one subcommand per role or tool.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"
#include "worker/tiers/tier_mover.h"

namespace {

constexpr const char* kUsage =
    "usage: lazykv <command> [flags]\n"
    "commands:\n"
    "  serve      the OpenAI-compatible HTTP server (coordinator and a CPU worker in one process)\n"
    "  coordinator  the HTTP API and scheduler over a remote worker (lazykv worker)\n"
    "  router     one API address in front of several replicas (serve or coordinator): prefix affinity, health\n"
    "  worker     serve a model to a coordinator over gRPC (the step protocol)\n"
    "  kvstore    the host and NVMe tiers for demoted KV blocks (gRPC control, UCX data)\n"
    "  generate   stream a completion from a model\n"
    "  bench      measure prefill and decode speed (JSON)\n"
    "  bench-serve  load an OpenAI-compatible server with concurrent streams (JSON)\n"
    "  replay-policy  run an eviction policy over an attention trace (JSON)\n"
    "  calibrate  measure a model's query statistics (for --kv-policy triattention)\n"
    "  steer      measure a model's steering vector (for --kv-policy skipkv --kv-steer)\n"
    "  eval       policy fidelity and task accuracy (JSON + plot)\n"
    "  synth-model  write a synthetic model (--model synth:<shape>:<type>) as a GGUF file\n"
    "run 'lazykv <command> --help' for the flags of a command\n";

}  // namespace

static int run_command(const std::string& command, const std::vector<std::string>& args) {
  if (command.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  try {
    if (command == "serve") return lazykv::run_serve(args);
    if (command == "coordinator") return lazykv::run_coordinator(args);
    if (command == "router") return lazykv::run_router(args);
    if (command == "worker") return lazykv::run_worker(args);
    if (command == "kvstore") return lazykv::run_kvstore(args);
    if (command == "generate") return lazykv::run_generate(args);
    if (command == "bench") return lazykv::run_bench(args);
    if (command == "bench-serve") return lazykv::run_bench_serve(args);
    if (command == "replay-policy") return lazykv::run_replay_policy(args);
    if (command == "calibrate") return lazykv::run_calibrate(args);
    if (command == "steer") return lazykv::run_steer(args);
    if (command == "eval") return lazykv::run_eval(args);
    if (command == "synth-model") return lazykv::run_synth_model(args);
    if (command == "-h" || command == "--help" || command == "help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "lazykv: unknown command '%s'\n%s", command.c_str(), kUsage);
    return 2;
  } catch (const lazykv::Error& e) {
    std::fprintf(stderr, "lazykv %s: error (%s): %s\n", command.c_str(),
                 std::string(lazykv::error_code_name(e.code())).c_str(), e.what());
    return e.code() == lazykv::ErrorCode::kInvalidArgument ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lazykv %s: internal error: %s\n", command.c_str(), e.what());
    return 1;
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const int status = run_command(argv[1], std::vector<std::string>(argv + 2, argv + argc));
  // The tiers' mover thread finishes here, not during static destruction.
  lazykv::tiers::shutdown_tiers();
  return status;
}
