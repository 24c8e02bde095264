// libFuzzer target: SafetensorsFile::parse on arbitrary bytes. A
// lazykv::Error with kInvalidModel is the expected outcome for bad input; any
// other exception, crash or sanitizer report is a bug.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "common/error.h"
#include "worker/format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const lazykv::SafetensorsFile f =
        lazykv::SafetensorsFile::parse(std::span<const uint8_t>(data, size));
    volatile uint64_t sink = 0;
    for (const lazykv::SafetensorsTensor& t : f.tensors()) {
      if (f.find(t.name) != &t) std::abort();
      if (t.bytes > size || t.data < data || t.data + t.bytes > data + size) std::abort();
      for (size_t i = 0; i < t.bytes; ++i) sink = sink + t.data[i];
    }
    (void)sink;
  } catch (const lazykv::Error& e) {
    if (e.code() != lazykv::ErrorCode::kInvalidModel) std::abort();
  }
  return 0;
}
