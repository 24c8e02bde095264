// Per-model statistics of the queries before RoPE, for policies that score
// cached keys by where future queries will point (triattention): for every
// (layer, query head) and RoPE frequency pair f, the mean of the query's
// complex pair q_f (its "centre") and the mean of |q_f|. `lazykv calibrate`
// measures them over a text and writes them beside the model
// (query_stats_path); Model::load reads them from there.
//
// File (JSON): {"format": "lazykv-query-stats", "version": 1, "model": name,
//   "tokens": N, "n_layer": L, "n_head": H, "n_freq": F,
//   "mean_re": [L*H*F], "mean_im": [L*H*F], "abs_mean": [L*H*F]}
// with the arrays in (layer, head, frequency) order.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace lazykv {

struct QueryStats {
  int n_layer = 0;
  int n_head = 0;  // query heads of the whole model
  int n_freq = 0;  // RoPE frequency pairs: n_rot / 2
  int64_t tokens = 0;
  std::string model;
  std::vector<float> mean_re, mean_im, abs_mean;  // [n_layer][n_head][n_freq]

  size_t offset(int layer, int head) const {
    return (size_t(layer) * size_t(n_head) + size_t(head)) * size_t(n_freq);
  }
};

// Throws Error(kInvalidArgument) naming the first malformed field.
QueryStats query_stats_from_json(const nlohmann::json& j);
nlohmann::json query_stats_to_json(const QueryStats& stats);

// Where a model's statistics live: "<model path>.qstats.json".
std::string query_stats_path(const std::string& model_path);

// Reads and checks a statistics file. Throws Error(kNotFound) when it is
// missing, Error(kInvalidArgument) naming the file and the problem otherwise.
std::shared_ptr<const QueryStats> load_query_stats(const std::string& path);

}  // namespace lazykv
