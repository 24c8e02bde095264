// Token masks over SmolLM2's real vocabulary (the committed tokenizer.json):
// each mask equals what the byte matcher says token by token, never leaves
// the output without a next token, and random walks through the masks of
// generated schemas end in texts an independent validator accepts.
#include "coordinator/grammar/token_constraint.h"

#include <gtest/gtest.h>

#include <bit>
#include <numeric>
#include <random>

#include "common/error.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace lazykv::grammar {
namespace {

using Json = nlohmann::json;

const std::string kDataDir = std::string(LAZYKV_TEST_DATA_DIR) + "/tokenizer";

const Tokenizer& smollm2() {
  static const Tokenizer tokenizer(Tokenizer::spec_from_hf_json(kDataDir + "/smollm2/tokenizer.json"));
  return tokenizer;
}

std::shared_ptr<const TokenVocabulary> vocabulary() {
  static const auto v = std::make_shared<const TokenVocabulary>(smollm2());
  return v;
}

int32_t end_token() { return smollm2().spec().eos_id; }

bool allows(const TokenMask& mask, int32_t t) { return mask[size_t(t) / 32] >> (t % 32) & 1; }

std::vector<int32_t> allowed_tokens(const TokenMask& mask, int32_t n_vocab) {
  std::vector<int32_t> out;
  for (size_t w = 0; w < mask.size(); ++w) {
    for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const int32_t t = int32_t(w * 32) + std::countr_zero(bits);
      if (t < n_vocab) out.push_back(t);
    }
  }
  return out;
}

int32_t nth_allowed(const TokenMask& mask, int64_t n) {
  size_t w = 0;
  for (; n >= std::popcount(mask[w]); ++w) n -= std::popcount(mask[w]);
  uint32_t bits = mask[w];
  for (; n > 0; --n) bits &= bits - 1;
  return int32_t(w * 32) + std::countr_zero(bits);
}

// --- An independent validator for the supported subset (JSON Schema semantics). ---

int64_t code_points(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; });
}

