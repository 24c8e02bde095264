// A JSON schema compiled into the graph of value shapes that constrained
// decoding walks (json_matcher.h). The subset: type (one or a list), object
// properties / required / additionalProperties, array items / minItems /
// maxItems, string minLength / maxLength, number and integer minimum /
// maximum / exclusiveMinimum / exclusiveMaximum, enum, const, anyOf, and
// local $ref into $defs or definitions (recursion included). Annotations
// (title, description, default, examples, ...) are ignored; any other
// keyword is refused by name, never silently dropped: an output the grammar
// allows must validate against the schema.
//
// One deliberate narrowing: an object without additionalProperties admits
// no other keys (as OpenAI's strict mode and most constrained decoders do),
// so a small model cannot wander off into keys nobody asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lazykv::grammar {

struct SchemaNode {
  enum class Kind : uint8_t { kObject, kArray, kString, kNumber, kLiterals, kAnyOf };
  Kind kind = Kind::kLiterals;

  // kObject. Keys as they appear between the quotes (JSON-escaped), sorted.
  std::vector<std::string> keys;
  std::vector<int32_t> key_nodes;  // the value's node for keys[i]
  uint64_t required = 0;           // bit i: keys[i] must be given
  int32_t additional = -1;         // node of any other key's value; -1: no other keys

  // kArray
  int32_t items = -1;
  int64_t min_items = 0;
  int64_t max_items = -1;  // -1: unbounded

  // kString: length in characters (an escape is one)
  int64_t min_length = 0;
  int64_t max_length = -1;

  // kNumber
  bool integer = false;
  std::optional<double> minimum, maximum;
  bool exclusive_minimum = false, exclusive_maximum = false;

  // kLiterals: the exact texts allowed (canonical JSON for enum and const), sorted.
  std::vector<std::string> literals;

  // kAnyOf
  std::vector<int32_t> alternatives;
};

struct JsonSchema {
  std::vector<SchemaNode> nodes;
  int32_t root = -1;
  std::string suffix;  // text that must follow the value (a tool call's closing tag)
};

// Limits that keep every state of the matcher small (documented in docs/serving.md).
inline constexpr int kMaxSchemaNodes = 4096;
inline constexpr size_t kMaxObjectKeys = 64;  // properties of one object (a bit each in the matcher)

// A structured output as a request asks for it: the schema and what
// identifies it, so that equal requests share one compiled constraint.
struct ResponseGrammar {
  std::string key;  // equal keys: equal schemas
  std::shared_ptr<const JsonSchema> schema;
};

// Throws Error(kInvalidArgument) naming the unsupported keyword or the
// contradiction (minItems > maxItems, an empty enum, ...) and where in the
// schema it is ("#/properties/a/items").
JsonSchema compile_json_schema(const nlohmann::json& schema);

// Any JSON object (response_format {"type": "json_object"}).
JsonSchema any_json_object();

// Exactly one of `choices`, as raw text (the guided_choice extension).
JsonSchema one_of_texts(std::vector<std::string> choices);

}  // namespace lazykv::grammar
