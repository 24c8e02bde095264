#include "worker/policy/steering.h"

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "worker/policy/calibration_file.h"

namespace lazykv {
namespace {

constexpr const char* kFormat = "lazykv-steering";
const std::string kKind = "steering vector";

int64_t count(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 1) {
    calibration::malformed(kKind, std::string("\"") + key + "\" must be a positive integer (thoughts measured)");
  }
  return j[key].get<int64_t>();
}

}  // namespace

SteeringVector steering_from_json(const nlohmann::json& j) {
  calibration::check_header(j, kKind, kFormat);
  SteeringVector s;
  s.n_layer = calibration::positive_int(j, kKind, "n_layer", 1 << 12);
  s.n_embd = calibration::positive_int(j, kKind, "n_embd", 1 << 16);
  if (!j.contains("layer") || !j["layer"].is_number_integer() || j["layer"].get<int64_t>() < 0 ||
      j["layer"].get<int64_t>() >= s.n_layer) {
    calibration::malformed(kKind, "\"layer\" must be an integer in [0, n_layer)");
  }
  s.layer = int(j["layer"].get<int64_t>());
  s.execution = count(j, "execution");
  s.reflection = count(j, "reflection");
  s.model = calibration::optional_string(j, kKind, "model");
  s.vector = calibration::finite_array(j, kKind, "vector", size_t(s.n_embd));
  return s;
}

nlohmann::json steering_to_json(const SteeringVector& s) {
  return {{"format", kFormat},         {"version", 1},          {"model", s.model},
          {"n_layer", s.n_layer},      {"n_embd", s.n_embd},    {"layer", s.layer},
          {"execution", s.execution},  {"reflection", s.reflection},
          {"vector", calibration::five_digits(s.vector)}};
}

std::string steering_path(const std::string& model_path) { return model_path + ".steer.json"; }

std::shared_ptr<const SteeringVector> load_steering(const std::string& path) {
  return calibration::load(path, kKind, steering_from_json);
}

}  // namespace lazykv
