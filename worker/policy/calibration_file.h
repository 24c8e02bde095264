// What the per-model calibration files beside a model (query statistics,
// steering vectors) share: checked JSON fields, numbers written with the
// precision a mean holds, and reading a file into a checked value.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"

namespace lazykv::calibration {

// Each throws Error(kInvalidArgument, "<kind>: <what is wrong>").
[[noreturn]] void malformed(const std::string& kind, const std::string& what);
// "format" is `format` and "version" is 1.
void check_header(const nlohmann::json& j, const std::string& kind, const char* format);
int positive_int(const nlohmann::json& j, const std::string& kind, const char* key, int limit);
// The string at key, "" when absent.
std::string optional_string(const nlohmann::json& j, const std::string& kind, const char* key);
std::vector<float> finite_array(const nlohmann::json& j, const std::string& kind, const char* key, size_t count);

// Five significant digits: means of thousands of values hold no more, and
// the file stays a quarter of its size at full float precision.
std::vector<double> five_digits(const std::vector<float>& values);

// The JSON in the file at path. Throws Error(kNotFound) when there is no
// such file, Error(kInvalidArgument) naming it when it is not JSON.
nlohmann::json read_json(const std::string& path, const std::string& kind);

// The file at path, read and checked by parse (which throws Error naming
// the problem): the errors of read_json, or Error(kInvalidArgument,
// "<path>: <problem>").
template <typename Parse>
auto load(const std::string& path, const std::string& kind, Parse parse) {
  const nlohmann::json j = read_json(path, kind);
  try {
    return std::make_shared<const decltype(parse(j))>(parse(j));
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, path + ": " + e.what());
  }
}

}  // namespace lazykv::calibration
