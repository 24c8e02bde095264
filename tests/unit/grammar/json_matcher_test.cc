// The schema compiler and the byte-level matcher: texts a schema admits are
// accepted whole, texts it does not are refused at the first byte that makes
// them impossible (or cannot end), and unsupported schemas are refused by name.
#include "coordinator/grammar/json_matcher.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace lazykv::grammar {
namespace {

using Json = nlohmann::json;

// "whole": the text is a complete value; "prefix": every byte was accepted
// but it may not end there; "refused": some byte was refused.
std::string verdict(const JsonMatcher& m, const std::string& text) {
  MatchState state = m.start();
  if (!m.advance(state, text)) return "refused";
  return m.can_end(state) ? "whole" : "prefix";
}

JsonMatcher matcher(const char* schema) { return JsonMatcher(compile_json_schema(Json::parse(schema))); }

std::string compile_error(const char* schema) {
  try {
    compile_json_schema(Json::parse(schema));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonMatcher, ObjectWithRequiredAndOptionalKeys) {
  const JsonMatcher m = matcher(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},
                                   "required":["name"]})");
  EXPECT_EQ(verdict(m, R"({"name":"Ada"})"), "whole");
  EXPECT_EQ(verdict(m, R"({"age": 36, "name": "Ada"})"), "whole");  // any order
  EXPECT_EQ(verdict(m, "{\n  \"name\": \"Ada\",\n  \"age\": 36\n}"), "whole");
  EXPECT_EQ(verdict(m, R"({"age":36)"), "prefix");
  EXPECT_EQ(verdict(m, R"({"age":36})"), "refused");  // name is required
  EXPECT_EQ(verdict(m, R"({"name":"a","name":"b"})"), "refused");  // a key twice
  EXPECT_EQ(verdict(m, R"({"nick":"a"})"), "refused");             // no other keys without additionalProperties
  EXPECT_EQ(verdict(m, R"({"age":3.5,"name":"a"})"), "refused");   // an integer
  EXPECT_EQ(verdict(m, R"( {"name":"a"})"), "refused");            // no leading whitespace
  EXPECT_EQ(verdict(m, R"({"name":"a"} )"), "refused");            // nor trailing
}

TEST(JsonMatcher, AdditionalPropertiesTakeOtherKeysNotTheKnownOnes) {
  const JsonMatcher m = matcher(R"({"type":"object","properties":{"id":{"type":"integer"}},
                                   "additionalProperties":{"type":"boolean"}})");
  EXPECT_EQ(verdict(m, R"({"id":1,"idx":true,"i":false,"x)" "\xc3\xa9" R"(":true})"), "whole");
  EXPECT_EQ(verdict(m, R"({"id":true})"), "refused");  // a known key keeps its schema
  EXPECT_EQ(verdict(m, R"({"idx":1})"), "refused");
  // Other keys are written without escapes, which could spell a known key.
  EXPECT_EQ(verdict(m, R"({"\u0069d":true})"), "refused");
  EXPECT_EQ(verdict(m, R"({"x\n":true})"), "refused");
  EXPECT_EQ(verdict(matcher(R"({"type":"object","additionalProperties":true})"), R"({"a":[1,{"b":null}]})"), "whole");
}

TEST(JsonMatcher, ArraysCountTheirItems) {
  const JsonMatcher m = matcher(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})");
  EXPECT_EQ(verdict(m, "[]"), "refused");
  EXPECT_EQ(verdict(m, "[1]"), "whole");
  EXPECT_EQ(verdict(m, "[1, 2, 3]"), "whole");
  EXPECT_EQ(verdict(m, "[1,2,3,"), "refused");
  EXPECT_EQ(verdict(m, "[1,]"), "refused");
}

