#include "coordinator/tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "coordinator/tokenizer/byte_level.h"
#include "coordinator/tokenizer/pre_tokenizer.h"
#include "common/utf8.h"

namespace lazykv {
namespace {

namespace fs = std::filesystem;

const std::string kDataDir = std::string(LAZYKV_TEST_DATA_DIR) + "/tokenizer";

struct ReferenceCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<ReferenceCase> load_reference(const std::string& name) {
  std::ifstream in(kDataDir + "/" + name);
  EXPECT_TRUE(in) << "missing " << name;
  std::vector<ReferenceCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    cases.push_back({row.at("text").get<std::string>(), row.at("ids").get<std::vector<int32_t>>()});
  }
  return cases;
}

// SmolLM2's tokenizer (from its committed tokenizer.json), built once.
const TokenizerSpec& smollm2_spec() {
  static const TokenizerSpec spec =
      Tokenizer::spec_from_hf_json(kDataDir + "/smollm2/tokenizer.json");
  return spec;
}
const Tokenizer& smollm2() {
  static const Tokenizer tokenizer(smollm2_spec());
  return tokenizer;
}
// Qwen2's normalizer and pre-tokenizer over the SmolLM2 vocabulary, as in
// scripts/reference/make_tokenizer_reference.py.
const Tokenizer& qwen2_over_smollm2() {
  static const Tokenizer tokenizer = [] {
    TokenizerSpec spec = smollm2_spec();
    spec.pre = "qwen2";
    return Tokenizer(spec);
  }();
  return tokenizer;
}

// Llama-3's pre-tokenizer (and ignore_merges) over the SmolLM2 vocabulary.
const Tokenizer& llama3_over_smollm2() {
  static const Tokenizer tokenizer = [] {
    TokenizerSpec spec = smollm2_spec();
    spec.pre = "llama-bpe";
    return Tokenizer(spec);
  }();
  return tokenizer;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += std::to_string(id) + " ";
  return out;
}

size_t count_reference_matches(const Tokenizer& tokenizer, const std::string& file) {
  const std::vector<ReferenceCase> cases = load_reference(file);
  EXPECT_GE(cases.size(), 300u);
  size_t matches = 0;
  for (const ReferenceCase& c : cases) {
    const std::vector<int32_t> ids = tokenizer.encode(c.text);
    if (ids == c.ids) {
      ++matches;
    } else {
      ADD_FAILURE() << "text: " << nlohmann::json(c.text).dump() << "\n  want: " << ids_text(c.ids)
                    << "\n  got:  " << ids_text(ids);
    }
  }
  std::cout << file << ": " << matches << " / " << cases.size() << " match\n";
  EXPECT_EQ(matches, cases.size());
  return matches;
}

TEST(TokenizerSpecFromHfJson, ReadsSmolLM2) {
  const TokenizerSpec& spec = smollm2_spec();
  EXPECT_EQ(spec.model, "gpt2");
  EXPECT_EQ(spec.pre, "smollm");
  EXPECT_EQ(spec.tokens.size(), 49152u);
  EXPECT_EQ(spec.merges.size(), 48900u);
  EXPECT_EQ(spec.merges[0], "\xC4\xA0 t");  // "Ġ t", read from a [left, right] pair
  EXPECT_EQ(spec.bos_id, 1);
  EXPECT_EQ(spec.eos_id, 2);
  EXPECT_FALSE(spec.add_bos);
  EXPECT_NE(spec.chat_template.find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(spec.token_types[2], 3);    // <|im_end|> is a control token
  EXPECT_EQ(spec.token_types[100], 1);  // a normal token
}

TEST(TokenizerReference, SmolLM2MatchesHuggingFace) {
  EXPECT_EQ(count_reference_matches(smollm2(), "smollm2_reference.jsonl"),
            load_reference("smollm2_reference.jsonl").size());
}

TEST(TokenizerReference, Qwen2PreTokenizerMatchesHuggingFace) {
  EXPECT_EQ(count_reference_matches(qwen2_over_smollm2(), "qwen2_reference.jsonl"),
            load_reference("qwen2_reference.jsonl").size());
}

// True when every byte of text has a byte-level token in the vocabulary.
bool all_bytes_have_tokens(const Tokenizer& tokenizer, std::string_view text) {
  for (char c : text) {
    if (tokenizer.find_token(byte_level::byte_to_text(static_cast<unsigned char>(c))) < 0) return false;
  }
  return true;
}

Tokenizer full_byte_tokenizer();

TEST(TokenizerReference, Llama3PreTokenizerMatchesHuggingFace) {
  EXPECT_EQ(count_reference_matches(llama3_over_smollm2(), "llama3_reference.jsonl"),
            load_reference("llama3_reference.jsonl").size());
}

TEST(TokenizerRoundTrip, DecodeOfEncodeIsIdentity) {
  const Tokenizer full_bytes = full_byte_tokenizer();
  size_t checked = 0;
  for (const ReferenceCase& c : load_reference("smollm2_reference.jsonl")) {
    EXPECT_EQ(full_bytes.decode(full_bytes.encode(c.text)), c.text);
    // SmolLM2 has no token for a few bytes (0x04, 0xF1, ...), which are dropped.
    if (!all_bytes_have_tokens(smollm2(), c.text)) continue;
    ++checked;
    EXPECT_EQ(smollm2().decode(smollm2().encode(c.text)), c.text);
    // Qwen2 normalizes to NFC first, so only the normalized text comes back.
    EXPECT_EQ(qwen2_over_smollm2().decode(qwen2_over_smollm2().encode(c.text)),
              nfc_normalize(c.text));
  }
  EXPECT_GE(checked, 350u);
}

TEST(TokenizerEncode, EmptyTextHasNoTokens) {
  EXPECT_TRUE(smollm2().encode("").empty());
  EXPECT_EQ(smollm2().decode(std::vector<int32_t>{}), "");
}

TEST(TokenizerEncode, InvalidUtf8BecomesReplacementCharacter) {
  const std::string invalid = "a\xFF" "b\xE2\x82" " c\xC0\xAF" "d\xED\xA0\x80";
  const std::vector<int32_t> ids = smollm2().encode(invalid);
  EXPECT_EQ(smollm2().decode(ids), utf8::repair(invalid));
  EXPECT_EQ(utf8::repair("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  // A truncated sequence at the end is one replacement character.
  EXPECT_EQ(utf8::repair("x\xF0\x9F\x98"), "x\xEF\xBF\xBD");
  EXPECT_EQ(utf8::count_code_points("a\xC3\xA9\xF0\x9F\x98\x80z"), 4u);  // a, é, 😀, z
  EXPECT_EQ(utf8::count_code_points("\xF0\x9F"), 1u);                      // cut short: once
  EXPECT_EQ(utf8::count_code_points(""), 0u);
  EXPECT_EQ(ids, smollm2().encode(utf8::repair(invalid)));
}

TEST(TokenizerEncode, SpecialTokensParsedOnlyWhenAsked) {
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<int32_t> parsed = smollm2().encode(text, /*parse_special=*/true);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);

  const std::vector<int32_t> literal = smollm2().encode(text, /*parse_special=*/false);
  for (int32_t id : literal) EXPECT_FALSE(smollm2().is_special(id)) << id;
  EXPECT_GT(literal.size(), parsed.size());
  EXPECT_EQ(smollm2().decode(literal), text);

  EXPECT_EQ(smollm2().decode(parsed), text);
  EXPECT_EQ(smollm2().decode(parsed, /*skip_special=*/true), "user\nhi");
}

TEST(TokenizerEncode, LongestSpecialTokenWins) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "gpt2";
  spec.tokens = {"a", "b", "<x>", "<x>>", "<"};
  spec.token_types = {1, 1, 3, 4, 1};
  const Tokenizer tokenizer(spec);
  EXPECT_EQ(tokenizer.encode("a<x>>b"), (std::vector<int32_t>{0, 3, 1}));
  EXPECT_EQ(tokenizer.encode("a<x>b"), (std::vector<int32_t>{0, 2, 1}));
  // User-defined tokens are matched even when special parsing is off.
  EXPECT_EQ(tokenizer.encode("<x>>", false), (std::vector<int32_t>{3}));
  EXPECT_TRUE(tokenizer.is_special(2));
  EXPECT_FALSE(tokenizer.is_special(3));
}

TEST(TokenizerEncode, Llama3TakesWholeWordTokensBeforeMerging) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.tokens = {"a", "b", "c", "bc", "abc"};
  spec.merges = {"b c"};  // "abc" is not reachable by merges
  spec.pre = "gpt2";
  EXPECT_EQ(Tokenizer(spec).encode("abc"), (std::vector<int32_t>{0, 3}));
  spec.pre = "llama-bpe";  // BPE ignore_merges, as in Llama-3's tokenizer.json
  EXPECT_EQ(Tokenizer(spec).encode("abc"), (std::vector<int32_t>{4}));
  EXPECT_EQ(Tokenizer(spec).encode("abcc"), (std::vector<int32_t>{0, 3, 2}));
}

TEST(TokenizerEncode, SameResultsFromTwoThreads) {
  const std::vector<ReferenceCase> cases = load_reference("smollm2_reference.jsonl");
  std::vector<std::vector<int32_t>> expected;
  for (const ReferenceCase& c : cases) expected.push_back(smollm2().encode(c.text));
  for (const ReferenceCase& c : cases) expected.push_back(qwen2_over_smollm2().encode(c.text));

  std::vector<std::vector<std::vector<int32_t>>> results(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int repeat = 0; repeat < 5; ++repeat) {
        results[t].clear();
        // The two threads walk the corpus in opposite orders.
        for (size_t k = 0; k < cases.size(); ++k) {
          const std::string& text = cases[t == 0 ? k : cases.size() - 1 - k].text;
          results[t].push_back(smollm2().encode(text));
        }
        for (const ReferenceCase& c : cases) results[t].push_back(qwen2_over_smollm2().encode(c.text));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const size_t n = cases.size();
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(results[t].size(), 2 * n);
    for (size_t k = 0; k < n; ++k) {
      const size_t i = t == 0 ? k : n - 1 - k;
      EXPECT_EQ(results[t][k], expected[i]) << cases[i].text;
      EXPECT_EQ(results[t][n + k], expected[n + k]) << cases[k].text;
    }
  }
}

TEST(TokenizerEncode, LongRunsAndRandomBytes) {
  // Long runs stress the regex engine (JIT stack) and the merge heap.
  for (const std::string& text : {std::string(200000, ' '), std::string(100000, 'a'),
                                  std::string(50000, '\n') + "x", std::string(30000, '7')}) {
    const std::vector<int32_t> ids = smollm2().encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(smollm2().decode(ids), text);
    EXPECT_EQ(qwen2_over_smollm2().decode(qwen2_over_smollm2().encode(text)), text);
  }
}

// A GPT-2-style vocabulary with every byte token and a few merges.
Tokenizer full_byte_tokenizer() {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "gpt2";
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(byte_level::byte_to_text(static_cast<unsigned char>(b)));
  spec.tokens.push_back("\xC4\xA0t");  // "Ġt"
  spec.tokens.push_back("he");
  spec.merges = {"\xC4\xA0 t", "h e"};
  return Tokenizer(spec);
}

TEST(TokenizerEncode, ArbitraryBytesRoundTripAsRepairedUtf8) {
  const Tokenizer tokenizer = full_byte_tokenizer();
  EXPECT_EQ(tokenizer.encode(" the"), (std::vector<int32_t>{256, 257}));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int round = 0; round < 300; ++round) {
    std::string bytes(static_cast<size_t>(round) * 3, '\0');
    for (char& c : bytes) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      c = static_cast<char>(state >> 56);
    }
    const std::string repaired = utf8::repair(bytes);
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(bytes)), repaired);
    // SmolLM2 lacks a few byte tokens (0x04, 0xF1, ...): like Hugging Face
    // without an unk token, it drops them, so only compare with the repaired text.
    EXPECT_EQ(smollm2().encode(bytes), smollm2().encode(repaired));
    EXPECT_EQ(qwen2_over_smollm2().encode(bytes), qwen2_over_smollm2().encode(repaired));
  }
}

