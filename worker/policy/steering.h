// SkipKV's steering vector (built on SEAL): at the blank lines between
// thoughts, the mean residual after one layer where the thought was carrying
// the solution on ("execution"), less the mean where it re-checked or changed
// course ("reflection"). skipkv adds it, scaled, to that layer's output at
// those tokens, which pushes the model away from re-verifying. `lazykv steer`
// measures it over a text and writes it beside the model
// (steering_path); Model::load reads it from there.
//
// File (JSON): {"format": "lazykv-steering", "version": 1, "model": name,
//   "n_layer": L, "n_embd": E, "layer": l, "execution": n, "reflection": m,
//   "vector": [E]}; the vector is added after layer l (0-based, l < L).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace lazykv {

struct SteeringVector {
  std::string model;
  int n_layer = 0, n_embd = 0;
  int layer = 0;
  int64_t execution = 0, reflection = 0;  // thoughts of each kind measured
  std::vector<float> vector;              // [n_embd]
};

// Throws Error(kInvalidArgument) naming the first malformed field.
SteeringVector steering_from_json(const nlohmann::json& j);
nlohmann::json steering_to_json(const SteeringVector& steering);

// Where a model's steering vector lives: "<model path>.steer.json".
std::string steering_path(const std::string& model_path);

// Reads and checks a steering file: Error(kNotFound) when it is missing,
// Error(kInvalidArgument) naming the file and the problem otherwise.
std::shared_ptr<const SteeringVector> load_steering(const std::string& path);

}  // namespace lazykv
