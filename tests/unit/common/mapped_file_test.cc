#include "common/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/huge_memory.h"

namespace lazykv {
namespace {

// A file of `n` bytes that are not all alike, removed at the end.
class TempFile {
 public:
  explicit TempFile(size_t n)
      : path_((std::filesystem::temp_directory_path() / ("lazykv_mapped_" + std::to_string(::getpid()) + "_" +
                                                          std::to_string(n)))
                  .string()) {
    for (size_t i = 0; i < n; ++i) bytes_.push_back(uint8_t(i * 2654435761u >> 13));
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(bytes_.data()), std::streamsize(n));
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
};

TEST(MappedFile, BothKindsOfPagesHoldTheFilesBytes) {
  // Past a huge page, and not a multiple of one.
  const TempFile file((size_t(5) << 20) + 12345);
  const MappedFile mapped(file.path());
  const MappedFile huge(file.path(), FilePages::kHuge);
  EXPECT_EQ(mapped.pages(), FilePages::kMapped);
  EXPECT_EQ(huge.pages(), FilePages::kHuge);
  ASSERT_EQ(mapped.size(), file.bytes().size());
  ASSERT_EQ(huge.size(), file.bytes().size());
  EXPECT_TRUE(std::equal(file.bytes().begin(), file.bytes().end(), mapped.data()));
  EXPECT_TRUE(std::equal(file.bytes().begin(), file.bytes().end(), huge.data()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(huge.data()) % (size_t(2) << 20), 0u) << "a copy starts on a huge page";
}

TEST(MappedFile, ACopyMovesWithItsBytes) {
  const TempFile file(4096 + 7);
  MappedFile from(file.path(), FilePages::kHuge);
  const uint8_t* data = from.data();
  MappedFile to(std::move(from));
  EXPECT_EQ(to.data(), data);
  EXPECT_EQ(to.pages(), FilePages::kHuge);
  EXPECT_TRUE(std::equal(file.bytes().begin(), file.bytes().end(), to.data()));
  MappedFile other(file.path());
  other = std::move(to);  // the mapping it held is unmapped, the copy taken over
  EXPECT_EQ(other.data(), data);
  EXPECT_EQ(other.pages(), FilePages::kHuge);
  EXPECT_EQ(other.bytes().back(), file.bytes().back());
}

TEST(MappedFile, AnEmptyOrMissingFile) {
  const TempFile empty(0);
  const MappedFile huge(empty.path(), FilePages::kHuge);
  EXPECT_EQ(huge.size(), 0u);
  EXPECT_EQ(huge.data(), nullptr);
  try {
    MappedFile missing("/nonexistent/lazykv.gguf", FilePages::kHuge);
    FAIL() << "a missing file loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/lazykv.gguf"), std::string::npos) << e.what();
  }
}

// A file over half the available memory stays a mapping: a private copy
// could not be dropped under pressure. (Sparse: it takes no disk.)
TEST(MappedFile, AFileOverHalfTheAvailableMemoryIsMappedNotCopied) {
  size_t available_kib = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key >> available_kib && key != "MemAvailable:";) meminfo.ignore(64, '\n');
  if (available_kib == 0) GTEST_SKIP() << "no MemAvailable in /proc/meminfo";
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("lazykv_mapped_sparse_" + std::to_string(::getpid()))).string();
  std::ofstream(path).put('x');
  std::filesystem::resize_file(path, available_kib * 1024 / 2 + (size_t(64) << 20));
  {
    const MappedFile file(path, FilePages::kHuge);
    EXPECT_EQ(file.pages(), FilePages::kMapped);
    EXPECT_EQ(file.size(), std::filesystem::file_size(path));
    EXPECT_EQ(file.data()[0], 'x');
    EXPECT_EQ(file.data()[file.size() - 1], 0);
  }
  std::filesystem::remove(path);
}

TEST(HugeMemory, IsWritableAndAligned) {
  HugeMemory memory((size_t(3) << 20) + 1);
  ASSERT_NE(memory.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(memory.data()) % (size_t(2) << 20), 0u);
  memory.data()[0] = 1;
  memory.data()[memory.size() - 1] = 2;
  EXPECT_EQ(memory.data()[0] + memory.data()[memory.size() - 1], 3);
  const HugeMemory none(0);
  EXPECT_EQ(none.data(), nullptr);
}

}  // namespace
}  // namespace lazykv
