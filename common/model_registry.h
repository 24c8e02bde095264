// Named models. "default" is SmolLM2-135M-Instruct (Q4_1 GGUF), fetched into
// the cache by scripts/setup.sh and verified there by its sha256.
#pragma once

#include <string>

namespace lazykv {

struct KnownModel {
  const char* name;
  const char* file;     // file name inside the cache's models/ folder
  const char* sha256;
  unsigned long long bytes;
};

const KnownModel& default_model();

// $LAZYKV_CACHE_DIR, else $XDG_CACHE_HOME/lazykv, else ~/.cache/lazykv.
std::string cache_dir();

// "default" -> the cached default model's path (Error(kNotFound) with the fix
// if it is missing or has the wrong size); any other string is a path.
std::string resolve_model_path(const std::string& name_or_path);

}  // namespace lazykv