TEST(TokenizerDecode, TokenBytesAndLookup) {
  EXPECT_EQ(smollm2().n_vocab(), 49152);
  EXPECT_EQ(smollm2().find_token("<|im_end|>"), 2);
  EXPECT_EQ(smollm2().find_token("no such token text"), -1);
  const int32_t space = smollm2().find_token("\xC4\xA0");  // "Ġ"
  ASSERT_GE(space, 0);
  EXPECT_EQ(smollm2().token_bytes(space), " ");
  EXPECT_EQ(smollm2().token_bytes(2), "<|im_end|>");
  EXPECT_THROW(smollm2().token_bytes(49152), Error);
  EXPECT_THROW(smollm2().token_bytes(-1), Error);
}

TEST(TokenizerEndOfGeneration, KnownEndTokens) {
  EXPECT_TRUE(smollm2().is_end_of_generation(2));  // eos, <|im_end|>
  EXPECT_TRUE(smollm2().is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(smollm2().is_end_of_generation(1));  // <|im_start|>
  EXPECT_FALSE(smollm2().is_end_of_generation(100));
  EXPECT_EQ(smollm2().spec().eog_ids, (std::vector<int32_t>{0, 2}));
}

// Token ids of each byte of text, one byte-level token per byte.
std::vector<int32_t> byte_tokens(const Tokenizer& tokenizer, std::string_view text) {
  std::vector<int32_t> ids;
  for (char c : text) {
    ids.push_back(tokenizer.find_token(byte_level::byte_to_text(static_cast<unsigned char>(c))));
  }
  return ids;
}

TEST(StreamDecoder, ReassemblesSplitEmoji) {
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600, 4 byte tokens
  StreamDecoder decoder(smollm2());
  const std::vector<int32_t> ids = byte_tokens(smollm2(), emoji);
  ASSERT_EQ(ids.size(), 4u);
  for (int32_t id : ids) ASSERT_GE(id, 0);
  EXPECT_EQ(decoder.push(ids[0]), "");
  EXPECT_EQ(decoder.push(ids[1]), "");
  EXPECT_EQ(decoder.push(ids[2]), "");
  EXPECT_EQ(decoder.push(ids[3]), emoji);
  EXPECT_EQ(decoder.flush(), "");
}

TEST(StreamDecoder, StreamsEncodedTextInValidChunks) {
  const std::string text =
      "<|im_start|>Family \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7"
      " and \xE4\xBD\xA0\xE5\xA5\xBD caf\xC3\xA9<|im_end|>";
  StreamDecoder decoder(smollm2());  // skips special tokens by default
  std::string streamed;
  for (int32_t id : smollm2().encode(text)) {
    const std::string chunk = decoder.push(id);
    EXPECT_TRUE(utf8::is_valid(chunk));
    streamed += chunk;
  }
  streamed += decoder.flush();
  EXPECT_EQ(streamed, smollm2().decode(smollm2().encode(text), /*skip_special=*/true));
  EXPECT_EQ(streamed.find("<|im"), std::string::npos);

  StreamDecoder with_special(smollm2(), /*skip_special=*/false);
  EXPECT_EQ(with_special.push(1), "<|im_start|>");
}

TEST(StreamDecoder, FlushReplacesTruncatedSequence) {
  StreamDecoder decoder(smollm2());
  const std::vector<int32_t> ids = byte_tokens(smollm2(), "a\xF0\x9F");
  for (int32_t id : ids) ASSERT_GE(id, 0);
  EXPECT_EQ(decoder.push(ids[0]), "a");
  EXPECT_EQ(decoder.push(ids[1]), "");
  EXPECT_EQ(decoder.push(ids[2]), "");
  EXPECT_EQ(decoder.flush(), "\xEF\xBF\xBD");
  // A stray continuation byte is replaced at once, not held back.
  const int32_t continuation = byte_tokens(smollm2(), "\x80")[0];
  ASSERT_GE(continuation, 0);
  EXPECT_EQ(decoder.push(continuation), "\xEF\xBF\xBD");
}

std::vector<std::string> split(const std::string& pre, std::string_view text) {
  std::vector<std::string_view> pieces;
  PreTokenizer(pre).split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

TEST(PreTokenizer, SplitsLikeEachModel) {
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(split("gpt2", "Hello world 123  x"), (Pieces{"Hello", " world", " 123", " ", " x"}));
  EXPECT_EQ(split("smollm", "Hi 123"), (Pieces{"Hi", " ", "1", "2", "3"}));
  EXPECT_EQ(split("qwen2", "it'S 42!\r\n\r\nok"), (Pieces{"it", "'S", " ", "4", "2", "!\r\n\r\n", "ok"}));
  EXPECT_EQ(split("llama-bpe", "x 12345"), (Pieces{"x", " ", "123", "45"}));
  EXPECT_TRUE(split("gpt2", "").empty());
}

TEST(TokenizerErrors, UnknownPreTokenizerOrModel) {
  TokenizerSpec spec = smollm2_spec();
  spec.pre = "no-such-pre";
  try {
    Tokenizer tokenizer(spec);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("no-such-pre"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("qwen2"), std::string::npos);  // lists supported ones
    EXPECT_NE(std::string(e.what()).find("smollm"), std::string::npos);
  }
  spec.pre = "smollm";
  spec.model = "llama";  // SentencePiece is not supported
  try {
    Tokenizer tokenizer(spec);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("gpt2"), std::string::npos);
  }
  spec.model = "gpt2";
  spec.token_types.pop_back();
  EXPECT_THROW(Tokenizer{spec}, Error);
}

// A handwritten tokenizer.json (+ config) in a fresh temporary folder.
class HandwrittenHfJson : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lazykv_tokenizer_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }

  fs::path dir_;
};

