// GGUF v2/v3 reader. The file is memory-mapped; metadata is parsed and fully
// validated up front (every length, count, offset and shape is checked against
// the file size), so later accesses never read out of bounds. Any defect is an
// Error(kInvalidModel) whose message names the problem.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/dtype.h"
#include "common/mapped_file.h"
#include "common/tokenizer_spec.h"

namespace lazykv {

// GGUF metadata value types (file-format ids).
enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

struct GgufValue;
struct GgufArray {
  GgufType elem_type = GgufType::kU8;
  std::vector<GgufValue> items;
};
struct GgufValue {
  GgufType type = GgufType::kU8;
  // Integers are widened to int64/uint64, floats to double.
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> value;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // GGUF order: shape[0] is the contiguous (innermost) dimension
  DType type = DType::kF32;
  uint64_t offset = 0;           // relative to the data section
  const uint8_t* data = nullptr; // into the mapping (or the parsed buffer)
  size_t bytes = 0;
};

class GgufFile {
 public:
  // Maps (or copies into huge pages: common/mapped_file.h) and parses a file.
  static GgufFile open(const std::string& path, FilePages pages = FilePages::kMapped);
  // Parses bytes the caller keeps alive (fuzzing, tests).
  static GgufFile parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const GgufValue* find(std::string_view key) const;

  // Typed getters: nullopt if absent; Error(kInvalidModel) if present with an
  // incompatible type. Integer getters accept any integer type that fits.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // any numeric type
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;
  std::optional<std::vector<double>> get_float_array(std::string_view key) const;

 private:
  void parse_bytes(std::span<const uint8_t> bytes);

  MappedFile file_;  // empty when parsed from caller bytes
  uint32_t version_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Writes GGUF v3 files: used by the tiny random-model generator and by tests
// that build corrupt files on purpose.
class GgufWriter {
 public:
  void set(std::string key, GgufValue value);
  void set_string(std::string key, std::string value);
  void set_u32(std::string key, uint32_t value);
  void set_i32(std::string key, int32_t value);
  void set_f32(std::string key, float value);
  void set_bool(std::string key, bool value);
  void set_string_array(std::string key, const std::vector<std::string>& values);
  void set_i32_array(std::string key, const std::vector<int32_t>& values);
  void set_f32_array(std::string key, const std::vector<float>& values);
  // shape in GGUF order (innermost first); data must be row_bytes(type, shape[0]) * rows.
  void add_tensor(std::string name, std::vector<int64_t> shape, DType type,
                  std::vector<uint8_t> data);
  // The same, its `bytes` bytes made by `fill` only while writing, so a model
  // far larger than memory is written one tensor at a time.
  using TensorFill = std::function<void(uint8_t* out)>;
  void add_tensor(std::string name, std::vector<int64_t> shape, DType type, size_t bytes, TensorFill fill);

  std::vector<uint8_t> to_bytes(uint32_t alignment = 32) const;
  void write(const std::string& path, uint32_t alignment = 32) const;
  // To an open file (what: its name in errors); flushed, not closed.
  void write(std::FILE* f, const std::string& what, uint32_t alignment = 32) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<uint8_t> header(uint32_t alignment) const;  // up to the first tensor's data
  void stream(uint32_t alignment, const std::function<void(const uint8_t*, size_t)>& sink) const;

  struct PendingTensor {
    std::string name;
    std::vector<int64_t> shape;
    DType type;
    size_t bytes;
    TensorFill fill;
  };
  std::vector<PendingTensor> tensors_;
};

// The llama.cpp metadata keys of a decoder-only model's shape.
struct GgufModelShape {
  std::string arch, name;
  int n_layer, n_ctx, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab;
  float rope_theta, rms_eps;
  bool quantized;  // general.quantization_version 2
};
void set_model_metadata(GgufWriter& w, const GgufModelShape& shape);
// tokenizer.ggml.* and the chat template (when the spec has one).
void set_tokenizer_metadata(GgufWriter& w, const TokenizerSpec& tok);

}  // namespace lazykv
