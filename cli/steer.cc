// lazykv steer: measures a model's steering vector (the residual at blank
// lines after thoughts that carry a solution on, less after thoughts that
// re-check it) over a text of reasoning, and writes it beside the model,
// where Model::load finds it for skipkv's activation steering.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/thread_pool.h"
#include "worker/policy/steering_measure.h"

namespace lazykv {

int run_steer(const std::vector<std::string>& args) {
  Flags flags("steer");
  flags.add("model", "default", "model: default, a GGUF file or a Hugging Face directory")
      .add("input", "", "reasoning text, thoughts separated by blank lines (scripts/make_steering_vector.sh makes one)")
      .add("layer", "-1", "add the vector after this layer (0-based; -1: 70% of the way up, SEAL's choice)")
      .add("min-thoughts", "8", "refuse a text with fewer thoughts of either kind (a mean of fewer is noise)")
      .add("max-tokens", "16384", "use at most this many tokens of the text (and at most the training context)")
      .add("output", "", "where to write the vector (default: <model file>.steer.json, where it is found)")
      .add("threads", "0", "worker threads (0: all cores)");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  LoadedModel m = load_model(flags.get("model"), FilePages::kHuge);
  const int n_layer = m.model->config().n_layer;
  const int layer = flags.get_int("layer") >= 0 ? int(flags.get_int("layer")) : int(std::lround(0.7 * n_layer));
  const std::vector<int32_t> tokens = text_file_tokens(m, flags.get("input"), flags.get_int("max-tokens"), "steer");
  ThreadPool pool(int(flags.get_int("threads")));
  const auto t0 = std::chrono::steady_clock::now();
  const SteeringVector steering = measure_steering(*m.model, tokens, layer, pool, flags.get_int("min-thoughts"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const std::string output = flags.get("output").empty() ? steering_path(m.model->path()) : flags.get("output");
  std::ofstream out(output);
  out << steering_to_json(steering).dump() << "\n";
  out.close();
  if (!out) throw Error(ErrorCode::kIo, "steer: cannot write " + output);
  double norm = 0;
  for (float v : steering.vector) norm += double(v) * double(v);
  const nlohmann::json report = {{"output", output},
                                 {"tokens", tokens.size()},
                                 {"layer", steering.layer},
                                 {"execution_thoughts", steering.execution},
                                 {"reflection_thoughts", steering.reflection},
                                 {"norm", std::sqrt(norm)},
                                 {"seconds", seconds}};
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

}  // namespace lazykv
