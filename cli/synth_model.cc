// lazykv synth-model: writes a synthetic model (synthetic_model.h) as a GGUF
// file, the same bytes `--model synth:...` makes in memory, so llama.cpp and
// lazykv can be measured on exactly the same weights.
#include <cstdio>

#include "cli/commands.h"
#include "common/error.h"
#include "worker/format/synthetic_model.h"

namespace lazykv {

int run_synth_model(const std::vector<std::string>& args) {
  Flags flags("synth-model");
  flags.add("model", "", "the synthetic model: synth:<shape>:<type>[:<seed>]")
      .add("out", "", "the GGUF file to write")
      .add("threads", "0", "threads filling the weights; 0 is all cores");
  flags.parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  const std::string name = flags.get("model"), out = flags.get("out");
  if (out.empty()) throw Error(ErrorCode::kInvalidArgument, "--out: the GGUF file to write is required");
  const SyntheticModelSpec spec = parse_synthetic_name(name);
  const TokenizerSpec tokenizer = synthetic_model_tokenizer(name);
  std::FILE* f = std::fopen(out.c_str(), "wb");
  if (f == nullptr) throw Error(ErrorCode::kIo, "synth-model: cannot create '" + out + "'");
  try {
    write_synthetic_gguf(spec, tokenizer, f, "'" + out + "'", int(flags.get_int_in("threads", 0, 4096)));
  } catch (...) {
    std::fclose(f);
    throw;
  }
  if (std::fclose(f) != 0) throw Error(ErrorCode::kIo, "synth-model: cannot write '" + out + "'");
  std::fprintf(stderr, "lazykv synth-model: wrote %s to %s\n", name.c_str(), out.c_str());
  return 0;
}

}  // namespace lazykv
