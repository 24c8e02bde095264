#include "worker/format/gguf.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "common/error.h"
#include "common/quote.h"

namespace lazykv {
namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kMaxAlignment = 1u << 24;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidModel, "gguf: " + message);
}

std::string_view type_name(GgufType type) {
  switch (type) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "unknown";
}

bool is_valid_type(uint32_t id) { return id <= static_cast<uint32_t>(GgufType::kF64); }

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

bool is_float(GgufType t) { return t == GgufType::kF32 || t == GgufType::kF64; }

// Bytes one value of a scalar type occupies in the file (0 for string/array).
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    default: return 0;
  }
}

// The fewest bytes one value of `t` can take in the file: bounds element
// counts by the bytes that remain, so a lying count never drives allocation.
size_t min_encoded_size(GgufType t) {
  if (t == GgufType::kString) return 8;              // length
  if (t == GgufType::kArray) return 4 + 8;           // element type + count
  return scalar_size(t);
}

// Bounds-checked little-endian cursor over the file bytes.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }
  size_t size() const { return bytes_.size(); }

  void need(size_t n, std::string_view what) const {
    if (n > remaining()) {
      fail("file truncated: need " + std::to_string(n) + " bytes for " + std::string(what) +
           " at offset " + std::to_string(pos_) + ", file is " + std::to_string(size()) +
           " bytes");
    }
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const uint64_t len = read<uint64_t>(what);
    if (len > remaining()) {
      fail("string length " + std::to_string(len) + " of " + std::string(what) + " at offset " +
           std::to_string(pos_ - 8) + " exceeds the " + std::to_string(remaining()) +
           " bytes left in the file");
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

// Array elements in all metadata together. Each parsed value takes about 48
// bytes however small it is in the file (a u8), so counts bounded only by
// the file's size would let a 1 GB file take 48 GB. Real models have about
// 1.5M (tokens, merges, types, scores).
constexpr uint64_t kMaxMetadataItems = uint64_t{1} << 24;

GgufValue read_value(Reader& r, GgufType type, const std::string& where, int depth, uint64_t& items_left) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::kU8: v.value = uint64_t{r.read<uint8_t>(where)}; break;
    case GgufType::kI8: v.value = int64_t{r.read<int8_t>(where)}; break;
    case GgufType::kU16: v.value = uint64_t{r.read<uint16_t>(where)}; break;
    case GgufType::kI16: v.value = int64_t{r.read<int16_t>(where)}; break;
    case GgufType::kU32: v.value = uint64_t{r.read<uint32_t>(where)}; break;
    case GgufType::kI32: v.value = int64_t{r.read<int32_t>(where)}; break;
    case GgufType::kU64: v.value = uint64_t{r.read<uint64_t>(where)}; break;
    case GgufType::kI64: v.value = int64_t{r.read<int64_t>(where)}; break;
    case GgufType::kF32: v.value = double{r.read<float>(where)}; break;
    case GgufType::kF64: v.value = double{r.read<double>(where)}; break;
    case GgufType::kBool: {
      const size_t at = r.pos();
      const uint8_t b = r.read<uint8_t>(where);
      if (b > 1) {
        fail("bool value " + std::to_string(b) + " is neither 0 nor 1, " + where + " at offset " +
             std::to_string(at));
      }
      v.value = b == 1;
      break;
    }
    case GgufType::kString: v.value = r.read_string(where); break;
    case GgufType::kArray: {
      if (depth >= kMaxArrayDepth) {
        fail("arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels, " + where);
      }
      const size_t at = r.pos();
      const uint32_t elem_id = r.read<uint32_t>(where + " array element type");
      if (!is_valid_type(elem_id)) {
        fail("unknown array element type " + std::to_string(elem_id) + ", " + where +
             " at offset " + std::to_string(at));
      }
      const auto elem_type = static_cast<GgufType>(elem_id);
      const uint64_t count = r.read<uint64_t>(where + " array length");
      const size_t min_size = min_encoded_size(elem_type);
      if (count > r.remaining() / min_size) {
        fail("array length " + std::to_string(count) + " of " + std::string(type_name(elem_type)) +
             " cannot fit in the " + std::to_string(r.remaining()) + " bytes left, " + where +
             " at offset " + std::to_string(at));
      }
      if (count > items_left) {
        fail("array length " + std::to_string(count) + ", " + where + ", takes the metadata past " +
             std::to_string(kMaxMetadataItems) + " array elements");
      }
      items_left -= count;
      GgufArray arr;
      arr.elem_type = elem_type;
      arr.items.reserve(static_cast<size_t>(count));
      for (uint64_t i = 0; i < count; ++i) {
        arr.items.push_back(read_value(r, elem_type, where, depth + 1, items_left));
      }
      v.value = std::move(arr);
      break;
    }
  }
  return v;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

[[noreturn]] void wrong_type(std::string_view key, GgufType actual, std::string_view expected) {
  fail("key " + quote(key) + " has type " + std::string(type_name(actual)) + ", expected " +
       std::string(expected));
}

// Integer value as int64 if it fits (for getters).
std::optional<int64_t> as_int(const GgufValue& v) {
  if (!is_integer(v.type)) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&v.value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v.value)) return *i;
  return std::nullopt;
}

