#include "worker/format/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/fp16.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// A raw safetensors file from header text and `data_bytes` bytes of data.
std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0x5a);
  const uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void expect_invalid(const std::vector<uint8_t>& bytes, const std::string& fragment) {
  try {
    SafetensorsFile::parse(bytes);
    ADD_FAILURE() << "parsed without error; expected '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message: " << e.what() << "\nexpected fragment: " << fragment;
  }
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(testing::TempDir()) / ("lazykv_format_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct OwnedTensor {
  std::vector<uint8_t> bytes;
  SafetensorsTensor view;
};

OwnedTensor make_tensor(const std::string& name, DType type, std::vector<int64_t> shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  OwnedTensor t;
  t.bytes.resize(n * dtype_traits(type).block_bytes);
  for (size_t i = 0; i < n; ++i) {
    const float x = 0.25f * static_cast<float>(i) - 3.0f;
    if (type == DType::kF32) {
      std::memcpy(&t.bytes[4 * i], &x, 4);
    } else {
      const uint16_t h = type == DType::kF16 ? fp32_to_fp16(x) : fp32_to_bf16(x);
      std::memcpy(&t.bytes[2 * i], &h, 2);
    }
  }
  t.view = SafetensorsTensor{name, type, std::move(shape), t.bytes.data(), t.bytes.size()};
  return t;
}

TEST(SafetensorsTest, RoundTrip) {
  const fs::path dir = fresh_dir("st_roundtrip");
  std::vector<OwnedTensor> owned;
  owned.push_back(make_tensor("w.f32", DType::kF32, {3, 5}));
  owned.push_back(make_tensor("w.f16", DType::kF16, {7}));
  owned.push_back(make_tensor("w.bf16", DType::kBF16, {2, 2, 3}));
  owned.push_back(make_tensor("scalar", DType::kF32, {}));
  owned.push_back(make_tensor("empty", DType::kF16, {0, 4}));
  std::vector<SafetensorsTensor> views;
  for (const OwnedTensor& t : owned) views.push_back(t.view);
  const std::string path = (dir / "x.safetensors").string();
  write_safetensors(path, views);

  const std::vector<uint8_t> raw = read_file(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);  // data section aligned

  const SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), owned.size());
  for (const OwnedTensor& t : owned) {
    const SafetensorsTensor* got = f.find(t.view.name);
    ASSERT_NE(got, nullptr) << t.view.name;
    EXPECT_EQ(got->type, t.view.type);
    EXPECT_EQ(got->shape, t.view.shape);
    ASSERT_EQ(got->bytes, t.bytes.size());
    if (got->bytes > 0) {
      EXPECT_EQ(std::memcmp(got->data, t.bytes.data(), got->bytes), 0);
    }
  }
  EXPECT_EQ(f.find("nope"), nullptr);
  // tensors() is in file order.
  for (size_t i = 1; i < f.tensors().size(); ++i) {
    EXPECT_LE(f.tensors()[i - 1].data, f.tensors()[i].data);
  }
  // Parsing from memory gives the same result.
  EXPECT_EQ(SafetensorsFile::parse(raw).tensors().size(), owned.size());
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  OwnedTensor t = make_tensor("x", DType::kF32, {4});
  t.view.bytes = 12;
  EXPECT_THROW(write_safetensors(testing::TempDir() + "/lazykv_bad.safetensors", {t.view}), Error);
  OwnedTensor q = make_tensor("x", DType::kF32, {4});
  q.view.type = DType::kQ8_0;
  EXPECT_THROW(write_safetensors(testing::TempDir() + "/lazykv_bad.safetensors", {q.view}), Error);
}

TEST(SafetensorsTest, CorruptHeadersGiveClearErrors) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  ASSERT_NO_THROW(SafetensorsFile::parse(raw_file("{" + ok_entry + "}", 8)));
  ASSERT_NO_THROW(SafetensorsFile::parse(
      raw_file(R"({"__metadata__":{"format":"pt"},)" + ok_entry + "}", 8)));

  expect_invalid({1, 2, 3}, "need at least 8 for the header length");
  std::vector<uint8_t> huge_len = raw_file("{}", 0);
  const uint64_t big = uint64_t{1} << 40;
  std::memcpy(huge_len.data(), &big, 8);
  expect_invalid(huge_len, "header length 1099511627776 exceeds the 104857600-byte limit");
  std::vector<uint8_t> past_end = raw_file("{}", 0);
  past_end[0] = 100;
  expect_invalid(past_end, "header length 100 extends past end of file (10 bytes)");

  struct Case {
    std::string header;
    size_t data;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"{", 0, "header is not valid JSON"},
      {"[]", 0, "header is not a JSON object"},
      {R"({"a":5})", 0, "tensor 'a' entry is not an object"},
      {R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 8,
       "tensor 'a' has unsupported dtype 'I64' (supported: F32, F16, BF16)"},
      {R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4, "tensor 'a' has no string 'dtype'"},
      {R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4, "tensor 'a' has no array 'shape'"},
      {R"({"a":{"dtype":"F32","shape":[1]}})", 4, "tensor 'a' has no 'data_offsets' pair"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 8, "no 'data_offsets' pair"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
       "tensor 'a' has a shape entry that is not a non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, "not a non-negative integer"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4,
       "data_offsets are not non-negative integers"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4,
       "tensor 'a' data_offsets [0, 8] are outside the data section (4 bytes"},
      {R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8, "outside the data section"},
      {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "tensor 'a' has 8 bytes of data but shape and dtype F32 need 12"},
      {R"({"a":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,8]}})", 8,
       "tensor 'a' byte size overflows"},
      {R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
       8, "tensor 'a' element count overflows"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})",
       8, "tensor 'b' data [4, 8] overlaps tensor 'a' [0, 8]"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       8, "header has duplicate key 'a'"},
      {R"({"__metadata__":[1]})", 0, "__metadata__ is not an object"},
      {R"({"__metadata__":{"k":1}})", 0, "__metadata__ value 'k' is not a string"},
      {std::string(40, '[') + std::string(40, ']'), 0, "header: JSON nested deeper than 16 levels"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    expect_invalid(raw_file(c.header, c.data), c.fragment);
  }
}

