// Tokenizer::spec_from_hf_json: a Hugging Face tokenizer.json (BPE model with
// a byte-level pre-tokenizer) plus tokenizer_config.json and
// chat_template.jinja beside it when present.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "common/error.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace lazykv {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeUnused = 5;

// Split regexes of the pre-tokenizers we know, as written in tokenizer.json.
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// tokenizer.json of a 256k vocabulary is about 20 MB.
constexpr uintmax_t kMaxFileBytes = uintmax_t{1} << 30;

std::string read_file(const fs::path& path) {
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_regular_file(path, ec)) {
    throw Error(ErrorCode::kInvalidModel, path.string() + " is not a regular file");  // a FIFO would hang, /dev/zero never end
  }
  if (fs::exists(path, ec) && fs::file_size(path, ec) > kMaxFileBytes) {
    throw Error(ErrorCode::kInvalidModel, path.string() + " is larger than 1 GiB");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot open " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

json parse_json(const fs::path& path) {
  const std::string text = read_file(path);
  try {
    return parse_bounded_json(text);
  } catch (const JsonLimitError& e) {
    throw Error(ErrorCode::kInvalidModel, path.string() + ": " + e.what());
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidModel, path.string() + ": invalid JSON: " + e.what());
  }
}

bool is_type(const json& node, std::string_view type) {
  return node.is_object() && node.value("type", "") == type;
}

bool is_byte_level(const json& node, bool use_regex) {
  return is_type(node, "ByteLevel") && !node.value("add_prefix_space", false) &&
         node.value("use_regex", true) == use_regex;
}

// The Split regex of a pre-tokenizer step (Isolated, not inverted), or "".
std::string split_regex(const json& node) {
  if (!is_type(node, "Split") || node.value("behavior", "") != "Isolated" ||
      node.value("invert", false)) {
    return {};
  }
  const json& pattern = node.value("pattern", json::object());
  if (pattern.contains("Regex") && pattern["Regex"].is_string()) return pattern["Regex"];
  return {};
}

// Our pre-tokenizer name for a tokenizer.json pre_tokenizer node.
std::string pre_tokenizer_name(const json& pre, const json& normalizer) {
  const bool nfc = is_type(normalizer, "NFC");
  if (!normalizer.is_null() && !nfc) {
    throw Error(ErrorCode::kInvalidModel, "unsupported tokenizer normalizer " +
                                              normalizer.dump().substr(0, 200) +
                                              " (supported: none, or NFC with the qwen2 split)");
  }
  std::vector<json> steps;
  if (is_type(pre, "Sequence")) {
    for (const json& step : pre.value("pretokenizers", json::array())) steps.push_back(step);
  } else if (!pre.is_null()) {
    steps.push_back(pre);
  }

  std::string name;
  if (steps.size() == 1 && is_byte_level(steps[0], true)) {
    name = "gpt2";
  } else if (steps.size() == 2 && is_type(steps[0], "Digits") &&
             steps[0].value("individual_digits", false) && is_byte_level(steps[1], true)) {
    name = "smollm";
  } else if (steps.size() == 2 && is_byte_level(steps[1], false)) {
    const std::string regex = split_regex(steps[0]);
    if (regex == kQwen2Regex) name = "qwen2";
    if (regex == kLlama3Regex) name = "llama-bpe";
  }
  if (name.empty()) {
    throw Error(ErrorCode::kInvalidModel,
                "unsupported tokenizer pre_tokenizer " + pre.dump().substr(0, 300) +
                    " (supported: ByteLevel (gpt2), Digits+ByteLevel (smollm), "
                    "Split+ByteLevel with the qwen2 or llama-3 regex)");
  }
  if (nfc != (name == "qwen2")) {
    throw Error(ErrorCode::kInvalidModel, "unsupported tokenizer: pre-tokenizer '" + name +
                                              (nfc ? "' with" : "' without") +
                                              " an NFC normalizer");
  }
  return name;
}

// A token given as "text", {"content": "text"} or null.
std::string token_text(const json& node) {
  if (node.is_string()) return node.get<std::string>();
  if (node.is_object() && node.contains("content") && node["content"].is_string()) {
    return node["content"].get<std::string>();
  }
  return {};
}

int32_t token_id(const TokenizerSpec& spec, const std::string& text) {
  if (text.empty()) return -1;
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == text) return static_cast<int32_t>(i);
  }
  return -1;
}

// True when the post-processor puts the BOS token first in a single sequence.
bool post_processor_adds_bos(const json& node, const std::string& bos) {
  if (is_type(node, "Sequence")) {
    for (const json& step : node.value("processors", json::array())) {
      if (post_processor_adds_bos(step, bos)) return true;
    }
    return false;
  }
  if (!is_type(node, "TemplateProcessing") || bos.empty()) return false;
  const json& single = node.value("single", json::array());
  return !single.empty() && single[0].contains("SpecialToken") &&
         single[0]["SpecialToken"].value("id", "") == bos;
}

