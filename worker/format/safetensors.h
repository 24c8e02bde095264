// Safetensors files and Hugging Face model directories (config.json plus one
// model.safetensors or a sharded model.safetensors.index.json). Headers are
// validated fully (JSON shape, dtypes, offsets inside the file, sizes matching
// shapes); any defect is an Error(kInvalidModel) naming the problem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/mapped_file.h"

namespace lazykv {

struct SafetensorsTensor {
  std::string name;
  DType type = DType::kF32;     // F32, F16 or BF16
  std::vector<int64_t> shape;   // row-major, outermost first (PyTorch order)
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  // Parses bytes the caller keeps alive (fuzzing, tests).
  static SafetensorsFile parse(std::span<const uint8_t> bytes);

  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;

 private:
  void parse_bytes(std::span<const uint8_t> bytes);

  MappedFile file_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// A Hugging Face model directory: the parsed config.json text and every tensor
// across all shards.
class HfModelDir {
 public:
  static HfModelDir open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::string& config_json() const { return config_json_; }
  const SafetensorsTensor* find(std::string_view name) const;
  std::vector<std::string> tensor_names() const;

 private:
  std::string dir_;
  std::string config_json_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> tensors_;
};

// "[2, 3]": a tensor's shape in error messages.
std::string shape_string(const std::vector<int64_t>& shape);

// Writes a safetensors file (tests and the tiny model generator).
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors);

}  // namespace lazykv
