#include "worker/policy/retention_gates.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "kernels/cpu/quant.h"

namespace lazykv {
namespace {

// Far past where logsigmoid saturates; keeps a gate that overflows from
// turning a score into NaN (0 · inf for the newest slot).
constexpr float kMaxLogit = 1e30f;

[[noreturn]] void malformed(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "retention gates " + path + ": " + what);
}

// The tensor `name` of exactly `shape`, in f32, every value finite.
std::vector<float> read_tensor(const SafetensorsFile& f, const std::string& path, const std::string& name,
                               const std::vector<int64_t>& shape) {
  const SafetensorsTensor* t = f.find(name);
  if (t == nullptr) malformed(path, "no tensor " + name);
  if (t->shape != shape) {
    malformed(path, name + " has shape " + shape_string(t->shape) + " where the gates need " + shape_string(shape));
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> values(static_cast<size_t>(n));
  // Row by row from a copy: the file's offsets need not suit the type's alignment.
  std::vector<uint8_t> raw(t->data, t->data + t->bytes);
  cpu::dequantize_row(t->type, raw.data(), values.data(), n);
  if (!std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); })) {
    malformed(path, name + " holds a value that is not finite");
  }
  return values;
}

// A dimension of layer 0, read before the layers are checked against it.
int64_t dim(const SafetensorsFile& f, const std::string& path, const std::string& name, size_t axis) {
  const SafetensorsTensor* t = f.find(name);
  if (t == nullptr) malformed(path, "no tensor " + name);
  if (t->shape.size() != 2 || t->shape[0] < 1 || t->shape[1] < 1 || t->shape[0] > (1 << 16) ||
      t->shape[1] > (1 << 16)) {
    malformed(path, name + " has shape " + shape_string(t->shape) + ", not a matrix of 1 to 65536 rows and columns");
  }
  return t->shape[axis];
}

}  // namespace

cpu::WeightMatrix RetentionGates::Layer::w1_matrix() const {
  return {DType::kF32, int64_t(b1.size()), int64_t(w1.size() / b1.size()), w1.data()};
}

cpu::WeightMatrix RetentionGates::Layer::w2_matrix() const {
  return {DType::kF32, int64_t(bias.size()), int64_t(b1.size()), w2.data()};
}

std::string retention_gates_path(const std::string& model_path) { return model_path + ".trimkv.safetensors"; }

std::shared_ptr<const RetentionGates> load_retention_gates(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(ErrorCode::kNotFound, "no retention gates at " + path);
  }
  try {
    return retention_gates_from(SafetensorsFile::open(path), path);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInvalidArgument) throw;
    malformed(path, e.what());  // the container: not safetensors, truncated, unreadable
  }
}

std::shared_ptr<const RetentionGates> retention_gates_from(const SafetensorsFile& f, const std::string& path) {
  auto gates = std::make_shared<RetentionGates>();
  const int64_t H = dim(f, path, "layers.0.w1", 0), E = dim(f, path, "layers.0.w1", 1);
  const int64_t KV = dim(f, path, "layers.0.w2", 0);
  for (int l = 0; f.find("layers." + std::to_string(l) + ".w1") != nullptr; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    RetentionGates::Layer layer;
    layer.w1 = read_tensor(f, path, p + "w1", {H, E});
    layer.b1 = read_tensor(f, path, p + "b1", {H});
    layer.w2 = read_tensor(f, path, p + "w2", {KV, H});
    layer.bias = read_tensor(f, path, p + "bias", {KV});
    gates->layers.push_back(std::move(layer));
  }
  gates->n_layer = int(gates->layers.size());
  gates->n_hidden = int(H);
  gates->n_embd = int(E);
  gates->n_head_kv = int(KV);
  // Every tensor belongs to a layer: a gap (layer 3 missing, 4 present) is a defect, not a shorter model.
  if (f.tensors().size() != size_t(gates->n_layer) * 4) {
    malformed(path, std::to_string(f.tensors().size()) + " tensors where " + std::to_string(gates->n_layer) +
                        " layers have " + std::to_string(gates->n_layer * 4));
  }
  return gates;
}

void retention_log_beta(const RetentionGates& gates, int layer, const float* x, int64_t n, float* out,
                        RetentionScratch& scratch, ThreadPool& pool) {
  const RetentionGates::Layer& g = gates.layers[size_t(layer)];
  const cpu::WeightMatrix w1 = g.w1_matrix(), w2 = g.w2_matrix();
  const size_t bytes = std::max(cpu::matmul_scratch_bytes(w1, n, pool.size()),
                                cpu::matmul_scratch_bytes(w2, n, pool.size())) + 64;
  if (scratch.matmul.size() < bytes) scratch.matmul.resize(bytes);
  void* aligned = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.matmul.data()) + 63) & ~uintptr_t(63));
  const int64_t H = gates.n_hidden, KV = gates.n_head_kv;
  scratch.hidden.resize(size_t(n * H));
  float* hidden = scratch.hidden.data();
  cpu::matmul(w1, x, n, hidden, aligned, pool);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < H; ++i) {
      const float a = hidden[r * H + i] + g.b1[size_t(i)];
      hidden[r * H + i] = a / (1.0f + std::exp(-a));
    }
  }
  cpu::matmul(w2, hidden, n, out, aligned, pool);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < KV; ++h) {
      // logsigmoid(z) = min(z, 0) - log(1 + e^-|z|): neither sign overflows.
      float z = out[r * KV + h] + g.bias[size_t(h)];
      z = std::isnan(z) ? -kMaxLogit : std::clamp(z, -kMaxLogit, kMaxLogit);
      out[r * KV + h] = std::min(z, 0.0f) - std::log1p(std::exp(-std::fabs(z)));
    }
  }
}

}  // namespace lazykv
