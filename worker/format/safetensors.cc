#include "worker/format/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/error.h"
#include "common/quote.h"

namespace lazykv {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr int kMaxHeaderDepth = 16;

[[noreturn]] void fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidModel, "safetensors: " + message);
}

[[noreturn]] void hf_fail(const std::string& message) {
  throw Error(ErrorCode::kInvalidModel, "hf model: " + message);
}

std::optional<DType> dtype_from_name(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
}

std::string_view dtype_name(DType type) {
  switch (type) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    default: return "";
  }
}

// Parses JSON text, rejecting deep nesting and duplicate keys (nlohmann
// silently keeps the last duplicate, which would hide a corrupt header).
// Errors are Error(kInvalidModel) prefixed with `prefix`.
json parse_json(std::string_view text, const std::string& what, const std::string& prefix) {
  auto error = [&](const std::string& message) {
    return Error(ErrorCode::kInvalidModel, prefix + message);
  };
  std::vector<std::set<std::string>> keys_by_depth;
  auto on_event = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        keys_by_depth.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys_by_depth.empty()) keys_by_depth.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys_by_depth.empty() && parsed.is_string() &&
            !keys_by_depth.back().insert(parsed.get<std::string>()).second) {
          throw error(what + " has duplicate key " + quote(parsed.get<std::string>()));
        }
        break;
      default:
        break;
    }
  };
  try {
    return parse_bounded_json<json>(text, kMaxHeaderDepth, size_t(1) << 30, on_event);
  } catch (const JsonLimitError& e) {
    throw error(what + ": " + e.what());
  } catch (const json::exception& e) {
    throw error(what + " is not valid JSON (" + e.what() + ")");
  }
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kIo, "cannot read '" + path.string() + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile(path);
  with_error_context(ErrorCode::kInvalidModel, path, [&] { f.parse_bytes(f.file_.bytes()); });
  return f;
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes) {
  SafetensorsFile f;
  f.parse_bytes(bytes);
  return f;
}