std::optional<double> as_number(const GgufValue& v) {
  if (is_float(v.type)) return std::get<double>(v.value);
  if (!is_integer(v.type)) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v.value)) return static_cast<double>(*i);
  return std::nullopt;
}

}  // namespace

GgufFile GgufFile::open(const std::string& path, FilePages pages) {
  GgufFile f;
  f.file_ = MappedFile(path, pages);
  with_error_context(ErrorCode::kInvalidModel, path, [&] { f.parse_bytes(f.file_.bytes()); });
  return f;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufFile f;
  f.parse_bytes(bytes);
  return f;
}

void GgufFile::parse_bytes(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  r.need(4, "the magic");
  if (std::memcmp(bytes.data(), "GGUF", 4) != 0) {
    fail("bad magic " + quote(std::string_view(reinterpret_cast<const char*>(bytes.data()), 4)) +
         " (expected 'GGUF'), at offset 0");
  }
  r.read<uint32_t>("the magic");
  version_ = r.read<uint32_t>("the version");
  if (version_ == 1) {
    fail("version 1 is not supported (only GGUF v2 and v3; re-convert the model with a current "
         "llama.cpp), at offset 4");
  }
  if (version_ != 2 && version_ != 3) {
    if (__builtin_bswap32(version_) == 2 || __builtin_bswap32(version_) == 3) {
      fail("big-endian GGUF files are not supported, at offset 4");
    }
    fail("unsupported version " + std::to_string(version_) + " (expected 2 or 3), at offset 4");
  }
  const uint64_t tensor_count = r.read<uint64_t>("the tensor count");
  const uint64_t kv_count = r.read<uint64_t>("the metadata count");

  // Every KV pair takes at least 8 (key length) + 4 (type) + 1 bytes; every
  // tensor info at least 8 (name length) + 4 + 8 (one dim) + 4 + 8.
  if (kv_count > r.remaining() / 13) {
    fail("metadata count " + std::to_string(kv_count) + " cannot fit in the " +
         std::to_string(r.remaining()) + " bytes left, at offset 16");
  }
  uint64_t items_left = kMaxMetadataItems;
  for (uint64_t i = 0; i < kv_count; ++i) {
    const std::string where_key = "metadata key #" + std::to_string(i);
    std::string key = r.read_string(where_key);
    const std::string where = "key " + quote(key);
    const size_t type_at = r.pos();
    const uint32_t type_id = r.read<uint32_t>(where + " type");
    if (!is_valid_type(type_id)) {
      fail("unknown metadata type " + std::to_string(type_id) + ", " + where + " at offset " +
           std::to_string(type_at));
    }
    GgufValue value = read_value(r, static_cast<GgufType>(type_id), where, 0, items_left);
    if (metadata_.count(key) != 0) fail("duplicate metadata " + where);
    metadata_.emplace(std::move(key), std::move(value));
  }

  uint32_t alignment = kDefaultAlignment;
  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufType::kU32) wrong_type("general.alignment", a->type, "u32");
    const uint64_t av = std::get<uint64_t>(a->value);
    if (av == 0 || !std::has_single_bit(av) || av > kMaxAlignment) {
      fail("general.alignment " + std::to_string(av) + " is not a power of two in [1, " +
           std::to_string(kMaxAlignment) + "]");
    }
    alignment = static_cast<uint32_t>(av);
  }

  const size_t tensors_at = r.pos();
  if (tensor_count > r.remaining() / 32) {
    fail("tensor count " + std::to_string(tensor_count) + " cannot fit in the " +
         std::to_string(r.remaining()) + " bytes left, at offset " + std::to_string(tensors_at));
  }
  tensors_.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = r.read_string("tensor #" + std::to_string(i) + " name");
    const std::string where = "tensor " + quote(t.name);
    const uint32_t n_dims = r.read<uint32_t>(where + " n_dims");
    if (n_dims == 0 || n_dims > kMaxDims) {
      fail(where + " has n_dims " + std::to_string(n_dims) + ", expected 1 to " +
           std::to_string(kMaxDims));
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = r.read<uint64_t>(where + " dims");
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(where + " has invalid dimension " + std::to_string(static_cast<int64_t>(dim)) +
             " at index " + std::to_string(d));
      }
      if (mul_overflows(elements, dim, &elements) ||
          elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(where + " element count overflows");
      }
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const uint32_t type_id = r.read<uint32_t>(where + " type");
    const std::optional<DType> type = dtype_from_id(type_id);
    if (!type) fail(where + " has unknown or unsupported type id " + std::to_string(type_id));
    t.type = *type;
    const DTypeTraits& traits = dtype_traits(t.type);
    const uint64_t ne0 = static_cast<uint64_t>(t.shape[0]);
    if (ne0 % traits.block_elems != 0) {
      fail(where + " of type " + std::string(traits.name) + " has row length " +
           std::to_string(ne0) + ", not a multiple of the block size " +
           std::to_string(traits.block_elems));
    }
    uint64_t bytes_total = 0;
    if (mul_overflows(elements / traits.block_elems, traits.block_bytes, &bytes_total)) {
      fail(where + " byte size overflows");
    }
    t.bytes = static_cast<size_t>(bytes_total);
    t.offset = r.read<uint64_t>(where + " offset");
    if (t.offset % alignment != 0) {
      fail(where + " data offset " + std::to_string(t.offset) + " is not a multiple of the " +
           "alignment " + std::to_string(alignment));
    }
    if (tensor_index_.count(t.name) != 0) fail("duplicate " + where);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const uint64_t header_end = r.pos();
  const uint64_t data_start = (header_end + alignment - 1) / alignment * alignment;
  const uint64_t file_size = bytes.size();
  if (!tensors_.empty() && data_start > file_size) {
    fail("data section at offset " + std::to_string(data_start) + " starts past end of file (" +
         std::to_string(file_size) + " bytes)");
  }
  const uint64_t data_size = data_start > file_size ? 0 : file_size - data_start;
  for (GgufTensorInfo& t : tensors_) {
    if (t.offset > data_size || t.bytes > data_size - t.offset) {
      fail("tensor " + quote(t.name) + " data [offset " + std::to_string(t.offset) + ", " +
           std::to_string(t.bytes) + " bytes] extends past end of file (" +
           std::to_string(file_size) + " bytes, data section starts at " +
           std::to_string(data_start) + ")");
    }
    t.data = bytes.data() + data_start + t.offset;
    // Kernels read f32 values and the f16 scales of quantized blocks in
    // place: data at an odd address (possible with general.alignment 1 or 2)
    // would be undefined behaviour there.
    if (reinterpret_cast<uintptr_t>(t.data) % 4 != 0) {
      fail("tensor " + quote(t.name) + " data at file offset " + std::to_string(data_start + t.offset) +
           " is not 4-byte aligned (general.alignment " + std::to_string(alignment) + ")");
    }
  }

  // Tensors may come in any order in the info table, but never share bytes.
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensorInfo& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& prev = *by_offset[i - 1];
    const GgufTensorInfo& cur = *by_offset[i];
    if (prev.offset + prev.bytes > cur.offset) {
      fail("tensor " + quote(cur.name) + " data [offset " + std::to_string(cur.offset) +
           "] overlaps tensor " + quote(prev.name) + " [offset " + std::to_string(prev.offset) +
           ", " + std::to_string(prev.bytes) + " bytes]");
    }
  }
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufType::kString) wrong_type(key, v->type, "string");
  return std::get<std::string>(v->value);
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!is_integer(v->type)) wrong_type(key, v->type, "an integer");
  const std::optional<int64_t> i = as_int(*v);
  if (!i) fail("key " + quote(key) + " value does not fit in int64");
  return i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  const std::optional<double> d = as_number(*v);
  if (!d) wrong_type(key, v->type, "a number");
  return d;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufType::kBool) wrong_type(key, v->type, "bool");
  return std::get<bool>(v->value);
}