// Bytes "a", "b", "c", "Ġ" (space) and merges a+b, ab+c, Ġ+abc; the qwen2 split.
const char* kTinyQwen2Json = R"json({
  "version": "1.0",
  "added_tokens": [
    {"id": 8, "content": "<|im_end|>", "special": true, "normalized": false},
    {"id": 9, "content": "<tool>", "special": false, "normalized": false}
  ],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": false},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
  "post_processor": null,
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "unk_token": null, "vocab":
    {"a": 0, "b": 1, "c": 2, "\u0120": 3, "ab": 4, "abc": 5, "\u0120abc": 6, "<|endoftext|>": 7},
   "merges": ["a b", ["ab", "c"], "\u0120 abc"]}
})json";

TEST_F(HandwrittenHfJson, ReadsVocabMergesAddedTokensAndConfig) {
  const std::string path = write("tokenizer.json", kTinyQwen2Json);
  write("tokenizer_config.json", R"({"add_bos_token": true, "bos_token": {"content": "<|endoftext|>"},
      "eos_token": "<|im_end|>", "chat_template": "{{ messages }}"})");
  const TokenizerSpec spec = Tokenizer::spec_from_hf_json(path);
  EXPECT_EQ(spec.model, "gpt2");
  EXPECT_EQ(spec.pre, "qwen2");
  ASSERT_EQ(spec.tokens.size(), 10u);
  EXPECT_EQ(spec.tokens[9], "<tool>");
  EXPECT_EQ(spec.token_types[8], 3);
  EXPECT_EQ(spec.token_types[9], 4);
  EXPECT_EQ(spec.token_types[3], 1);
  EXPECT_EQ(spec.merges, (std::vector<std::string>{"a b", "ab c", "\xC4\xA0 abc"}));
  EXPECT_EQ(spec.bos_id, 7);
  EXPECT_EQ(spec.eos_id, 8);
  EXPECT_TRUE(spec.add_bos);
  EXPECT_EQ(spec.chat_template, "{{ messages }}");

  const Tokenizer tokenizer(spec);
  EXPECT_EQ(tokenizer.encode("abc abc<|im_end|>ab<tool>"),
            (std::vector<int32_t>{5, 6, 8, 4, 9}));
  EXPECT_TRUE(tokenizer.is_end_of_generation(8));
  EXPECT_TRUE(tokenizer.is_end_of_generation(7));  // <|endoftext|>
  EXPECT_FALSE(tokenizer.is_end_of_generation(5));
}

