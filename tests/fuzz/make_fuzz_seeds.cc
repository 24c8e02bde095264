// Writes the seed corpus for gguf_fuzz and safetensors_fuzz: small valid files
// from the writers plus a few deliberately corrupt variants. Every seed stays
// under 20 KB.   usage: make_fuzz_seeds OUT_DIR   (writes OUT_DIR/gguf, OUT_DIR/safetensors)
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "worker/format/gguf.h"
#include "tests/unit/policy/random_gates.h"
#include "worker/format/safetensors.h"
#include "worker/format/tiny_model.h"

namespace {

namespace fs = std::filesystem;
using lazykv::DType;

std::vector<uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  if (bytes.size() > 20000) {
    std::cerr << p << " would be " << bytes.size() << " bytes; seeds must stay under 20 KB\n";
    std::exit(1);
  }
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + 13 * i);
  return out;
}

template <typename T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

void gguf_seeds(const fs::path& dir) {
  using lazykv::GgufArray;
  using lazykv::GgufType;
  using lazykv::GgufValue;
  lazykv::GgufWriter all_types;
  all_types.set_string("general.architecture", "llama");
  all_types.set("u8", GgufValue{GgufType::kU8, uint64_t{7}});
  all_types.set("i8", GgufValue{GgufType::kI8, int64_t{-7}});
  all_types.set("u16", GgufValue{GgufType::kU16, uint64_t{700}});
  all_types.set("i16", GgufValue{GgufType::kI16, int64_t{-700}});
  all_types.set_u32("u32", 70000);
  all_types.set_i32("i32", -70000);
  all_types.set("u64", GgufValue{GgufType::kU64, uint64_t{1} << 40});
  all_types.set("i64", GgufValue{GgufType::kI64, int64_t{-1}});
  all_types.set_f32("f32", 0.5f);
  all_types.set("f64", GgufValue{GgufType::kF64, 0.25});
  all_types.set_bool("bool", true);
  all_types.set_string_array("strs", {"a", "bc"});
  all_types.set_i32_array("ints", {1, 2, 3});
  all_types.set_f32_array("floats", {1.5f});
  GgufArray inner{GgufType::kU8, {GgufValue{GgufType::kU8, uint64_t{1}}}};
  all_types.set("nested", GgufValue{GgufType::kArray,
                                    GgufArray{GgufType::kArray, {GgufValue{GgufType::kArray, inner}}}});
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_0, DType::kQ4_1,
                         DType::kQ8_0, DType::kQ4_K, DType::kQ6_K};
  int i = 0;
  for (DType t : types) {
    const int64_t ne0 = static_cast<int64_t>(lazykv::dtype_traits(t).block_elems);
    all_types.add_tensor("t" + std::to_string(i), {ne0, 2}, t,
                         pattern(lazykv::row_bytes(t, static_cast<size_t>(ne0)) * 2, static_cast<uint8_t>(i)));
    ++i;
  }
  const std::vector<uint8_t> valid = all_types.to_bytes();
  write_file(dir / "all_types.gguf", valid);
  write_file(dir / "all_types_align64.gguf", all_types.to_bytes(64));

  lazykv::GgufWriter empty;
  write_file(dir / "empty.gguf", empty.to_bytes());

  // A micro model with full tokenizer metadata (Q4_0 keeps it small).
  lazykv::TinyModelSpec spec;
  spec.n_layer = 1;
  spec.n_embd = 32;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  spec.n_ff = 32;
  spec.weight_type = DType::kQ4_0;
  const fs::path tmp = fs::temp_directory_path() / "lazykv_seed_tiny.gguf";
  lazykv::write_tiny_gguf(tmp.string(), spec);
  write_file(dir / "tiny_llama_q4_0.gguf", read_file(tmp));
  fs::remove(tmp);

  // Corrupt variants.
  std::vector<uint8_t> b = valid;
  poke<uint32_t>(b, 4, 1);
  write_file(dir / "bad_version1.gguf", b);
  b = valid;
  poke<uint64_t>(b, 16, uint64_t{1} << 50);
  write_file(dir / "bad_kv_count.gguf", b);
  b.assign(valid.begin(), valid.begin() + static_cast<ptrdiff_t>(valid.size() / 2));
  write_file(dir / "truncated.gguf", b);
  b.assign(valid.begin(), valid.begin() + 200);
  write_file(dir / "truncated_in_metadata.gguf", b);
}

void safetensors_seeds(const fs::path& dir) {
  const std::vector<uint8_t> f32 = pattern(4 * 6, 1), f16 = pattern(2 * 4, 2), bf16 = pattern(2 * 3, 3);
  const std::vector<lazykv::SafetensorsTensor> tensors = {
      {"model.a.weight", DType::kF32, {2, 3}, f32.data(), f32.size()},
      {"model.b", DType::kF16, {4}, f16.data(), f16.size()},
      {"c", DType::kBF16, {1, 3, 1}, bf16.data(), bf16.size()},
      {"scalar", DType::kF32, {}, f32.data(), 4},
      {"empty", DType::kF16, {0, 2}, nullptr, 0},
  };
  const fs::path path = dir / "valid.safetensors";
  lazykv::write_safetensors(path.string(), tensors);
  const std::vector<uint8_t> valid = read_file(path);

  auto raw = [](const std::string& header, size_t data) {
    std::vector<uint8_t> out(8 + header.size() + data, 0x11);
    const uint64_t len = header.size();
    std::memcpy(out.data(), &len, 8);
    std::memcpy(out.data() + 8, header.data(), header.size());
    return out;
  };
  write_file(dir / "metadata.safetensors",
             raw(R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})", 8));
  write_file(dir / "bad_dtype.safetensors",
             raw(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8));
  write_file(dir / "overlap.safetensors",
             raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8));
  write_file(dir / "past_end.safetensors",
             raw(R"({"a":{"dtype":"F16","shape":[8],"data_offsets":[0,16]}})", 4));
  std::vector<uint8_t> b(valid.begin(), valid.begin() + static_cast<ptrdiff_t>(valid.size() - 5));
  write_file(dir / "truncated.safetensors", b);
  b = valid;
  poke<uint64_t>(b, 0, uint64_t{1} << 40);
  write_file(dir / "huge_header.safetensors", b);

  // trimkv's retention gates: two layers of 4 hidden units, 8 inputs, 2 KV heads.
  lazykv::write_random_gates((dir / "retention_gates.safetensors").string(),
                             {.n_layer = 2, .n_embd = 8, .n_head_kv = 2, .n_hidden = 4});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_fuzz_seeds OUT_DIR\n";
    return 2;
  }
  const fs::path out(argv[1]);
  fs::create_directories(out / "gguf");
  fs::create_directories(out / "safetensors");
  gguf_seeds(out / "gguf");
  safetensors_seeds(out / "safetensors");
  return 0;
}