std::optional<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufType::kArray) wrong_type(key, v->type, "an array of strings");
  const GgufArray& arr = std::get<GgufArray>(v->value);
  if (arr.elem_type != GgufType::kString && !arr.items.empty()) {
    fail("key " + quote(key) + " is an array of " + std::string(type_name(arr.elem_type)) +
         ", expected an array of strings");
  }
  std::vector<std::string> out;
  out.reserve(arr.items.size());
  for (const GgufValue& item : arr.items) out.push_back(std::get<std::string>(item.value));
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufType::kArray) wrong_type(key, v->type, "an array of integers");
  const GgufArray& arr = std::get<GgufArray>(v->value);
  if (!is_integer(arr.elem_type) && !arr.items.empty()) {
    fail("key " + quote(key) + " is an array of " + std::string(type_name(arr.elem_type)) +
         ", expected an array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(arr.items.size());
  for (const GgufValue& item : arr.items) {
    const std::optional<int64_t> i = as_int(item);
    if (!i) fail("key " + quote(key) + " has an element that does not fit in int64");
    out.push_back(*i);
  }
  return out;
}

std::optional<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufType::kArray) wrong_type(key, v->type, "an array of numbers");
  const GgufArray& arr = std::get<GgufArray>(v->value);
  if (!is_integer(arr.elem_type) && !is_float(arr.elem_type) && !arr.items.empty()) {
    fail("key " + quote(key) + " is an array of " + std::string(type_name(arr.elem_type)) +
         ", expected an array of numbers");
  }
  std::vector<double> out;
  out.reserve(arr.items.size());
  for (const GgufValue& item : arr.items) out.push_back(*as_number(item));
  return out;
}

