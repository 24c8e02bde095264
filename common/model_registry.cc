#include "common/model_registry.h"

#include <cstdlib>
#include <filesystem>

#include "common/error.h"

namespace lazykv {

const KnownModel& default_model() {
  static const KnownModel model{"default", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432ULL};
  return model;
}

std::string cache_dir() {
  if (const char* d = std::getenv("LAZYKV_CACHE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d != nullptr && *d != '\0') return std::string(d) + "/lazykv";
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : ".") + "/.cache/lazykv";
}

std::string resolve_model_path(const std::string& name_or_path) {
  if (name_or_path != "default") {
    if (name_or_path.rfind("synth:", 0) == 0) return name_or_path;  // made in memory (Model::load)
    if (!std::filesystem::exists(name_or_path)) {
      throw Error(ErrorCode::kNotFound, "model '" + name_or_path + "' not found (give a .gguf file, a Hugging Face directory, 'default' or synth:<shape>:<type>)");
    }
    return name_or_path;
  }
  const KnownModel& m = default_model();
  const std::string path = cache_dir() + "/models/" + m.file;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) {
    throw Error(ErrorCode::kNotFound, "the default model is not in the cache (" + path + "); run scripts/setup.sh to fetch it");
  }
  if (size != m.bytes) {
    throw Error(ErrorCode::kInvalidModel, "the cached default model " + path + " has " + std::to_string(size) +
                                              " bytes, expected " + std::to_string(m.bytes) + "; run scripts/setup.sh to fetch it again");
  }
  return path;
}

}  // namespace lazykv
