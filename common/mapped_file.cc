#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "common/error.h"

namespace lazykv {

namespace {

// The whole file from fd into `to`.
void read_all(int fd, uint8_t* to, size_t size, const std::string& path) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pread(fd, to + done, std::min<size_t>(size - done, size_t(1) << 30), off_t(done));
    const int err = errno;
    if (n < 0 && err == EINTR) continue;
    if (n <= 0) {
      throw Error(ErrorCode::kIo, "cannot read '" + path + "': " + (n < 0 ? std::strerror(err) : "it shrank"));
    }
    done += size_t(n);
  }
}

// MemAvailable of /proc/meminfo in bytes; 0 when unknown.
size_t available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    meminfo.ignore(64, '\n');
  }
  return 0;
}

}  // namespace

MappedFile::MappedFile(const std::string& path, FilePages pages) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw Error(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                "cannot open '" + path + "': " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorCode::kIo, "'" + path + "' is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  // A copy is private memory the kernel cannot drop under pressure: one over
  // half of what is available stays a mapping, as does one that finds no memory.
  const size_t available = pages == FilePages::kHuge ? available_memory() : 0;
  if (size_ > 0 && pages == FilePages::kHuge && (available == 0 || size_ <= available / 2)) {
    try {
      copy_ = HugeMemory(size_);
      read_all(fd, copy_.data(), size_, path);
      data_ = copy_.data();
    } catch (const Error& e) {
      copy_ = HugeMemory();
      if (e.code() != ErrorCode::kOutOfMemory) {
        ::close(fd);
        throw;
      }
    }
  }
  if (size_ > 0 && data_ == nullptr) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(ErrorCode::kIo, "cannot map '" + path + "': " + std::strerror(err));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      copy_(std::move(other.copy_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    copy_ = std::move(other.copy_);
  }
  return *this;
}

void MappedFile::reset() {
  if (data_ != nullptr && copy_.data() == nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  copy_ = HugeMemory();
  data_ = nullptr;
  size_ = 0;
}

}  // namespace lazykv
