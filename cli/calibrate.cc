// lazykv calibrate: measures a model's query statistics (the pre-RoPE query
// centres `triattention` scores keys with) over a text, and writes them
// beside the model, where Model::load finds them.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#include "common/flags.h"
#include "common/thread_pool.h"
#include "worker/policy/query_calibration.h"

namespace lazykv {

int run_calibrate(const std::vector<std::string>& args) {
  Flags flags("calibrate");
  flags.add("model", "default", "model: default, a GGUF file or a Hugging Face directory")
      .add("input", "", "plain text to run through the model (any coherent text will do)")
      .add("max-tokens", "4096", "use at most this many tokens of the text (and at most the training context)")
      .add("output", "", "where to write the statistics (default: <model file>.qstats.json, where they are found)")
      .add("threads", "0", "worker threads (0: all cores)");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  LoadedModel m = load_model(flags.get("model"), FilePages::kHuge);
  const std::vector<int32_t> tokens = text_file_tokens(m, flags.get("input"), flags.get_int("max-tokens"), "calibrate");
  ThreadPool pool(int(flags.get_int("threads")));
  const auto t0 = std::chrono::steady_clock::now();
  const QueryStats stats = measure_query_stats(*m.model, tokens, pool);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const std::string output = flags.get("output").empty() ? query_stats_path(m.model->path()) : flags.get("output");
  std::ofstream out(output);
  out << query_stats_to_json(stats).dump() << "\n";
  out.close();
  if (!out) throw Error(ErrorCode::kIo, "calibrate: cannot write " + output);
  const nlohmann::json report = {{"output", output},         {"tokens", stats.tokens}, {"layers", stats.n_layer},
                                 {"query_heads", stats.n_head}, {"frequencies", stats.n_freq},
                                 {"seconds", seconds}};
  std::printf("%s\n", report.dump().c_str());
  return 0;
}

}  // namespace lazykv
