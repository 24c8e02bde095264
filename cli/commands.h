// lazykv subcommands. Each takes the arguments after its name and returns the
// process exit code; errors are thrown as lazykv::Error and reported by main.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/flags.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "worker/model.h"
#include "worker/policy/policy.h"

namespace lazykv {

int run_generate(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_replay_policy(const std::vector<std::string>& args);
int run_calibrate(const std::vector<std::string>& args);
int run_steer(const std::vector<std::string>& args);
int run_eval(const std::vector<std::string>& args);
int run_serve(const std::vector<std::string>& args);
int run_bench_serve(const std::vector<std::string>& args);
int run_worker(const std::vector<std::string>& args);
int run_coordinator(const std::vector<std::string>& args);
int run_router(const std::vector<std::string>& args);
int run_kvstore(const std::vector<std::string>& args);
int run_synth_model(const std::vector<std::string>& args);

// A model with its tokenizer: from GGUF metadata, or tokenizer.json for a
// Hugging Face directory. `pages`: where a GGUF file's weights are read
// (Model::load); kHuge for a forward pass on the CPU.
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
LoadedModel load_model(const std::string& name_or_path, FilePages pages = FilePages::kMapped);

}  // namespace lazykv

namespace lazykv {

// Prompt ids for `text`: with chat, rendered through the model's chat template
// as one user message (after an optional system message); BOS added when the
// model asks for it and the template did not already add it.
std::vector<int32_t> encode_prompt(const LoadedModel& m, const std::string& text, bool chat,
                                   const std::string& system = "");

// The tokens of a text file (no BOS), at most max_tokens and the model's
// training context: what calibrate and steer measure over. Errors name the
// command.
std::vector<int32_t> text_file_tokens(const LoadedModel& m, const std::string& path, int64_t max_tokens,
                                      const std::string& command);

}  // namespace lazykv

namespace lazykv {

// Parses --activations: "f32" or "int8".
cpu::ActivationPrecision parse_activations(const std::string& value);

}  // namespace lazykv

namespace lazykv {

// --kvstore, --host-tier-mib, ...: the tiers of lazy+tiers (cli/tier_flags.cc).
void add_tier_flags(Flags& flags);
// Error(kInvalidArgument) for out-of-range values. The tiers are built on
// first use, so a command that never runs lazy+tiers never connects.
void configure_tiers_from_flags(const Flags& flags);

// --kv-policy and one --kv-<param> flag per policy parameter (cli/policy_flags.cc).
void add_policy_flags(Flags& flags);
// The policy the flags name; Error(kInvalidArgument) for an unknown name or a
// parameter the policy does not take or accept.
PolicyConfig policy_from_flags(const Flags& flags);

}  // namespace lazykv