// ---------------------------------------------------------------------------
// Writer

namespace {

[[noreturn]] void writer_fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "gguf writer: " + message);
}

class ByteSink {
 public:
  template <typename T>
  void put(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void pad_to(size_t alignment) {
    out_.resize((out_.size() + alignment - 1) / alignment * alignment, 0);
  }
  void append(const std::vector<uint8_t>& bytes) { out_.insert(out_.end(), bytes.begin(), bytes.end()); }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

uint64_t value_u64(const GgufValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.value)) return static_cast<uint64_t>(*i);
  if (const auto* b = std::get_if<bool>(&v.value)) return *b ? 1 : 0;
  writer_fail("integer value of type " + std::string(type_name(v.type)) + " holds a non-integer");
}

double value_f64(const GgufValue& v) {
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  writer_fail("float value holds a non-float");
}

void write_value(ByteSink& out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8: out.put<uint8_t>(static_cast<uint8_t>(value_u64(v))); break;
    case GgufType::kI8: out.put<int8_t>(static_cast<int8_t>(value_u64(v))); break;
    case GgufType::kU16: out.put<uint16_t>(static_cast<uint16_t>(value_u64(v))); break;
    case GgufType::kI16: out.put<int16_t>(static_cast<int16_t>(value_u64(v))); break;
    case GgufType::kU32: out.put<uint32_t>(static_cast<uint32_t>(value_u64(v))); break;
    case GgufType::kI32: out.put<int32_t>(static_cast<int32_t>(value_u64(v))); break;
    case GgufType::kU64: out.put<uint64_t>(value_u64(v)); break;
    case GgufType::kI64: out.put<int64_t>(static_cast<int64_t>(value_u64(v))); break;
    case GgufType::kF32: out.put<float>(static_cast<float>(value_f64(v))); break;
    case GgufType::kF64: out.put<double>(value_f64(v)); break;
    case GgufType::kBool: out.put<uint8_t>(value_u64(v) != 0 ? 1 : 0); break;
    case GgufType::kString: {
      const auto* s = std::get_if<std::string>(&v.value);
      if (s == nullptr) writer_fail("string value holds a non-string");
      out.put_string(*s);
      break;
    }
    case GgufType::kArray: {
      const auto* arr = std::get_if<GgufArray>(&v.value);
      if (arr == nullptr) writer_fail("array value holds a non-array");
      out.put<uint32_t>(static_cast<uint32_t>(arr->elem_type));
      out.put<uint64_t>(arr->items.size());
      for (const GgufValue& item : arr->items) {
        if (item.type != arr->elem_type) writer_fail("array element type does not match the array");
        write_value(out, item);
      }
      break;
    }
    default:
      writer_fail("unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
  }
}

