#include "coordinator/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "common/error.h"

namespace lazykv {
namespace {

// GPT-2's split (also the regex of HF's ByteLevel(use_regex=true)).
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// HF Digits(individual_digits=true): every numeric character alone.
constexpr const char* kDigitRegex = R"(\p{N})";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreTokenizerConfig {
  const char* name;
  std::vector<const char*> regexes;
  bool nfc;
  bool ignore_merges;
};

const std::vector<PreTokenizerConfig>& configs() {
  static const std::vector<PreTokenizerConfig> all = {
      {"default", {kGpt2Regex}, false, false},
      {"gpt2", {kGpt2Regex}, false, false},
      {"smollm", {kDigitRegex, kGpt2Regex}, false, false},
      {"qwen2", {kQwen2Regex}, true, false},
      {"deepseek-r1-qwen", {kQwen2Regex}, true, false},  // DeepSeek-R1-Distill-Qwen
      {"llama-bpe", {kLlama3Regex}, false, true},
      {"llama3", {kLlama3Regex}, false, true},
  };
  return all;
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;

  explicit Regex(const char* pattern) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      throw Error(ErrorCode::kInternal, std::string("pre-tokenizer regex does not compile: ") +
                                            reinterpret_cast<const char*>(message));
    }
    // Without JIT support pcre2_match falls back to the interpreter.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Splits piece into matches and the gaps between them, appended to out.
  // match_data belongs to the calling thread.
  void split(std::string_view piece, pcre2_match_data* match_data,
             std::vector<std::string_view>& out) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
    size_t emitted = 0;  // end of the last piece appended
    size_t offset = 0;
    while (offset < piece.size()) {
      int rc = pcre2_match(code, subject, piece.size(), offset, PCRE2_NO_UTF_CHECK, match_data,
                           nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // Pathological input for the JIT stack: the interpreter uses the heap.
        rc = pcre2_match(code, subject, piece.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         match_data, nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        throw Error(ErrorCode::kInternal, "pre-tokenizer regex match failed (" +
                                              std::to_string(rc) + ")");
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
      const size_t begin = ovector[0];
      const size_t end = ovector[1];
      if (begin > emitted) out.push_back(piece.substr(emitted, begin - emitted));
      if (end > begin) {
        out.push_back(piece.substr(begin, end - begin));
        emitted = end;
        offset = end;
      } else {
        // Empty match: step over one character (UTF-8 continuation bytes too).
        emitted = begin;
        offset = begin + 1;
        while (offset < piece.size() && (static_cast<unsigned char>(piece[offset]) & 0xC0) == 0x80) {
          ++offset;
        }
      }
    }
    if (emitted < piece.size()) out.push_back(piece.substr(emitted));
  }
};

PreTokenizer::PreTokenizer(const std::string& name) {
  for (const PreTokenizerConfig& config : configs()) {
    if (name != config.name) continue;
    for (const char* pattern : config.regexes) chain_.push_back(std::make_unique<Regex>(pattern));
    nfc_ = config.nfc;
    ignore_merges_ = config.ignore_merges;
    return;
  }
  std::string supported;
  for (const std::string& known : supported_names()) {
    supported += (supported.empty() ? "" : ", ") + known;
  }
  throw Error(ErrorCode::kInvalidModel,
              "unsupported tokenizer pre-tokenizer '" + name + "' (supported: " + supported + ")");
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

std::vector<std::string> PreTokenizer::supported_names() {
  std::vector<std::string> names;
  for (const PreTokenizerConfig& config : configs()) names.emplace_back(config.name);
  return names;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  // One match block per call keeps concurrent splits independent.
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data(
      pcre2_match_data_create(1, nullptr));
  if (!match_data) throw Error(ErrorCode::kOutOfMemory, "pcre2_match_data_create failed");

  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (size_t i = 0; i < chain_.size(); ++i) {
    std::vector<std::string_view>& target = i + 1 == chain_.size() ? out : next;
    for (std::string_view piece : pieces) chain_[i]->split(piece, match_data.get(), target);
    if (&target == &next) {
      pieces.swap(next);
      next.clear();
    }
  }
}

std::string nfc_normalize(std::string_view text) {
  if (text.empty()) return {};
  // ASCII is already NFC.
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);

  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                std::string("NFC normalization failed: ") + utf8proc_errmsg(length));
  }
  std::string normalized(reinterpret_cast<const char*>(result), static_cast<size_t>(length));
  std::free(result);
  return normalized;
}

}  // namespace lazykv
