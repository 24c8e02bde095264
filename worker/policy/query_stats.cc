#include "worker/policy/query_stats.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "worker/policy/calibration_file.h"

namespace lazykv {
namespace {

constexpr const char* kFormat = "lazykv-query-stats";
const std::string kKind = "query statistics";

}  // namespace

QueryStats query_stats_from_json(const nlohmann::json& j) {
  calibration::check_header(j, kKind, kFormat);
  QueryStats s;
  s.n_layer = calibration::positive_int(j, kKind, "n_layer", 1 << 12);
  s.n_head = calibration::positive_int(j, kKind, "n_head", 1 << 12);
  s.n_freq = calibration::positive_int(j, kKind, "n_freq", 1 << 12);
  if (!j.contains("tokens") || !j["tokens"].is_number_integer() || j["tokens"].get<int64_t>() < 1) {
    calibration::malformed(kKind, "\"tokens\" must be a positive integer");
  }
  s.tokens = j["tokens"].get<int64_t>();
  s.model = calibration::optional_string(j, kKind, "model");
  const size_t count = size_t(s.n_layer) * size_t(s.n_head) * size_t(s.n_freq);
  s.mean_re = calibration::finite_array(j, kKind, "mean_re", count);
  s.mean_im = calibration::finite_array(j, kKind, "mean_im", count);
  s.abs_mean = calibration::finite_array(j, kKind, "abs_mean", count);
  for (size_t i = 0; i < count; ++i) {
    // |mean| <= mean |.|, up to rounding: a file that breaks it was not measured.
    if (s.abs_mean[i] < 0 || std::hypot(s.mean_re[i], s.mean_im[i]) > s.abs_mean[i] * 1.001f + 1e-6f) {
      calibration::malformed(kKind, "entry " + std::to_string(i) + ": the mean's magnitude exceeds the mean magnitude");
    }
  }
  return s;
}

nlohmann::json query_stats_to_json(const QueryStats& s) {
  return {{"format", kFormat},
          {"version", 1},
          {"model", s.model},
          {"tokens", s.tokens},
          {"n_layer", s.n_layer},
          {"n_head", s.n_head},
          {"n_freq", s.n_freq},
          {"mean_re", calibration::five_digits(s.mean_re)},
          {"mean_im", calibration::five_digits(s.mean_im)},
          {"abs_mean", calibration::five_digits(s.abs_mean)}};
}

std::string query_stats_path(const std::string& model_path) { return model_path + ".qstats.json"; }

std::shared_ptr<const QueryStats> load_query_stats(const std::string& path) {
  return calibration::load(path, kKind, query_stats_from_json);
}

}  // namespace lazykv