template <typename T, typename Fn>
GgufValue make_array(GgufType elem_type, const std::vector<T>& values, Fn to_value) {
  GgufArray arr;
  arr.elem_type = elem_type;
  arr.items.reserve(values.size());
  for (const T& x : values) arr.items.push_back(GgufValue{elem_type, to_value(x)});
  return GgufValue{GgufType::kArray, std::move(arr)};
}

}  // namespace

void GgufWriter::set(std::string key, GgufValue value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::set_string(std::string key, std::string value) {
  set(std::move(key), GgufValue{GgufType::kString, std::move(value)});
}
void GgufWriter::set_u32(std::string key, uint32_t value) {
  set(std::move(key), GgufValue{GgufType::kU32, uint64_t{value}});
}
void GgufWriter::set_i32(std::string key, int32_t value) {
  set(std::move(key), GgufValue{GgufType::kI32, int64_t{value}});
}
void GgufWriter::set_f32(std::string key, float value) {
  set(std::move(key), GgufValue{GgufType::kF32, double{value}});
}
void GgufWriter::set_bool(std::string key, bool value) {
  set(std::move(key), GgufValue{GgufType::kBool, value});
}
void GgufWriter::set_string_array(std::string key, const std::vector<std::string>& values) {
  set(std::move(key), make_array(GgufType::kString, values, [](const std::string& s) {
        return decltype(GgufValue::value){s};
      }));
}
void GgufWriter::set_i32_array(std::string key, const std::vector<int32_t>& values) {
  set(std::move(key), make_array(GgufType::kI32, values, [](int32_t x) {
        return decltype(GgufValue::value){int64_t{x}};
      }));
}
void GgufWriter::set_f32_array(std::string key, const std::vector<float>& values) {
  set(std::move(key), make_array(GgufType::kF32, values, [](float x) {
        return decltype(GgufValue::value){double{x}};
      }));
}

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> shape, DType type, size_t bytes,
                            TensorFill fill) {
  if (shape.empty() || shape.size() > kMaxDims) {
    writer_fail("tensor '" + name + "' must have 1 to 4 dimensions");
  }
  uint64_t rows = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0) writer_fail("tensor '" + name + "' has a non-positive dimension");
    if (d > 0) rows *= static_cast<uint64_t>(shape[d]);
  }
  const DTypeTraits& traits = dtype_traits(type);
  if (static_cast<uint64_t>(shape[0]) % traits.block_elems != 0) {
    writer_fail("tensor '" + name + "' row length is not a multiple of the block size");
  }
  const uint64_t expected = row_bytes(type, static_cast<size_t>(shape[0])) * rows;
  if (bytes != expected) {
    writer_fail("tensor '" + name + "' has " + std::to_string(bytes) + " bytes, expected " +
                std::to_string(expected));
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) writer_fail("duplicate tensor '" + name + "'");
  }
  tensors_.push_back(PendingTensor{std::move(name), std::move(shape), type, bytes, std::move(fill)});
}

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> shape, DType type,
                            std::vector<uint8_t> data) {
  const size_t bytes = data.size();
  auto owned = std::make_shared<std::vector<uint8_t>>(std::move(data));
  add_tensor(std::move(name), std::move(shape), type, bytes,
             [owned](uint8_t* out) { std::memcpy(out, owned->data(), owned->size()); });
}