void SafetensorsFile::parse_bytes(std::span<const uint8_t> bytes) {
  if (bytes.size() < 8) {
    fail("file truncated: " + std::to_string(bytes.size()) +
         " bytes, need at least 8 for the header length");
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > kMaxHeaderBytes) {
    fail("header length " + std::to_string(header_len) + " exceeds the " +
         std::to_string(kMaxHeaderBytes) + "-byte limit, at offset 0");
  }
  if (header_len > bytes.size() - 8) {
    fail("header length " + std::to_string(header_len) + " extends past end of file (" +
         std::to_string(bytes.size()) + " bytes), at offset 0");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8),
                              static_cast<size_t>(header_len));
  const json header = parse_json(text, "header", "safetensors: ");
  if (!header.is_object()) fail("header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = bytes.size() - data_start;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    const std::string where = "tensor " + quote(name);
    if (name == "__metadata__") {
      if (!entry.is_object()) fail("__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail("__metadata__ value " + quote(k) + " is not a string");
      }
      continue;
    }
    if (!entry.is_object()) fail(where + " entry is not an object");
    const auto dtype_it = entry.find("dtype");
    const auto shape_it = entry.find("shape");
    const auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) fail(where + " has no string 'dtype'");
    if (shape_it == entry.end() || !shape_it->is_array()) fail(where + " has no array 'shape'");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
      fail(where + " has no 'data_offsets' pair");
    }
    const std::string dtype_str = dtype_it->get<std::string>();
    const std::optional<DType> type = dtype_from_name(dtype_str);
    if (!type) {
      fail(where + " has unsupported dtype " + quote(dtype_str) + " (supported: F32, F16, BF16)");
    }
    SafetensorsTensor t;
    t.name = name;
    t.type = *type;
    uint64_t elements = 1;
    if (shape_it->size() > 8) fail(where + " has " + std::to_string(shape_it->size()) + " dimensions");
    for (const json& d : *shape_it) {
      if (!d.is_number_unsigned()) fail(where + " has a shape entry that is not a non-negative integer");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(elements, dim, &elements)) {
        fail(where + " element count overflows");
      }
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& begin_j = (*offsets_it)[0];
    const json& end_j = (*offsets_it)[1];
    if (!begin_j.is_number_unsigned() || !end_j.is_number_unsigned()) {
      fail(where + " data_offsets are not non-negative integers");
    }
    const uint64_t begin = begin_j.get<uint64_t>();
    const uint64_t end = end_j.get<uint64_t>();
    if (begin > end || end > data_size) {
      fail(where + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] are outside the data section (" + std::to_string(data_size) + " bytes at offset " +
           std::to_string(data_start) + ")");
    }
    const uint64_t elem_size = dtype_traits(t.type).block_bytes;
    uint64_t expected = 0;
    if (__builtin_mul_overflow(elements, elem_size, &expected)) fail(where + " byte size overflows");
    if (expected != end - begin) {
      fail(where + " has " + std::to_string(end - begin) + " bytes of data but shape and dtype " +
           dtype_str + " need " + std::to_string(expected));
    }
    t.data = bytes.data() + data_start + begin;
    t.bytes = static_cast<size_t>(end - begin);
    spans.push_back(Span{begin, end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }

  // Keep tensors in file order; no two may share bytes.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Span* last_nonempty = nullptr;  // empty tensors occupy no bytes
  for (const Span& cur : spans) {
    if (cur.end == cur.begin) continue;
    if (last_nonempty != nullptr && cur.begin < last_nonempty->end) {
      const Span& prev = *last_nonempty;
      fail("tensor " + quote(tensors_[cur.index].name) + " data [" + std::to_string(cur.begin) +
           ", " + std::to_string(cur.end) + "] overlaps tensor " +
           quote(tensors_[prev.index].name) + " [" + std::to_string(prev.begin) + ", " +
           std::to_string(prev.end) + "]");
    }
    last_nonempty = &cur;
  }
  std::vector<SafetensorsTensor> ordered;
  ordered.reserve(tensors_.size());
  for (const Span& s : spans) ordered.push_back(std::move(tensors_[s.index]));
  tensors_ = std::move(ordered);
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

HfModelDir HfModelDir::open(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  if (!fs::is_directory(root)) {
    throw Error(ErrorCode::kNotFound, "hf model: '" + dir + "' is not a directory");
  }
  HfModelDir m;
  m.dir_ = dir;
  const fs::path config = root / "config.json";
  if (!fs::is_regular_file(config)) {
    hf_fail("'" + dir + "' has no config.json, so it is not a Hugging Face model directory");
  }
  m.config_json_ = read_text_file(config);
  if (!parse_json(m.config_json_, "config.json in '" + dir + "'", "hf model: ").is_object()) {
    hf_fail("config.json in '" + dir + "' is not a JSON object");
  }

  auto add_shard = [&](const std::string& file) -> const SafetensorsFile& {
    m.shards_.push_back(std::make_unique<SafetensorsFile>(
        SafetensorsFile::open((root / file).string())));
    const SafetensorsFile& shard = *m.shards_.back();
    for (const SafetensorsTensor& t : shard.tensors()) {
      if (!m.tensors_.emplace(t.name, &t).second) {
        hf_fail("tensor " + quote(t.name) + " appears in more than one shard (again in '" + file + "')");
      }
    }
    return shard;
  };

  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";
  if (fs::is_regular_file(index_path)) {
    const std::string where = "model.safetensors.index.json in '" + dir + "'";
    const json index = parse_json(read_text_file(index_path), where, "hf model: ");
    if (!index.is_object()) hf_fail(where + " is not a JSON object");
    const auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object()) hf_fail(where + " has no 'weight_map' object");
    std::map<std::string, std::vector<std::string>> by_shard;  // each shard opened once
    for (const auto& [name, file] : map_it->items()) {
      if (!file.is_string()) hf_fail(where + ": weight_map entry " + quote(name) + " is not a file name");
      const std::string f = file.get<std::string>();
      if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
          f.find('\\') != std::string::npos) {
        hf_fail(where + ": weight_map entry " + quote(name) + " names an invalid shard file " + quote(f));
      }
      by_shard[f].push_back(name);
    }
    if (by_shard.empty()) hf_fail(where + " lists no tensors");
    for (const auto& [file, names] : by_shard) {
      if (!fs::is_regular_file(root / file)) {
        hf_fail("shard " + quote(file) + " listed in " + where + " is missing");
      }
      const SafetensorsFile& shard = add_shard(file);
      for (const std::string& name : names) {
        if (shard.find(name) == nullptr) {
          hf_fail("tensor " + quote(name) + " listed in " + where + " is absent from shard " +
                  quote(file));
        }
      }
    }
  } else if (fs::is_regular_file(single_path)) {
    add_shard("model.safetensors");
  } else {
    hf_fail("'" + dir + "' has neither model.safetensors nor model.safetensors.index.json");
  }
  return m;
}

const SafetensorsTensor* HfModelDir::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

std::vector<std::string> HfModelDir::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) names.push_back(name);
  return names;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const SafetensorsTensor& t : tensors) {
    const std::string_view name = dtype_name(t.type);
    if (name.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "safetensors writer: tensor '" + t.name + "' must be F32, F16 or BF16");
    }
    if (t.name == "__metadata__" || !seen.insert(t.name).second) {
      throw Error(ErrorCode::kInvalidArgument,
                  "safetensors writer: invalid or duplicate tensor name '" + t.name + "'");
    }
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(ErrorCode::kInvalidArgument, "safetensors writer: negative dimension");
      elements *= static_cast<uint64_t>(d);
    }
    if (elements * dtype_traits(t.type).block_bytes != t.bytes || (t.bytes > 0 && t.data == nullptr)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "safetensors writer: tensor '" + t.name + "' data size does not match its shape");
    }
    header[t.name] = {{"dtype", name}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 8 + 7) / 8 * 8 - 8, ' ');  // data section 8-byte aligned

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw Error(ErrorCode::kIo, "safetensors writer: cannot create '" + path + "'");
  bool ok = true;
  const uint64_t len = text.size();
  ok &= std::fwrite(&len, 8, 1, f) == 1;
  ok &= std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const SafetensorsTensor& t : tensors) {
    if (t.bytes > 0) ok &= std::fwrite(t.data, 1, t.bytes, f) == t.bytes;
  }
  ok &= std::fclose(f) == 0;
  if (!ok) throw Error(ErrorCode::kIo, "safetensors writer: cannot write '" + path + "'");
}

}  // namespace lazykv
