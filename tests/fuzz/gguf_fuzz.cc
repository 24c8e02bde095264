// libFuzzer target: GgufFile::parse on arbitrary bytes. A lazykv::Error with
// kInvalidModel is the expected outcome for bad input; any other exception,
// crash or sanitizer report is a bug.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "common/error.h"
#include "worker/format/gguf.h"

namespace {

// Reads every byte of every tensor so ASan sees any out-of-bounds view.
uint64_t touch(const uint8_t* data, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += data[i];
  return sum;
}

template <typename Fn>
void expect_clean(Fn&& fn) {
  try {
    fn();
  } catch (const lazykv::Error& e) {
    if (e.code() != lazykv::ErrorCode::kInvalidModel) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const lazykv::GgufFile f = lazykv::GgufFile::parse(std::span<const uint8_t>(data, size));
    volatile uint64_t sink = f.version();
    for (const auto& entry : f.metadata()) {
      const std::string& key = entry.first;
      if (f.find(key) != &entry.second) std::abort();
      expect_clean([&] { sink = sink + f.get_string(key).value_or("").size(); });
      expect_clean([&] { sink = sink + static_cast<uint64_t>(f.get_int(key).value_or(0)); });
      expect_clean([&] { sink = sink + static_cast<uint64_t>(f.get_float(key).value_or(0) != 0); });
      expect_clean([&] { sink = sink + f.get_bool(key).value_or(false); });
      expect_clean([&] { sink = sink + f.get_string_array(key).value_or(std::vector<std::string>{}).size(); });
      expect_clean([&] { sink = sink + f.get_int_array(key).value_or(std::vector<int64_t>{}).size(); });
      expect_clean([&] { sink = sink + f.get_float_array(key).value_or(std::vector<double>{}).size(); });
    }
    for (const lazykv::GgufTensorInfo& t : f.tensors()) {
      if (f.find_tensor(t.name) != &t) std::abort();
      if (t.data < data || t.bytes > size || t.data + t.bytes > data + size) std::abort();
      sink = sink + touch(t.data, t.bytes);
    }
    (void)sink;
  } catch (const lazykv::Error& e) {
    if (e.code() != lazykv::ErrorCode::kInvalidModel) std::abort();
  }
  return 0;
}
