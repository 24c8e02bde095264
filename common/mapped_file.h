// Read-only memory mapping of a whole file (model weights are mapped, never
// copied). Move-only RAII handle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace lazykv {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws Error(kNotFound) if the file is missing, Error(kIo) on other failures.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace lazykv