TEST_F(HandwrittenHfJson, ChatTemplateFileAndPostProcessorBos) {
  std::string json = kTinyQwen2Json;
  json.replace(json.find("\"post_processor\": null"), std::string("\"post_processor\": null").size(),
               R"("post_processor": {"type": "TemplateProcessing",
                  "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                             {"Sequence": {"id": "A", "type_id": 0}}]})");
  const std::string path = write("tokenizer.json", json);
  write("tokenizer_config.json", R"({"bos_token": "<|endoftext|>", "eos_token": null})");
  write("chat_template.jinja", "{{ bos_token }}");
  const TokenizerSpec spec = Tokenizer::spec_from_hf_json(path);
  EXPECT_TRUE(spec.add_bos);
  EXPECT_EQ(spec.eos_id, -1);
  EXPECT_EQ(spec.chat_template, "{{ bos_token }}");
}

TEST_F(HandwrittenHfJson, RejectsUnsupportedTokenizers) {
  std::string metaspace = kTinyQwen2Json;
  const std::string normalizer = R"("normalizer": {"type": "NFC"},)";
  metaspace.erase(metaspace.find(normalizer), normalizer.size());
  const size_t begin = metaspace.find("\"pre_tokenizer\"");
  const size_t end = metaspace.find("\"post_processor\"");
  metaspace.replace(begin, end - begin,
                    R"("pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}, )");
  try {
    Tokenizer::spec_from_hf_json(write("tokenizer.json", metaspace));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("Metaspace"), std::string::npos);
  }

  std::string unigram = kTinyQwen2Json;
  unigram.replace(unigram.find("\"type\": \"BPE\""), 13, "\"type\": \"Unigram\"");
  EXPECT_THROW(Tokenizer::spec_from_hf_json(write("tokenizer.json", unigram)), Error);
  EXPECT_THROW(Tokenizer::spec_from_hf_json(write("tokenizer.json", "{not json")), Error);
  try {
    Tokenizer::spec_from_hf_json((dir_ / "missing.json").string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

// A corrupt or hostile tokenizer.json is a clear kInvalidModel error: no
// overflow, no huge allocation from a tiny file, no deep recursion, no hang.
TEST_F(HandwrittenHfJson, RejectsHostileFiles) {
  const auto expect_invalid = [&](const std::string& json, const std::string& fragment) {
    try {
      Tokenizer::spec_from_hf_json(write("tokenizer.json", json));
      FAIL() << "expected an error containing '" << fragment << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidModel) << e.what();
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  const auto with_vocab_entry = [](const std::string& entry) {
    std::string json = kTinyQwen2Json;
    json.replace(json.find("\"a\": 0"), 6, entry);
    return json;
  };
  expect_invalid(with_vocab_entry("\"a\": 9223372036854775807"), "is not in [0, 2^24)");  // id + 1 overflowed
  expect_invalid(with_vocab_entry("\"a\": 1e300"), "is not in [0, 2^24)");               // a float id
  expect_invalid(with_vocab_entry("\"a\": -1"), "is not in [0, 2^24)");
  expect_invalid(with_vocab_entry("\"a\": 16000000"), "only 10 tokens are listed");     // 16M empty entries
  std::string deep = kTinyQwen2Json;
  deep.replace(deep.find("\"post_processor\": null"), 22,
               "\"post_processor\": " + std::string(100000, '[') + std::string(100000, ']'));
  expect_invalid(deep, "nested deeper than 64 levels");

  // tokenizer_config.json that is not a regular file (a FIFO would block the read forever).
  const std::string path = write("tokenizer.json", kTinyQwen2Json);
  ASSERT_EQ(::mkfifo((dir_ / "tokenizer_config.json").c_str(), 0600), 0);
  try {
    Tokenizer::spec_from_hf_json(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lazykv
