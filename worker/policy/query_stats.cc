#include "worker/policy/query_stats.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace lazykv {
namespace {

constexpr const char* kFormat = "lazykv-query-stats";

[[noreturn]] void malformed(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "query statistics: " + what);
}

int positive_int(const nlohmann::json& j, const char* key, int limit) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > limit) {
    malformed(std::string("\"") + key + "\" must be an integer in [1, " + std::to_string(limit) + "]");
  }
  return int(j[key].get<int64_t>());
}

std::vector<float> finite_array(const nlohmann::json& j, const char* key, size_t count) {
  if (!j.contains(key) || !j[key].is_array() || j[key].size() != count) {
    malformed(std::string("\"") + key + "\" must be an array of " + std::to_string(count) + " numbers");
  }
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) {
    const nlohmann::json& v = j[key][i];
    if (!v.is_number() || !std::isfinite(v.get<double>())) {
      malformed(std::string("\"") + key + "\"[" + std::to_string(i) + "] is not a finite number");
    }
    out[i] = float(v.get<double>());
  }
  return out;
}

}  // namespace

QueryStats query_stats_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat) {
    malformed(std::string("not a \"format\": \"") + kFormat + "\" object");
  }
  if (!j.contains("version") || j["version"] != 1) malformed("unsupported \"version\" (expected 1)");
  QueryStats s;
  s.n_layer = positive_int(j, "n_layer", 1 << 12);
  s.n_head = positive_int(j, "n_head", 1 << 12);
  s.n_freq = positive_int(j, "n_freq", 1 << 12);
  if (!j.contains("tokens") || !j["tokens"].is_number_integer() || j["tokens"].get<int64_t>() < 1) {
    malformed("\"tokens\" must be a positive integer");
  }
  s.tokens = j["tokens"].get<int64_t>();
  if (j.contains("model")) {
    if (!j["model"].is_string()) malformed("\"model\" must be a string");
    s.model = j["model"].get<std::string>();
  }
  const size_t count = size_t(s.n_layer) * size_t(s.n_head) * size_t(s.n_freq);
  s.mean_re = finite_array(j, "mean_re", count);
  s.mean_im = finite_array(j, "mean_im", count);
  s.abs_mean = finite_array(j, "abs_mean", count);
  for (size_t i = 0; i < count; ++i) {
    // |mean| <= mean |.|, up to rounding: a file that breaks it was not measured.
    if (s.abs_mean[i] < 0 || std::hypot(s.mean_re[i], s.mean_im[i]) > s.abs_mean[i] * 1.001f + 1e-6f) {
      malformed("entry " + std::to_string(i) + ": the mean's magnitude exceeds the mean magnitude");
    }
  }
  return s;
}

nlohmann::json query_stats_to_json(const QueryStats& s) {
  // Five significant digits: means of thousands of queries hold no more,
  // and the file stays a quarter of its size at full float precision.
  const auto rounded = [](const std::vector<float>& values) {
    std::vector<double> out;
    out.reserve(values.size());
    char text[32];
    for (float v : values) {
      std::snprintf(text, sizeof text, "%.5g", double(v));
      out.push_back(std::strtod(text, nullptr));
    }
    return out;
  };
  return {{"format", kFormat},          {"version", 1},          {"model", s.model},
          {"tokens", s.tokens},          {"n_layer", s.n_layer},  {"n_head", s.n_head},
          {"n_freq", s.n_freq},          {"mean_re", rounded(s.mean_re)}, {"mean_im", rounded(s.mean_im)},
          {"abs_mean", rounded(s.abs_mean)}};
}

std::string query_stats_path(const std::string& model_path) { return model_path + ".qstats.json"; }

std::shared_ptr<const QueryStats> load_query_stats(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw Error(ErrorCode::kNotFound, "no query statistics at " + path);
  }
  std::ifstream in(path);
  try {
    return std::make_shared<const QueryStats>(query_stats_from_json(nlohmann::json::parse(in)));
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, path + ": not valid JSON (" + e.what() + ")");
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument, path + ": " + e.what());
  }
}

}  // namespace lazykv