bool valid(const Json& v, const Json& schema, const Json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    return valid(v, ref == "#" ? root : root.at("$defs").at(ref.substr(std::string("#/$defs/").size())), root);
  }
  if (schema.contains("anyOf")) {
    return std::any_of(schema["anyOf"].begin(), schema["anyOf"].end(), [&](const Json& s) { return valid(v, s, root); });
  }
  if (schema.contains("enum") && std::find(schema["enum"].begin(), schema["enum"].end(), v) == schema["enum"].end()) return false;
  if (schema.contains("const") && schema["const"] != v) return false;
  if (schema.contains("type")) {
    const Json types = schema["type"].is_array() ? schema["type"] : Json::array({schema["type"]});
    const bool typed = std::any_of(types.begin(), types.end(), [&](const Json& t) {
      const std::string name = t;
      if (name == "integer") return v.is_number_integer();
      if (name == "number") return v.is_number();
      if (name == "string") return v.is_string();
      if (name == "boolean") return v.is_boolean();
      if (name == "null") return v.is_null();
      if (name == "array") return v.is_array();
      return v.is_object();
    });
    if (!typed) return false;
  }
  if (v.is_object()) {
    const Json properties = schema.value("properties", Json::object());
    for (const Json& name : schema.value("required", Json::array())) {
      if (!v.contains(name.get<std::string>())) return false;
    }
    for (const auto& [key, value] : v.items()) {
      if (properties.contains(key)) {
        if (!valid(value, properties[key], root)) return false;
      } else if (schema.contains("additionalProperties") && !valid(value, schema["additionalProperties"], root)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    if (v.size() < schema.value("minItems", size_t(0)) || v.size() > schema.value("maxItems", size_t(1) << 40)) return false;
    for (const Json& item : v) {
      if (schema.contains("items") && !valid(item, schema["items"], root)) return false;
    }
  }
  if (v.is_string()) {
    const int64_t n = code_points(v.get<std::string>());
    if (n < schema.value("minLength", int64_t(0)) || n > schema.value("maxLength", int64_t(1) << 40)) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return false;
    if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return false;
    if (schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>()) return false;
    if (schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>()) return false;
  }
  return true;
}

// --- Generated schemas: every value bounded, so a random walk ends. ---

Json random_schema(std::mt19937& rng, int depth) {
  const auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
  const int kind = pick(depth > 0 ? 9 : 6);
  switch (kind) {
    case 0: {
      Json s = {{"type", "string"}, {"maxLength", 1 + pick(12)}};
      if (pick(2) != 0) s["minLength"] = pick(s["maxLength"].get<int>() + 1);
      return s;
    }
    case 1: return {{"type", "integer"}, {"minimum", -pick(50)}, {"maximum", pick(1000)}};
    case 2: return {{"type", "number"}, {"minimum", -0.5 * pick(10)}, {"exclusiveMaximum", 0.25 + pick(100)}};
    case 3: return {{"type", pick(2) != 0 ? "boolean" : "null"}};
    case 4: return {{"enum", {"alpha", "beta", "gamma delta", 7, 7.5, nullptr}}};
    case 5: return {{"type", Json::array({"integer", "null"})}, {"maximum", 99}, {"minimum", 0}};
    case 6: {
      const int max_items = pick(4);
      return {{"type", "array"}, {"items", random_schema(rng, depth - 1)}, {"maxItems", max_items},
              {"minItems", pick(max_items + 1)}};
    }
    case 7: return {{"anyOf", {random_schema(rng, depth - 1), random_schema(rng, depth - 1)}}};
    default: {
      Json s = {{"type", "object"}, {"properties", Json::object()}, {"required", Json::array()}};
      const char* names[] = {"id", "name", "names", "tags", "value", "a\"b", "x"};
      const int n = 1 + pick(4);
      for (int i = 0; i < n; ++i) {
        const std::string name = names[pick(7)];
        s["properties"][name] = random_schema(rng, depth - 1);
        if (pick(2) != 0 && std::find(s["required"].begin(), s["required"].end(), name) == s["required"].end()) {
          s["required"].push_back(name);
        }
      }
      return s;
    }
  }
}

// Walks the masks to the end, each step a random allowed token; the text.
std::string random_walk(const TokenConstraint& c, std::mt19937& rng, std::string& failure) {
  MatchState state = c.start();
  std::string text;
  for (int step = 0; step < 3000; ++step) {
    const TokenMask& mask = *c.allowed(state);
    const int64_t allowed = std::accumulate(mask.begin(), mask.end(), int64_t(0),
                                            [](int64_t n, uint32_t w) { return n + std::popcount(w); });
    if (allowed == 0) {
      failure = "no token allowed after " + text;
      return text;
    }
    if (allows(mask, end_token())) {
      if (!c.accept(state, end_token())) failure = "the end token was allowed but not accepted after " + text;
      return text;
    }
    const int32_t token = nth_allowed(mask, int64_t(rng() % uint64_t(allowed)));
    if (!c.accept(state, token)) {
      failure = "token " + std::to_string(token) + " was allowed but not accepted after " + text;
      return text;
    }
    text += vocabulary()->bytes(token);
  }
  failure = "no end after 3000 tokens: " + text;
  return text;
}

TEST(TokenConstraint, MaskMatchesTheMatcherTokenByToken) {
  const Json schema = Json::parse(R"({"type":"object","properties":{"name":{"type":"string","maxLength":5},
      "n":{"type":"integer","minimum":10,"maximum":20},"ok":{"type":"boolean"}},"required":["name"]})");
  const TokenConstraint typed(compile_json_schema(schema), vocabulary(), {end_token()});
  const TokenConstraint any(any_json_object(), vocabulary(), {end_token()});
  // States inside structure, a bounded string, a number, after the end, and
  // (any object) inside keys nobody named, escapes and nested values.
  const std::vector<std::pair<const TokenConstraint*, std::vector<const char*>>> cases = {
      {&typed, {"", "{", R"({"name":")", R"({"name":"ab)", R"({"name":"abcd)", R"({"n":1)", R"({"name":"x","ok":)",
                R"({"name":"x"})", "{\n  "}},
      {&any, {"{\"", R"({"ab)", "{\"a\xc3", R"({"a":[1,)", R"({"a":"x\u00)", "{\"a\": {\"b\": \"\xc3"}}};
  for (const auto& [c, prefixes] : cases) {
    for (const char* prefix : prefixes) {
      MatchState state = c->start();
      ASSERT_TRUE(c->matcher().advance(state, prefix)) << prefix;
      const TokenMask& mask = *c->allowed(state);
      int32_t admitted = 0;
      for (int32_t t = 0; t < c->n_vocab(); ++t) {
        MatchState next = state;
        const bool expected = t == end_token() ? c->matcher().can_end(state)
                                               : vocabulary()->is_text(t) && c->matcher().advance(next, vocabulary()->bytes(t));
        ASSERT_EQ(allows(mask, t), expected) << "prefix " << prefix << " token " << t << " '" << vocabulary()->bytes(t) << "'";
        admitted += expected;
      }
      EXPECT_GT(admitted, 0) << prefix;
    }
  }
}

TEST(TokenConstraint, RandomWalksOfGeneratedSchemasValidate) {
  std::mt19937 rng(20261127);
  int walks = 0;
  for (int i = 0; i < 150; ++i) {
    const Json schema = random_schema(rng, 3);
    const TokenConstraint c(compile_json_schema(schema), vocabulary(), {end_token()});
    for (int w = 0; w < 5; ++w, ++walks) {
      std::string failure;
      const std::string text = random_walk(c, rng, failure);
      ASSERT_EQ(failure, "") << "schema " << schema.dump();
      Json value;
      ASSERT_NO_THROW(value = Json::parse(text)) << text << "\nschema " << schema.dump();
      EXPECT_TRUE(valid(value, schema, schema)) << text << "\nschema " << schema.dump();
    }
  }
  EXPECT_EQ(walks, 750);
}

TEST(TokenConstraint, AnyJsonObjectWalksParse) {
  std::mt19937 rng(7);
  const TokenConstraint c(any_json_object(), vocabulary(), {end_token()});
  for (int w = 0; w < 20; ++w) {
    std::string failure;
    const std::string text = random_walk(c, rng, failure);
    if (failure.rfind("no end after", 0) == 0) continue;  // unbounded strings may run long; not a dead end
    ASSERT_EQ(failure, "");
    Json value;
    ASSERT_NO_THROW(value = Json::parse(text)) << text;
    EXPECT_TRUE(value.is_object());
  }
}

TEST(TokenConstraint, EndTokensOnlyWhereTheGrammarMayEnd) {
  const TokenConstraint c(one_of_texts({"yes", "no"}), vocabulary(), {end_token()});
  MatchState state = c.start();
  EXPECT_FALSE(allows(*c.allowed(state), end_token()));
  EXPECT_FALSE(c.accept(state, end_token()));
  ASSERT_TRUE(c.accept(state, smollm2().find_token("yes")));
  const std::vector<int32_t> after = allowed_tokens(*c.allowed(state), c.n_vocab());
  EXPECT_EQ(after, std::vector<int32_t>{end_token()});
  EXPECT_TRUE(c.accept(state, end_token()));
  EXPECT_THROW(TokenConstraint(any_json_object(), vocabulary(), {}), Error);
}

TEST(TokenConstraint, MasksAreCachedByState) {
  const TokenConstraint c(compile_json_schema(Json::parse(R"({"type":"string"})")), vocabulary(), {end_token()});
  MatchState state = c.start();
  ASSERT_TRUE(c.matcher().advance(state, "\"abc"));
  const auto first = c.allowed(state);
  ASSERT_TRUE(c.matcher().advance(state, "def"));  // an unbounded string: the same state
  EXPECT_EQ(c.allowed(state).get(), first.get());
  EXPECT_EQ(c.cache_stats().hits, 1);
}

}  // namespace
}  // namespace lazykv::grammar