std::string chat_template_of(const json& config) {
  const json& node = config.value("chat_template", json());
  if (node.is_string()) return node.get<std::string>();
  if (node.is_array()) {  // named templates: [{"name": ..., "template": ...}]
    for (const json& entry : node) {
      if (entry.value("name", "") == "default") return entry.value("template", "");
    }
    if (!node.empty()) return node[0].value("template", "");
  }
  return {};
}

}  // namespace

TokenizerSpec Tokenizer::spec_from_hf_json(const std::string& tokenizer_json_path) {
  const fs::path path(tokenizer_json_path);
  const json root = parse_json(path);
  try {
    const json& model = root.at("model");
    if (model.value("type", "") != "BPE") {
      throw Error(ErrorCode::kInvalidModel,
                  path.string() + ": unsupported tokenizer model type '" +
                      model.value("type", "") + "' (supported: BPE with a byte-level pre-tokenizer)");
    }
    TokenizerSpec spec;
    spec.model = "gpt2";
    spec.pre = pre_tokenizer_name(root.value("pre_tokenizer", json()),
                                  root.value("normalizer", json()));

    // Vocabulary: model.vocab plus added tokens (which may extend it).
    const json& vocab = model.at("vocab");
    const json& added = root.value("added_tokens", json::array());
    constexpr int64_t kMaxVocab = int64_t{1} << 24;
    // An integer below kMaxVocab: checked before any arithmetic or cast.
    const auto id_of = [&](const json& id) -> int64_t {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocab) {
        throw Error(ErrorCode::kInvalidModel, path.string() + ": token id " + id.dump() + " is not in [0, 2^24)");
      }
      return id.get<int64_t>();
    };
    int64_t size = 0;
    for (const auto& [text, id] : vocab.items()) size = std::max<int64_t>(size, id_of(id) + 1);
    for (const json& token : added) size = std::max<int64_t>(size, id_of(token.at("id")) + 1);
    if (size <= 0) throw Error(ErrorCode::kInvalidModel, path.string() + ": empty vocabulary");
    // A few ids far above the rest would make a vocabulary of empty entries.
    const int64_t listed = int64_t(vocab.size() + added.size());
    if (size > 2 * listed + 1024) {
      throw Error(ErrorCode::kInvalidModel, path.string() + ": token ids go up to " + std::to_string(size - 1) +
                                                " but only " + std::to_string(listed) + " tokens are listed");
    }
    spec.tokens.assign(static_cast<size_t>(size), std::string());
    spec.token_types.assign(static_cast<size_t>(size), kTypeUnused);
    for (const auto& [text, id] : vocab.items()) {
      const int64_t i = id_of(id);
      spec.tokens[i] = text;
      spec.token_types[i] = kTypeNormal;
    }
    for (const json& token : added) {
      const int64_t i = id_of(token.at("id"));
      spec.tokens[i] = token.at("content").get<std::string>();
      spec.token_types[i] = token.value("special", false) ? kTypeControl : kTypeUserDefined;
    }

    // Merges: "left right" strings, or [left, right] pairs in newer files.
    for (const json& merge : model.value("merges", json::array())) {
      if (merge.is_string()) {
        spec.merges.push_back(merge.get<std::string>());
      } else if (merge.is_array() && merge.size() == 2) {
        spec.merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
      } else {
        throw Error(ErrorCode::kInvalidModel, path.string() + ": bad merge " + merge.dump());
      }
    }
    if (model.contains("unk_token")) spec.unk_id = token_id(spec, token_text(model["unk_token"]));

    // tokenizer_config.json (and chat_template.jinja) beside it.
    const fs::path dir = path.parent_path();
    std::string bos;
    const fs::path config_path = dir / "tokenizer_config.json";
    if (fs::exists(config_path)) {
      const json config = parse_json(config_path);
      bos = token_text(config.value("bos_token", json()));
      spec.bos_id = token_id(spec, bos);
      spec.eos_id = token_id(spec, token_text(config.value("eos_token", json())));
      spec.pad_id = token_id(spec, token_text(config.value("pad_token", json())));
      if (config.contains("unk_token")) {
        const int32_t unk = token_id(spec, token_text(config["unk_token"]));
        if (unk >= 0) spec.unk_id = unk;
      }
      spec.chat_template = chat_template_of(config);
      if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
        spec.add_bos = config["add_bos_token"].get<bool>();
      } else {
        spec.add_bos = post_processor_adds_bos(root.value("post_processor", json()), bos);
      }
    } else {
      spec.add_bos = false;
    }
    const fs::path template_path = dir / "chat_template.jinja";
    if (spec.chat_template.empty() && fs::exists(template_path)) {
      spec.chat_template = read_file(template_path);
    }
    if (spec.eos_id >= 0) spec.eog_ids.push_back(spec.eos_id);
    return spec;
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInvalidModel, path.string() + ": unexpected tokenizer.json layout: " +
                                              e.what());
  }
}

}  // namespace lazykv
