#include "worker/policy/calibration_file.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace lazykv::calibration {

void malformed(const std::string& kind, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, kind + ": " + what);
}

void check_header(const nlohmann::json& j, const std::string& kind, const char* format) {
  if (!j.is_object() || !j.contains("format") || j["format"] != format) {
    malformed(kind, std::string("not a \"format\": \"") + format + "\" object");
  }
  if (!j.contains("version") || j["version"] != 1) malformed(kind, "unsupported \"version\" (expected 1)");
}

int positive_int(const nlohmann::json& j, const std::string& kind, const char* key, int limit) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > limit) {
    malformed(kind, std::string("\"") + key + "\" must be an integer in [1, " + std::to_string(limit) + "]");
  }
  return int(j[key].get<int64_t>());
}

std::string optional_string(const nlohmann::json& j, const std::string& kind, const char* key) {
  if (!j.contains(key)) return "";
  if (!j[key].is_string()) malformed(kind, std::string("\"") + key + "\" must be a string");
  return j[key].get<std::string>();
}

std::vector<float> finite_array(const nlohmann::json& j, const std::string& kind, const char* key, size_t count) {
  if (!j.contains(key) || !j[key].is_array() || j[key].size() != count) {
    malformed(kind, std::string("\"") + key + "\" must be an array of " + std::to_string(count) + " numbers");
  }
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    const nlohmann::json& v = j[key][i];
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      malformed(kind, std::string("\"") + key + "\"[" + std::to_string(i) + "] is not a finite number");
    }
    out[i] = float(v.get<double>());
  }
  return out;
}

std::vector<double> five_digits(const std::vector<float>& values) {
  std::vector<double> out;
  out.reserve(values.size());
  char text[32];
  for (float v : values) {
    std::snprintf(text, sizeof text, "%.5g", double(v));
    out.push_back(std::strtod(text, nullptr));
  }
  return out;
}

nlohmann::json read_json(const std::string& path, const std::string& kind) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) throw Error(ErrorCode::kNotFound, "no " + kind + " at " + path);
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, path + ": not valid JSON (" + e.what() + ")");
  }
}

}  // namespace lazykv::calibration