TEST(JsonMatcher, StringLengthInCharacters) {
  const JsonMatcher m = matcher(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_EQ(verdict(m, R"("a")"), "refused");
  EXPECT_EQ(verdict(m, R"("ab")"), "whole");
  EXPECT_EQ(verdict(m, "\"\xc3\xa9\xe2\x82\xac\""), "whole");  // two characters, five bytes
  EXPECT_EQ(verdict(m, R"("a\n\u00e9")"), "whole");            // escapes are one character each
  EXPECT_EQ(verdict(m, R"("abcd")"), "refused");
  EXPECT_EQ(verdict(m, R"("\ud83d\ude00")"), "refused");  // surrogate escapes
  EXPECT_EQ(verdict(m, "\"a\nb\""), "refused");             // a raw control byte
  EXPECT_EQ(verdict(m, "\"a\xe2\x82\""), "refused");        // a broken UTF-8 sequence
  EXPECT_EQ(verdict(m, "\"\xe0\x80\x80\""), "refused");      // overlong
  EXPECT_EQ(verdict(m, "\"\xed\xa0\x80\""), "refused");      // a surrogate
  EXPECT_EQ(verdict(m, "\"\xf4\x90\x80\x80\""), "refused");  // past U+10FFFF
  EXPECT_EQ(verdict(m, R"("a\x")"), "refused");
}

TEST(JsonMatcher, NumberRanges) {
  const JsonMatcher integer = matcher(R"({"type":"integer","minimum":-5,"exclusiveMaximum":120})");
  EXPECT_EQ(verdict(integer, "-5"), "whole");
  EXPECT_EQ(verdict(integer, "119"), "whole");
  EXPECT_EQ(verdict(integer, "120"), "refused");
  EXPECT_EQ(verdict(integer, "-6"), "refused");
  EXPECT_EQ(verdict(integer, "12"), "whole");
  EXPECT_EQ(verdict(integer, "1.5"), "refused");
  EXPECT_EQ(verdict(integer, "01"), "refused");
  EXPECT_EQ(verdict(integer, "1000"), "refused");  // refused at the fourth digit
  const JsonMatcher real = matcher(R"({"type":"number","minimum":0.5,"maximum":2})");
  EXPECT_EQ(verdict(real, "0.5"), "whole");
  EXPECT_EQ(verdict(real, "0."), "prefix");
  EXPECT_EQ(verdict(real, "0.4"), "refused");  // nothing after 0.4 reaches 0.5
  EXPECT_EQ(verdict(real, "1.99"), "whole");
  EXPECT_EQ(verdict(real, "2.0"), "whole");
  EXPECT_EQ(verdict(real, "2.01"), "refused");
  EXPECT_EQ(verdict(real, "1e0"), "refused");  // no exponent where a range is checked
  EXPECT_EQ(verdict(matcher(R"({"type":"number"})"), "-12.5e+3"), "whole");
  EXPECT_EQ(verdict(matcher(R"({"type":"number"})"), "1234567890123456789012345"), "refused");  // over the byte limit
  EXPECT_EQ(verdict(matcher(R"({"type":"number"})"), std::string(23, '1') + "."), "refused");  // no room for a digit
  // Bounds compare as a validator reads the digits: as the nearest double.
  EXPECT_EQ(verdict(matcher(R"({"type":"number","maximum":0.3})"), "0.3"), "whole");
  EXPECT_EQ(verdict(matcher(R"({"type":"number","maximum":5.347})"), "5.347000000000001"), "refused");
  const JsonMatcher point = matcher(R"({"type":"number","minimum":0.3,"maximum":0.3})");
  EXPECT_EQ(verdict(point, "0.3"), "whole");
  EXPECT_EQ(verdict(point, "0.2"), "refused");
  EXPECT_EQ(verdict(point, "0.30"), "whole");
}

TEST(JsonMatcher, EnumConstAndAnyOf) {
  const JsonMatcher e = matcher(R"({"enum":["red","green",1,12,null,{"a":[1]}]})");
  for (const char* text : {R"("red")", R"("green")", "1", "12", "null", R"({"a":[1]})"}) EXPECT_EQ(verdict(e, text), "whole") << text;
  EXPECT_EQ(verdict(e, R"("blue")"), "refused");
  EXPECT_EQ(verdict(e, "123"), "refused");
  EXPECT_EQ(verdict(matcher(R"({"const":"x"})"), R"("x")"), "whole");
  const JsonMatcher any_of = matcher(R"({"anyOf":[{"type":"string","maxLength":1},{"type":"array","items":{"type":"null"}}]})");
  EXPECT_EQ(verdict(any_of, R"("a")"), "whole");
  EXPECT_EQ(verdict(any_of, "[null,null]"), "whole");
  EXPECT_EQ(verdict(any_of, R"("ab")"), "refused");
  const JsonMatcher types = matcher(R"({"type":["integer","null"]})");
  EXPECT_EQ(verdict(types, "null"), "whole");
  EXPECT_EQ(verdict(types, "7"), "whole");
  EXPECT_EQ(verdict(types, "true"), "refused");
}

TEST(JsonMatcher, ObjectsInsideArraysInsideObjects) {
  const JsonMatcher m = matcher(R"({"type":"object","properties":{"rows":{"type":"array","items":
      {"type":"object","properties":{"k":{"type":"string"},"v":{"type":"number"}},"required":["k","v"]}}},
      "required":["rows"]})");
  EXPECT_EQ(verdict(m, R"({"rows":[{"k":"a","v":1},{"v":-2.5,"k":""}]})"), "whole");
  EXPECT_EQ(verdict(m, R"({"rows":[{"k":"a"}]})"), "refused");
}

