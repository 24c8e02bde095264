// libFuzzer target: SafetensorsFile::parse on arbitrary bytes, then the
// retention-gate checks (trimkv's file) on what parses, and the gates run
// on a row when they pass. A lazykv::Error with kInvalidModel (the
// container) or kInvalidArgument (the gates) is the expected outcome for bad
// input; any other exception, crash or sanitizer report is a bug.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>

#include <vector>

#include "common/error.h"
#include "common/thread_pool.h"
#include "worker/format/safetensors.h"
#include "worker/policy/retention_gates.h"

namespace {

void check_as_gates(const lazykv::SafetensorsFile& file) {
  try {
    const auto gates = lazykv::retention_gates_from(file, "fuzz input");
    static lazykv::ThreadPool pool(1);
    std::vector<float> row(size_t(gates->n_embd), 0.5f), out(size_t(gates->n_head_kv));
    lazykv::RetentionScratch scratch;
    for (int l = 0; l < gates->n_layer; ++l) {
      lazykv::retention_log_beta(*gates, l, row.data(), 1, out.data(), scratch, pool);
      for (float v : out) {
        if (!(v <= 0.0f) || !std::isfinite(v)) std::abort();  // a rate is a finite log of at most 1
      }
    }
  } catch (const lazykv::Error& e) {
    if (e.code() != lazykv::ErrorCode::kInvalidArgument) std::abort();
  }
}

}  // namespace

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
    check_as_gates(f);
  } catch (const lazykv::Error& e) {
    if (e.code() != lazykv::ErrorCode::kInvalidModel) std::abort();
  }
  return 0;
}