TEST(SafetensorsTest, EveryTruncationIsRejected) {
  const std::vector<uint8_t> bytes = raw_file(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}})",
      14);
  ASSERT_EQ(SafetensorsFile::parse(bytes).tensors().size(), 2u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    try {
      SafetensorsFile::parse(cut);
      ADD_FAILURE() << "truncation at " << n << " parsed";
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
    }
  }
}

TEST(SafetensorsTest, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> valid = raw_file(
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[3],"data_offsets":[8,14]}})",
      14);
  std::mt19937 rng(7);
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    try {
      const SafetensorsFile f = SafetensorsFile::parse(bytes);
      for (const SafetensorsTensor& t : f.tensors()) {
        ASSERT_LE(t.data + t.bytes, bytes.data() + bytes.size());
      }
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
    }
  }
}

// A two-tensor HF directory, single file or sharded.
void write_hf_dir(const fs::path& dir, bool sharded) {
  write_file(dir / "config.json", R"({"architectures":["LlamaForCausalLM"],"hidden_size":4})");
  OwnedTensor a = make_tensor("model.a", DType::kF32, {2, 2});
  OwnedTensor b = make_tensor("model.b", DType::kBF16, {3});
  if (!sharded) {
    write_safetensors((dir / "model.safetensors").string(), {a.view, b.view});
    return;
  }
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), {a.view});
  write_safetensors((dir / "model-00002-of-00002.safetensors").string(), {b.view});
  write_file(dir / "model.safetensors.index.json",
             R"({"metadata":{"total_size":22},"weight_map":{)"
             R"("model.a":"model-00001-of-00002.safetensors",)"
             R"("model.b":"model-00002-of-00002.safetensors"}})");
}

void expect_hf_error(const fs::path& dir, const std::string& fragment) {
  try {
    HfModelDir::open(dir.string());
    ADD_FAILURE() << "opened; expected '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(HfModelDirTest, OpensSingleAndShardedDirectories) {
  for (bool sharded : {false, true}) {
    SCOPED_TRACE(sharded);
    const fs::path dir = fresh_dir(sharded ? "hf_sharded" : "hf_single");
    write_hf_dir(dir, sharded);
    const HfModelDir m = HfModelDir::open(dir.string());
    EXPECT_EQ(m.dir(), dir.string());
    EXPECT_NE(m.config_json().find("LlamaForCausalLM"), std::string::npos);
    EXPECT_EQ(m.tensor_names(), (std::vector<std::string>{"model.a", "model.b"}));
    const SafetensorsTensor* a = m.find("model.a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
    float first = 0;
    std::memcpy(&first, a->data, 4);
    EXPECT_EQ(first, -3.0f);
    const SafetensorsTensor* b = m.find("model.b");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->type, DType::kBF16);
    EXPECT_EQ(m.find("model.c"), nullptr);
  }
}

TEST(HfModelDirTest, ClearErrorsForBrokenDirectories) {
  try {
    HfModelDir::open((fs::path(testing::TempDir()) / "lazykv_no_such_dir").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }

  const fs::path no_config = fresh_dir("hf_no_config");
  expect_hf_error(no_config, "has no config.json");

  const fs::path no_weights = fresh_dir("hf_no_weights");
  write_file(no_weights / "config.json", "{}");
  expect_hf_error(no_weights, "has neither model.safetensors nor model.safetensors.index.json");

  const fs::path bad_config = fresh_dir("hf_bad_config");
  write_hf_dir(bad_config, false);
  write_file(bad_config / "config.json", "{\"a\":");
  expect_hf_error(bad_config, "config.json in");

  const fs::path missing_shard = fresh_dir("hf_missing_shard");
  write_hf_dir(missing_shard, true);
  fs::remove(missing_shard / "model-00002-of-00002.safetensors");
  expect_hf_error(missing_shard, "shard 'model-00002-of-00002.safetensors' listed in");

  const fs::path absent_tensor = fresh_dir("hf_absent_tensor");
  write_hf_dir(absent_tensor, true);
  write_file(absent_tensor / "model.safetensors.index.json",
             R"({"weight_map":{"model.a":"model-00001-of-00002.safetensors",)"
             R"("model.b":"model-00002-of-00002.safetensors",)"
             R"("model.z":"model-00002-of-00002.safetensors"}})");
  expect_hf_error(absent_tensor, "tensor 'model.z' listed in");

  const fs::path escaping = fresh_dir("hf_escaping");
  write_hf_dir(escaping, true);
  write_file(escaping / "model.safetensors.index.json",
             R"({"weight_map":{"model.a":"../model-00001-of-00002.safetensors"}})");
  expect_hf_error(escaping, "names an invalid shard file");

  const fs::path no_map = fresh_dir("hf_no_map");
  write_hf_dir(no_map, true);
  write_file(no_map / "model.safetensors.index.json", R"({"metadata":{}})");
  expect_hf_error(no_map, "has no 'weight_map' object");

  const fs::path corrupt_shard = fresh_dir("hf_corrupt_shard");
  write_hf_dir(corrupt_shard, true);
  write_file(corrupt_shard / "model-00001-of-00002.safetensors", "xx");
  expect_hf_error(corrupt_shard, "model-00001-of-00002.safetensors");
}

}  // namespace
}  // namespace lazykv
