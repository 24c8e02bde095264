#include "worker/policy/retention_gates.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "common/error.h"
#include "kernels/cpu/quant.h"

namespace lazykv {
namespace {

[[noreturn]] void malformed(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "retention gates " + path + ": " + what);
}

const SafetensorsTensor& tensor(const SafetensorsFile& f, const std::string& path, const std::string& name,
                                std::vector<int64_t> shape) {
  const SafetensorsTensor* t = f.find(name);
  if (t == nullptr) malformed(path, "no tensor " + name);
  if (t->shape != shape) {
    const auto text = [](const std::vector<int64_t>& dims) {
      std::string s;
      for (int64_t d : dims) s += (s.empty() ? "" : ", ") + std::to_string(d);
      return "[" + s + "]";
    };
    malformed(path, name + " has shape " + text(t->shape) + " where the gates need " + text(shape));
  }
  return *t;
}

cpu::WeightMatrix matrix(const SafetensorsTensor& t) {
  return {t.type, t.shape[0], t.shape[1], t.data};
}

// A bias in f32, every value finite.
std::vector<float> vector_of(const SafetensorsTensor& t, const std::string& path) {
  std::vector<float> v(size_t(t.shape[0]));
  cpu::dequantize_row(t.type, t.data, v.data(), int64_t(v.size()));
  for (float x : v) {
    if (!std::isfinite(x)) malformed(path, t.name + " holds a value that is not finite");
  }
  return v;
}

int64_t dim(const SafetensorsFile& f, const std::string& path, const std::string& name, size_t axis) {
  const SafetensorsTensor* t = f.find(name);
  if (t == nullptr) malformed(path, "no tensor " + name);
  if (t->shape.size() != 2 || t->shape[axis] < 1 || t->shape[axis] > (1 << 16)) {
    malformed(path, name + " must be a matrix of at most 65536 rows and columns");
  }
  return t->shape[axis];
}

}  // namespace

std::string retention_gates_path(const std::string& model_path) { return model_path + ".trimkv.safetensors"; }

std::shared_ptr<const RetentionGates> load_retention_gates(const std::string& path) {
  if (!std::filesystem::exists(path)) throw Error(ErrorCode::kNotFound, "no retention gates at " + path);
  SafetensorsFile file;
  try {
    file = SafetensorsFile::open(path);
  } catch (const Error& e) {
    malformed(path, e.what());
  }
  return retention_gates_from(std::move(file), path);
}

std::shared_ptr<const RetentionGates> retention_gates_from(SafetensorsFile file, const std::string& path) {
  auto gates = std::make_shared<RetentionGates>();
  gates->file = std::move(file);
  const SafetensorsFile& f = gates->file;
  gates->n_hidden = int(dim(f, path, "layers.0.w1", 0));
  gates->n_embd = int(dim(f, path, "layers.0.w1", 1));
  gates->n_head_kv = int(dim(f, path, "layers.0.w2", 0));
  for (int l = 0; f.find("layers." + std::to_string(l) + ".w1") != nullptr; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    RetentionGates::Layer layer;
    layer.w1 = matrix(tensor(f, path, p + "w1", {gates->n_hidden, gates->n_embd}));
    layer.w2 = matrix(tensor(f, path, p + "w2", {gates->n_head_kv, gates->n_hidden}));
    layer.b1 = vector_of(tensor(f, path, p + "b1", {gates->n_hidden}), path);
    layer.bias = vector_of(tensor(f, path, p + "bias", {gates->n_head_kv}), path);
    gates->layers.push_back(std::move(layer));
  }
  gates->n_layer = int(gates->layers.size());
  // Every tensor belongs to a layer: a gap (layer 3 missing, 4 present) is a defect, not a shorter model.
  if (f.tensors().size() != size_t(gates->n_layer) * 4) {
    malformed(path, std::to_string(f.tensors().size()) + " tensors where " + std::to_string(gates->n_layer) +
                        " layers have " + std::to_string(gates->n_layer * 4));
  }
  return gates;
}

void retention_log_beta(const RetentionGates& gates, int layer, const float* x, int64_t n, float* out,
                        ThreadPool& pool) {
  const RetentionGates::Layer& g = gates.layers[size_t(layer)];
  const size_t scratch_bytes = std::max(cpu::matmul_scratch_bytes(g.w1, n, pool.size()),
                                        cpu::matmul_scratch_bytes(g.w2, n, pool.size()));
  std::vector<uint8_t> raw(scratch_bytes + 64);
  void* scratch = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw.data()) + 63) & ~uintptr_t(63));
  const int64_t H = gates.n_hidden, KV = gates.n_head_kv;
  std::vector<float> hidden(size_t(n * H));
  cpu::matmul(g.w1, x, n, hidden.data(), scratch, pool);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < H; ++i) {
      const float a = hidden[size_t(r * H + i)] + g.b1[size_t(i)];
      hidden[size_t(r * H + i)] = a / (1.0f + std::exp(-a));
    }
  }
  cpu::matmul(g.w2, hidden.data(), n, out, scratch, pool);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < KV; ++h) {
      // logsigmoid(z) = -log(1 + e^-z), written so that neither sign overflows.
      const float z = out[r * KV + h] + g.bias[size_t(h)];
      out[r * KV + h] = std::min(z, 0.0f) - std::log1p(std::exp(-std::fabs(z)));
    }
  }
}

}  // namespace lazykv
