#include "worker/format/gguf.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "common/error.h"

namespace lazykv {
namespace {

// (Built with append: GCC 12 warns falsely on "literal" + std::string&&.)
std::string indexed_name(size_t i) {
  std::string name = "t";
  name.append(std::to_string(i));
  return name;
}

std::vector<uint8_t> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + i * 7);
  return out;
}

// Expects parse to throw Error(kInvalidModel) whose message contains `fragment`.
void expect_invalid(const std::vector<uint8_t>& bytes, const std::string& fragment) {
  try {
    GgufFile::parse(bytes);
    ADD_FAILURE() << "parsed without error; expected '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message: " << e.what() << "\nexpected fragment: " << fragment;
    EXPECT_EQ(std::string(e.what()).rfind("gguf: ", 0), 0u) << e.what();
  }
}

size_t find_string(const std::vector<uint8_t>& bytes, const std::string& s) {
  auto it = std::search(bytes.begin(), bytes.end(), s.begin(), s.end());
  if (it == bytes.end()) throw std::runtime_error("test bug: '" + s + "' not in file");
  return static_cast<size_t>(it - bytes.begin());
}

template <typename T>
void poke(std::vector<uint8_t>& bytes, size_t at, T value) {
  ASSERT_LE(at + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}

// Field positions of a tensor info whose name occurs once in the file.
struct TensorInfoAt {
  size_t n_dims, dims, type, offset;
};
TensorInfoAt tensor_info_at(const std::vector<uint8_t>& bytes, const std::string& name,
                            uint32_t n_dims) {
  const size_t name_at = find_string(bytes, name);
  TensorInfoAt at{};
  at.n_dims = name_at + name.size();
  at.dims = at.n_dims + 4;
  at.type = at.dims + 8 * n_dims;
  at.offset = at.type + 4;
  return at;
}

// A small valid file: a few keys, an F32 vector, a 2-D F32 matrix and a Q8_0 matrix.
GgufWriter small_writer() {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("dup.a", 7);
  w.set_u32("dup.b", 8);
  w.set_bool("flag.x", true);
  w.set_string_array("names", {"x", "yy", "zzz"});
  w.add_tensor("t.a", {8}, DType::kF32, pattern_bytes(32, 1));
  w.add_tensor("t.b", {4, 3}, DType::kF32, pattern_bytes(48, 2));
  w.add_tensor("t.q", {32, 2}, DType::kQ8_0, pattern_bytes(68, 3));
  return w;
}

std::vector<uint8_t> small_file() { return small_writer().to_bytes(); }

TEST(GgufTest, RoundTripsEveryMetadataType) {
  GgufWriter w;
  w.set("v.u8", GgufValue{GgufType::kU8, uint64_t{200}});
  w.set("v.i8", GgufValue{GgufType::kI8, int64_t{-100}});
  w.set("v.u16", GgufValue{GgufType::kU16, uint64_t{60000}});
  w.set("v.i16", GgufValue{GgufType::kI16, int64_t{-30000}});
  w.set_u32("v.u32", 4000000000u);
  w.set_i32("v.i32", -2000000000);
  w.set("v.u64", GgufValue{GgufType::kU64, uint64_t{1} << 60});
  w.set("v.i64", GgufValue{GgufType::kI64, int64_t{-(int64_t{1} << 60)}});
  w.set_f32("v.f32", 1.5f);
  w.set("v.f64", GgufValue{GgufType::kF64, 2.25});
  w.set_bool("v.bool", true);
  w.set_string("v.str", std::string("hello\0world", 11));
  w.set_string_array("v.strs", {"a", "", "ccc"});
  w.set_i32_array("v.ints", {1, -2, 3});
  w.set_f32_array("v.floats", {0.5f, -1.25f});
  GgufArray inner1{GgufType::kU8, {GgufValue{GgufType::kU8, uint64_t{1}}}};
  GgufArray inner2{GgufType::kU8, {}};
  GgufArray outer{GgufType::kArray,
                  {GgufValue{GgufType::kArray, inner1}, GgufValue{GgufType::kArray, inner2}}};
  w.set("v.nested", GgufValue{GgufType::kArray, outer});
  w.set_u32("v.u32", 4000000001u);  // set() replaces

  const std::vector<uint8_t> bytes = w.to_bytes();
  const GgufFile f = GgufFile::parse(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 16u);
  EXPECT_EQ(f.get_int("v.u8"), 200);
  EXPECT_EQ(f.get_int("v.i8"), -100);
  EXPECT_EQ(f.get_int("v.u16"), 60000);
  EXPECT_EQ(f.get_int("v.i16"), -30000);
  EXPECT_EQ(f.get_int("v.u32"), 4000000001);
  EXPECT_EQ(f.get_int("v.i32"), -2000000000);
  EXPECT_EQ(f.get_int("v.u64"), int64_t{1} << 60);
  EXPECT_EQ(f.get_int("v.i64"), -(int64_t{1} << 60));
  EXPECT_EQ(f.get_float("v.f32"), 1.5);
  EXPECT_EQ(f.get_float("v.f64"), 2.25);
  EXPECT_EQ(f.get_float("v.i32"), -2000000000.0);  // any numeric type
  EXPECT_EQ(f.get_bool("v.bool"), true);
  EXPECT_EQ(f.get_string("v.str"), std::string("hello\0world", 11));
  EXPECT_EQ(f.get_string_array("v.strs"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.get_int_array("v.ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get_float_array("v.floats"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(f.get_float_array("v.ints"), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(f.find("v.u8")->type, GgufType::kU8);
  EXPECT_EQ(f.find("v.i64")->type, GgufType::kI64);

  const GgufValue* nested = f.find("v.nested");
  ASSERT_NE(nested, nullptr);
  const auto& arr = std::get<GgufArray>(nested->value);
  ASSERT_EQ(arr.elem_type, GgufType::kArray);
  ASSERT_EQ(arr.items.size(), 2u);
  EXPECT_EQ(std::get<GgufArray>(arr.items[0].value).items.size(), 1u);
  EXPECT_EQ(std::get<GgufArray>(arr.items[1].value).items.size(), 0u);

  EXPECT_FALSE(f.get_int("missing").has_value());
  EXPECT_FALSE(f.get_string_array("missing").has_value());
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(GgufTest, GettersRejectIncompatibleTypes) {
  GgufWriter w;
  w.set_string("s", "x");
  w.set_u32("u", 1);
  w.set("big", GgufValue{GgufType::kU64, ~uint64_t{0}});
  w.set_i32_array("ints", {1});
  const std::vector<uint8_t> bytes = w.to_bytes();
  const GgufFile f = GgufFile::parse(bytes);
  auto expect_type_error = [](const std::function<void()>& fn, const std::string& fragment) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidModel);
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_type_error([&] { (void)f.get_int("s"); }, "key 's' has type string, expected an integer");
  expect_type_error([&] { (void)f.get_string("u"); }, "key 'u' has type u32, expected string");
  expect_type_error([&] { (void)f.get_bool("u"); }, "expected bool");
  expect_type_error([&] { (void)f.get_float("s"); }, "expected a number");
  expect_type_error([&] { (void)f.get_int("big"); }, "does not fit in int64");
  expect_type_error([&] { (void)f.get_string_array("ints"); }, "expected an array of strings");
  expect_type_error([&] { (void)f.get_int_array("s"); }, "expected an array of integers");
}

TEST(GgufTest, RoundTripsEveryTensorType) {
  GgufWriter w;
  const std::vector<DType> types = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0,
                                    DType::kQ4_1, DType::kQ8_0, DType::kQ8_1, DType::kQ4_K,
                                    DType::kQ6_K, DType::kQ8_K};
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < types.size(); ++i) {
    const int64_t ne0 = static_cast<int64_t>(dtype_traits(types[i]).block_elems) * 2;
    data.push_back(pattern_bytes(row_bytes(types[i], ne0) * 3, static_cast<uint8_t>(i)));
    w.add_tensor(indexed_name(i), {ne0, 3}, types[i], data.back());
  }
  for (uint32_t alignment : {32u, 64u, 8u}) {
    const std::vector<uint8_t> bytes = w.to_bytes(alignment);
    const GgufFile f = GgufFile::parse(bytes);
    ASSERT_EQ(f.tensors().size(), types.size());
    if (alignment != 32) {
      EXPECT_EQ(f.get_int("general.alignment"), alignment);
    }
    for (size_t i = 0; i < types.size(); ++i) {
      const GgufTensorInfo* t = f.find_tensor(indexed_name(i));
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->type, types[i]);
      EXPECT_EQ(t->shape, (std::vector<int64_t>{static_cast<int64_t>(dtype_traits(types[i]).block_elems) * 2, 3}));
      EXPECT_EQ(t->offset % alignment, 0u);
      ASSERT_EQ(t->bytes, data[i].size());
      EXPECT_EQ(std::memcmp(t->data, data[i].data(), t->bytes), 0) << "tensor " << i;
      EXPECT_EQ(static_cast<size_t>(t->data - bytes.data()) % alignment, 0u);
    }
  }
  EXPECT_EQ(GgufFile::parse(w.to_bytes()).find_tensor("nope"), nullptr);
}

TEST(GgufTest, OpensFilesAndAcceptsVersion2) {
  const std::string path = testing::TempDir() + "/lazykv_gguf_open_test.gguf";
  small_writer().write(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("dup.b"), 8);
  EXPECT_EQ(f.get_bool("flag.x"), true);
  const GgufTensorInfo* b = f.find_tensor("t.b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(std::memcmp(b->data, pattern_bytes(48, 2).data(), 48), 0);
  std::filesystem::remove(path);

  std::vector<uint8_t> v2 = small_file();
  poke<uint32_t>(v2, 4, 2);
  EXPECT_EQ(GgufFile::parse(v2).version(), 2u);

  try {
    GgufFile::open(testing::TempDir() + "/lazykv_no_such_file.gguf");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(GgufTest, WriterRejectsBadTensors) {
  GgufWriter w;
  EXPECT_THROW(w.add_tensor("x", {8}, DType::kF32, pattern_bytes(31, 0)), Error);
  EXPECT_THROW(w.add_tensor("x", {16}, DType::kQ8_0, pattern_bytes(17, 0)), Error);
  EXPECT_THROW(w.add_tensor("x", {1, 1, 1, 1, 1}, DType::kF32, pattern_bytes(4, 0)), Error);
  EXPECT_THROW(w.add_tensor("x", {0}, DType::kF32, {}), Error);
  w.add_tensor("x", {1}, DType::kF32, pattern_bytes(4, 0));
  EXPECT_THROW(w.add_tensor("x", {1}, DType::kF32, pattern_bytes(4, 0)), Error);
  EXPECT_THROW(w.to_bytes(3), Error);
}

TEST(GgufTest, EveryTruncationIsRejected) {
  const std::vector<uint8_t> bytes = small_file();
  const GgufFile full = GgufFile::parse(bytes);
  size_t data_end = 0;
  for (const GgufTensorInfo& t : full.tensors()) {
    data_end = std::max(data_end, static_cast<size_t>(t.data - bytes.data()) + t.bytes);
  }
  ASSERT_GT(data_end, 100u);
  for (size_t n = 0; n < data_end; ++n) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    try {
      GgufFile::parse(cut);
      ADD_FAILURE() << "truncation at " << n << " parsed";
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
    }
  }
  // Trailing alignment padding after the last tensor is optional.
  for (size_t n = data_end; n <= bytes.size(); ++n) {
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_NO_THROW(GgufFile::parse(cut)) << n;
  }
  expect_invalid({}, "need 4 bytes for the magic at offset 0, file is 0 bytes");
  expect_invalid(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 12),
                 "need 8 bytes for the tensor count at offset 8, file is 12 bytes");
}

// Each defect, built by mutating a valid file's bytes.
struct Corruption {
  const char* name;
  std::function<void(std::vector<uint8_t>&)> mutate;
  std::string fragment;
};

TEST(GgufTest, CorruptFilesGiveClearErrors) {
  const uint64_t huge = uint64_t{1} << 60;
  const std::vector<Corruption> cases = {
      {"magic", [](auto& b) { b[0] = 'X'; }, "bad magic 'XGUF'"},
      {"version 1", [](auto& b) { poke<uint32_t>(b, 4, 1); }, "version 1 is not supported"},
      {"version 9", [](auto& b) { poke<uint32_t>(b, 4, 9); }, "unsupported version 9"},
      {"big endian", [](auto& b) { poke<uint32_t>(b, 4, 3u << 24); }, "big-endian"},
      {"tensor count", [&](auto& b) { poke<uint64_t>(b, 8, huge); }, "tensor count 1152921504606846976 cannot fit"},
      {"kv count", [&](auto& b) { poke<uint64_t>(b, 16, huge); }, "metadata count 1152921504606846976 cannot fit"},
      {"key length", [&](auto& b) { poke<uint64_t>(b, find_string(b, "dup.a") - 8, huge); },
       "string length 1152921504606846976 of metadata key #1"},
      {"string length",
       [&](auto& b) { poke<uint64_t>(b, find_string(b, "llama") - 8, huge); },
       "string length 1152921504606846976 of key 'general.architecture'"},
      {"array length",
       [&](auto& b) { poke<uint64_t>(b, find_string(b, "names") + 5 + 4 + 4, huge); },
       "array length 1152921504606846976 of string cannot fit"},
      {"array elem type",
       [&](auto& b) { poke<uint32_t>(b, find_string(b, "names") + 5 + 4, 13); },
       "unknown array element type 13, key 'names'"},
      {"metadata type", [&](auto& b) { poke<uint32_t>(b, find_string(b, "dup.a") + 5, 42); },
       "unknown metadata type 42, key 'dup.a'"},
      {"bool value", [&](auto& b) { b[find_string(b, "flag.x") + 6 + 4] = 2; },
       "bool value 2 is neither 0 nor 1, key 'flag.x'"},
      {"duplicate key", [&](auto& b) { b[find_string(b, "dup.b") + 4] = 'a'; },
       "duplicate metadata key 'dup.a'"},
      {"duplicate tensor", [&](auto& b) { b[find_string(b, "t.b") + 2] = 'a'; },
       "duplicate tensor 't.a'"},
      {"n_dims 5", [&](auto& b) { poke<uint32_t>(b, tensor_info_at(b, "t.a", 1).n_dims, 5); },
       "tensor 't.a' has n_dims 5, expected 1 to 4"},
      {"n_dims 0", [&](auto& b) { poke<uint32_t>(b, tensor_info_at(b, "t.a", 1).n_dims, 0); },
       "tensor 't.a' has n_dims 0"},
      {"zero dim", [&](auto& b) { poke<uint64_t>(b, tensor_info_at(b, "t.b", 2).dims + 8, 0); },
       "tensor 't.b' has invalid dimension 0 at index 1"},
      {"negative dim", [&](auto& b) { poke<int64_t>(b, tensor_info_at(b, "t.b", 2).dims, -4); },
       "tensor 't.b' has invalid dimension -4 at index 0"},
      {"element overflow",
       [&](auto& b) {
         const auto at = tensor_info_at(b, "t.b", 2);
         poke<uint64_t>(b, at.dims, uint64_t{1} << 40);
         poke<uint64_t>(b, at.dims + 8, uint64_t{1} << 40);
       },
       "tensor 't.b' element count overflows"},
      {"byte size overflow",
       [&](auto& b) {
         const auto at = tensor_info_at(b, "t.b", 2);
         poke<uint64_t>(b, at.dims, uint64_t{1} << 31);
         poke<uint64_t>(b, at.dims + 8, uint64_t{1} << 31);
       },
       "tensor 't.b' byte size overflows"},
      {"type id", [&](auto& b) { poke<uint32_t>(b, tensor_info_at(b, "t.b", 2).type, 99); },
       "tensor 't.b' has unknown or unsupported type id 99"},
      {"block size", [&](auto& b) { poke<uint64_t>(b, tensor_info_at(b, "t.q", 2).dims, 16); },
       "tensor 't.q' of type Q8_0 has row length 16, not a multiple of the block size 32"},
      {"misaligned", [&](auto& b) { poke<uint64_t>(b, tensor_info_at(b, "t.b", 2).offset, 33); },
       "tensor 't.b' data offset 33 is not a multiple of the alignment 32"},
      {"offset past end",
       [&](auto& b) { poke<uint64_t>(b, tensor_info_at(b, "t.q", 2).offset, uint64_t{1} << 40); },
       "tensor 't.q' data [offset 1099511627776, 68 bytes] extends past end of file"},
      {"data past end",
       [&](auto& b) { poke<uint64_t>(b, tensor_info_at(b, "t.a", 1).dims, 64); },
       "tensor 't.a' data [offset 0, 256 bytes] extends past end of file"},
      {"overlap", [&](auto& b) { poke<uint64_t>(b, tensor_info_at(b, "t.q", 2).offset, 32); },
       "overlaps tensor"},
  };
  const std::vector<uint8_t> valid = small_file();
  ASSERT_NO_THROW(GgufFile::parse(valid));
  for (const Corruption& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<uint8_t> bytes = valid;
    c.mutate(bytes);
    expect_invalid(bytes, c.fragment);
  }
}

TEST(GgufTest, RejectsBadAlignmentAndDeepNesting) {
  GgufWriter w = small_writer();
  std::vector<uint8_t> bytes = w.to_bytes(64);
  ASSERT_NO_THROW(GgufFile::parse(bytes));
  const size_t key_at = find_string(bytes, "general.alignment");
  std::vector<uint8_t> bad_value = bytes;
  poke<uint32_t>(bad_value, key_at + 17 + 4, 48);
  expect_invalid(bad_value, "general.alignment 48 is not a power of two");
  std::vector<uint8_t> bad_type = bytes;
  poke<uint32_t>(bad_type, key_at + 17, static_cast<uint32_t>(GgufType::kI32));
  expect_invalid(bad_type, "key 'general.alignment' has type i32, expected u32");
  // Alignment 1 puts tensor data at odd addresses, which the kernels cannot read in place.
  expect_invalid(w.to_bytes(1), "is not 4-byte aligned (general.alignment 1)");

  GgufValue v{GgufType::kU8, uint64_t{1}};
  for (int depth = 0; depth < 12; ++depth) {
    GgufArray arr{v.type, {v}};
    v = GgufValue{GgufType::kArray, std::move(arr)};
  }
  GgufWriter deep;
  deep.set("deep", v);
  expect_invalid(deep.to_bytes(), "arrays nested deeper than 8 levels, key 'deep'");
}

// A u8 takes one byte in the file but a whole parsed value in memory: the
// elements of all arrays together are bounded, not only by the file's size.
TEST(GgufTest, MetadataArraysAreBoundedInElements) {
  const uint64_t count = (uint64_t{1} << 24) + 1;
  std::vector<uint8_t> bytes;
  const auto put = [&](auto value) {
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + sizeof(value));
  };
  bytes.insert(bytes.end(), {'G', 'G', 'U', 'F'});
  put(uint32_t{3});   // version
  put(uint64_t{0});   // tensors
  put(uint64_t{1});   // metadata
  put(uint64_t{3});
  bytes.insert(bytes.end(), {'b', 'i', 'g'});
  put(static_cast<uint32_t>(GgufType::kArray));
  put(static_cast<uint32_t>(GgufType::kU8));
  put(count);
  bytes.resize(bytes.size() + count, 0);
  expect_invalid(bytes, "array length 16777217, key 'big', takes the metadata past 16777216 array elements");
}

TEST(GgufTest, RandomMutationsNeverCrash) {
  const std::vector<uint8_t> valid = small_file();
  std::mt19937 rng(12345);
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    try {
      const GgufFile f = GgufFile::parse(bytes);
      for (const GgufTensorInfo& t : f.tensors()) {
        ASSERT_GE(t.data, bytes.data());
        ASSERT_LE(t.data + t.bytes, bytes.data() + bytes.size());
      }
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
}

std::string default_model_path() {
  if (const char* env = std::getenv("LAZYKV_DEFAULT_MODEL"); env != nullptr && *env != '\0') {
    return env;
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "") +
         "/.cache/lazykv/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GgufTest, ParsesTheDefaultModel) {
  const std::string path = default_model_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "default model not found at " << path;
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_NEAR(*f.get_float("llama.rope.freq_base"), 100000.0, 1e-3);
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.has_value());
  EXPECT_EQ(tokens->size(), 49152u);
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type")->size(), 49152u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, DType::kQ8_0);
  EXPECT_EQ(embd->shape, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(embd->bytes, row_bytes(DType::kQ8_0, 576) * 49152);
  const GgufTensorInfo* q = f.find_tensor("blk.29.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, DType::kQ4_1);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied embeddings
}

}  // namespace
}  // namespace lazykv