std::vector<uint8_t> GgufWriter::header(uint32_t alignment) const {
  if (alignment == 0 || !std::has_single_bit(alignment) || alignment > kMaxAlignment) {
    writer_fail("alignment " + std::to_string(alignment) + " is not a power of two");
  }
  // The reader learns a non-default alignment only from general.alignment.
  std::vector<std::pair<std::string, GgufValue>> metadata = metadata_;
  const GgufValue align_value{GgufType::kU32, uint64_t{alignment}};
  bool has_alignment = false;
  for (auto& [k, v] : metadata) {
    if (k == "general.alignment") {
      v = align_value;
      has_alignment = true;
    }
  }
  if (!has_alignment && alignment != kDefaultAlignment) {
    metadata.emplace_back("general.alignment", align_value);
  }

  ByteSink out;
  out.put<uint32_t>(0x46554747);  // "GGUF" little-endian
  out.put<uint32_t>(3);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(metadata.size());
  for (const auto& [key, value] : metadata) {
    out.put_string(key);
    out.put<uint32_t>(static_cast<uint32_t>(value.type));
    write_value(out, value);
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    out.put_string(t.name);
    out.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) out.put<uint64_t>(static_cast<uint64_t>(d));
    out.put<uint32_t>(static_cast<uint32_t>(t.type));
    out.put<uint64_t>(offset);
    offset = (offset + t.bytes + alignment - 1) / alignment * alignment;
  }
  out.pad_to(alignment);
  return std::move(out.bytes());
}

void GgufWriter::stream(uint32_t alignment, const std::function<void(const uint8_t*, size_t)>& sink) const {
  const std::vector<uint8_t> head = header(alignment);
  sink(head.data(), head.size());
  std::vector<uint8_t> data;
  for (const PendingTensor& t : tensors_) {  // one tensor in memory at a time
    data.assign((t.bytes + alignment - 1) / alignment * alignment, 0);
    t.fill(data.data());
    sink(data.data(), data.size());
  }
}

std::vector<uint8_t> GgufWriter::to_bytes(uint32_t alignment) const {
  std::vector<uint8_t> out;
  stream(alignment, [&](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); });
  return out;
}

void GgufWriter::write(std::FILE* f, const std::string& what, uint32_t alignment) const {
  stream(alignment, [&](const uint8_t* p, size_t n) {
    if (std::fwrite(p, 1, n, f) != n) throw Error(ErrorCode::kIo, "gguf writer: cannot write " + what);
  });
  if (std::fflush(f) != 0) throw Error(ErrorCode::kIo, "gguf writer: cannot write " + what);
}

void GgufWriter::write(const std::string& path, uint32_t alignment) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw Error(ErrorCode::kIo, "gguf writer: cannot create '" + path + "'");
  try {
    write(f, "'" + path + "'", alignment);
  } catch (...) {
    std::fclose(f);
    throw;
  }
  if (std::fclose(f) != 0) throw Error(ErrorCode::kIo, "gguf writer: cannot write '" + path + "'");
}

void set_model_metadata(GgufWriter& w, const GgufModelShape& m) {
  const std::string& a = m.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.type", "model");
  w.set_string("general.name", m.name);
  w.set_u32(a + ".block_count", static_cast<uint32_t>(m.n_layer));
  w.set_u32(a + ".context_length", static_cast<uint32_t>(m.n_ctx));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(m.n_embd));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(m.n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(m.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(m.n_head_kv));
  w.set_f32(a + ".rope.freq_base", m.rope_theta);
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", m.rms_eps);
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(m.head_dim));
  w.set_u32(a + ".vocab_size", static_cast<uint32_t>(m.n_vocab));
  if (m.quantized) w.set_u32("general.quantization_version", 2);
}

void set_tokenizer_metadata(GgufWriter& w, const TokenizerSpec& tok) {
  w.set_string("tokenizer.ggml.model", tok.model);
  w.set_string("tokenizer.ggml.pre", tok.pre);
  w.set_string_array("tokenizer.ggml.tokens", tok.tokens);
  w.set_i32_array("tokenizer.ggml.token_type", tok.token_types);
  w.set_string_array("tokenizer.ggml.merges", tok.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok.bos_id));
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok.eos_id));
  w.set_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(std::max(tok.unk_id, 0)));
  w.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(std::max(tok.pad_id, 0)));
  w.set_bool("tokenizer.ggml.add_bos_token", tok.add_bos);
  w.set_bool("tokenizer.ggml.add_space_prefix", false);
  if (!tok.chat_template.empty()) w.set_string("tokenizer.chat_template", tok.chat_template);
}

}  // namespace lazykv