TEST(JsonMatcher, LocalReferencesAndRecursion) {
  const JsonMatcher m = matcher(R"({"$ref":"#/$defs/node","$defs":{"node":{"type":"object",
      "properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},
      "required":["v","next"]}}})");
  EXPECT_EQ(verdict(m, R"({"v":1,"next":{"v":2,"next":null}})"), "whole");
  EXPECT_EQ(verdict(m, R"({"v":1,"next":{"v":2}})"), "refused");
}

TEST(JsonMatcher, AnyJsonObjectAndChoices) {
  const JsonMatcher object(any_json_object());
  EXPECT_EQ(verdict(object, R"({"a":[1,"x",{"b":false}],"c":null})"), "whole");
  EXPECT_EQ(verdict(object, "[1]"), "refused");
  EXPECT_EQ(verdict(object, "{}"), "whole");
  const JsonMatcher choices(one_of_texts({"yes", "no", "not sure"}));
  EXPECT_EQ(verdict(choices, "no"), "whole");
  EXPECT_EQ(verdict(choices, "not"), "prefix");
  EXPECT_EQ(verdict(choices, "nope"), "refused");
}

TEST(JsonMatcher, ASuffixFollowsTheValue) {
  JsonSchema schema = compile_json_schema(Json::parse(R"({"type":"integer"})"));
  schema.suffix = "\n</x>";
  const JsonMatcher m(std::move(schema));
  EXPECT_EQ(verdict(m, "12"), "prefix");  // a number that may end needs its suffix now
  EXPECT_EQ(verdict(m, "12\n</x"), "prefix");
  EXPECT_EQ(verdict(m, "12\n</x>"), "whole");
  EXPECT_EQ(verdict(m, "12\n</x>\n"), "refused");
  EXPECT_EQ(verdict(m, "12 \n</x>"), "refused");
}

TEST(JsonMatcher, NestingIsBounded) {
  const JsonMatcher m(any_json_object());
  std::string deep = "{\"a\":" + std::string(kMaxDepth, '[');
  EXPECT_EQ(verdict(m, deep), "refused");
  // At the deepest level an object takes no key: there would be no room for its value.
  const JsonMatcher any(compile_json_schema(Json::parse("true")));
  EXPECT_EQ(verdict(any, std::string(29, '[') + "{\""), "refused");
  EXPECT_EQ(verdict(any, std::string(29, '[') + "{}" + std::string(29, ']')), "whole");
}

TEST(JsonSchemaCompiler, RefusesWhatItCannotEnforceByName) {
  EXPECT_NE(compile_error(R"({"type":"string","pattern":"^a"})").find("'pattern'"), std::string::npos);
  EXPECT_NE(compile_error(R"({"type":"object","properties":{"a":{"oneOf":[]}}})").find("#/properties/a"),
            std::string::npos);
  EXPECT_NE(compile_error(R"({"type":"array","minItems":3,"maxItems":2})").find("minItems"), std::string::npos);
  EXPECT_NE(compile_error(R"({"type":"object","required":["x"]})").find("'x'"), std::string::npos);
  EXPECT_NE(compile_error(R"({"type":"integer","minimum":0.2,"maximum":0.8})").find("no number"), std::string::npos);
  EXPECT_NE(compile_error(R"({"type":"tuple"})").find("unknown type"), std::string::npos);
  EXPECT_NE(compile_error(R"({"$ref":"#/$defs/missing"})").find("missing"), std::string::npos);
  EXPECT_NE(compile_error(R"({"enum":[]})").find("enum"), std::string::npos);
  EXPECT_NE(compile_error(R"({"type":"string","enum":[1]})").find("type"), std::string::npos);
  EXPECT_NE(compile_error("false").find("admits no value"), std::string::npos);
  EXPECT_NE(compile_error(R"({"$ref":"#"})").find("$ref"), std::string::npos);
  EXPECT_NE(compile_error(R"({"type":"integer","minimum":1e30})").find("1e16"), std::string::npos);
  EXPECT_EQ(compile_error(R"({"title":"T","description":"d","type":"object","properties":{}})"), "");
}

}  // namespace
}  // namespace lazykv::grammar
