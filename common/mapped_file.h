// The bytes of a whole file, read-only: mapped from the page cache, or copied
// into huge pages (common/huge_memory.h) for the CPU's weight streams.
// Move-only RAII handle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/huge_memory.h"

namespace lazykv {

// How a file's bytes are held.
enum class FilePages {
  kMapped,  // the page cache's 4 KiB pages, mapped: shared with every process that maps the file
  kHuge,    // copied into HugeMemory: private, and a decode step's weight reads walk few pages;
            // mapped instead when the file is over half the available memory or the copy finds none
};

class MappedFile {
 public:
  MappedFile() = default;
  // Throws Error(kNotFound) if the file is missing, Error(kIo) on other
  // failures, Error(kOutOfMemory) when kHuge finds no memory for the copy.
  explicit MappedFile(const std::string& path, FilePages pages = FilePages::kMapped);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  // kHuge when the bytes are a copy (never for an empty file).
  FilePages pages() const { return copy_.data() != nullptr ? FilePages::kHuge : FilePages::kMapped; }

 private:
  void reset();

  std::string path_;
  const uint8_t* data_ = nullptr;  // into the mapping, or copy_
  size_t size_ = 0;
  HugeMemory copy_;  // kHuge's bytes
};

}  // namespace lazykv
