// For tests: a tiny random model written to a temporary GGUF file and loaded,
// with its tokenizer (the tiny BPE vocabulary and a ChatML template).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "coordinator/tokenizer/tokenizer.h"
#include "worker/format/tiny_model.h"
#include "worker/model.h"

namespace lazykv {

struct TinyModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

// `name` keeps concurrent test binaries' files apart. `beside` (when set)
// writes files next to the model (given its path) before it loads.
inline TinyModel load_tiny_model(const std::string& name, const TinyModelSpec& spec = {},
                                 const std::function<void(const std::string&)>& beside = {}) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("lazykv_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tiny.gguf").string();
  write_tiny_gguf(path, spec);
  if (beside) beside(path);
  TinyModel m;
  m.model = Model::load(path);
  m.tokenizer = std::make_unique<Tokenizer>(m.model->tokenizer_spec());
  // The model is mapped (the mapping keeps the file's data): nothing is left
  // behind in the temp directory by each of the hundreds of test processes.
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return m;
}

}  // namespace lazykv
