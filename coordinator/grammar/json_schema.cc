#include "coordinator/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "common/error.h"

namespace lazykv::grammar {
namespace {

using Json = nlohmann::json;
using Kind = SchemaNode::Kind;

SchemaNode node_of(Kind kind) {
  SchemaNode node;
  node.kind = kind;
  return node;
}

[[noreturn]] void refuse(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "JSON schema at " + where + ": " + what);
}

// Keywords that describe and never constrain.
const std::set<std::string>& annotations() {
  static const std::set<std::string> names = {"title",    "description", "default", "examples", "$schema",
                                              "$id",      "$comment",    "deprecated", "readOnly", "writeOnly",
                                              "$defs",    "definitions", "strict"};
  return names;
}

// Everything compile() reads; any other keyword is refused.
const std::set<std::string>& understood() {
  static const std::set<std::string> names = {
      "type",      "properties", "required", "additionalProperties", "items",   "minItems",
      "maxItems",  "minLength",  "maxLength", "minimum",             "maximum", "exclusiveMinimum",
      "exclusiveMaximum", "enum", "const",    "anyOf",               "$ref"};
  return names;
}

const std::vector<std::string>& all_types() {
  static const std::vector<std::string> types = {"object", "array", "string", "number", "integer", "boolean", "null"};
  return types;
}

// The JSON type a literal value has, as a schema names it.
bool literal_has_type(const Json& v, const std::string& type) {
  if (type == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  if (type == "number") return v.is_number();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  return v.is_null();
}

int64_t count_keyword(const Json& s, const char* name, const std::string& where) {
  const Json& v = s.at(name);
  if (!v.is_number_integer() || v.get<int64_t>() < 0) refuse(where, std::string("'") + name + "' must be a non-negative integer");
  return v.get<int64_t>();
}

std::optional<double> number_keyword(const Json& s, const char* name, const std::string& where) {
  const auto it = s.find(name);
  if (it == s.end()) return std::nullopt;
  if (!it->is_number()) refuse(where, std::string("'") + name + "' must be a number");
  return it->get<double>();
}

class Compiler {
 public:
  explicit Compiler(const Json& document) : document_(document) {}

  JsonSchema run() { return finish(compile(document_, "#")); }

  JsonSchema finish(int32_t root) {
    refuse_any_of_cycles();
    JsonSchema out;
    out.root = root;
    out.nodes = std::move(nodes_);
    return out;
  }

  int32_t any_value() {
    if (any_ >= 0) return any_;
    any_ = add(node_of(Kind::kAnyOf));
    SchemaNode object = node_of(Kind::kObject);
    object.additional = any_;
    SchemaNode array = node_of(Kind::kArray);
    array.items = any_;
    SchemaNode scalars = node_of(Kind::kLiterals);
    scalars.literals = {"false", "null", "true"};
    const std::vector<int32_t> alternatives = {add(std::move(object)), add(std::move(array)),
                                               add(node_of(Kind::kString)),
                                               add(node_of(Kind::kNumber)), add(std::move(scalars))};
    nodes_[size_t(any_)].alternatives = alternatives;
    return any_;
  }

  int32_t any_object() {
    SchemaNode object = node_of(Kind::kObject);
    object.additional = any_value();
    return add(std::move(object));
  }

 private:
  int32_t add(SchemaNode node) {
    if (nodes_.size() >= size_t(kMaxSchemaNodes)) {
      refuse("#", "more than " + std::to_string(kMaxSchemaNodes) + " schema nodes");
    }
    nodes_.push_back(std::move(node));
    return int32_t(nodes_.size() - 1);
  }

  int32_t compile(const Json& s, const std::string& where) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse(where, "the schema false admits no value");
      return any_value();
    }
    if (!s.is_object()) refuse(where, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (!understood().count(key) && !annotations().count(key)) {
        refuse(where, "the keyword '" + key + "' is not supported");
      }
    }
    if (s.contains("$ref")) return compile_ref(s, where);
    if (s.contains("anyOf")) return compile_any_of(s, where);
    if (s.contains("enum") || s.contains("const")) return compile_literals(s, where);
    const std::vector<std::string> types = types_of(s, where);
    if (types.size() == 1) return compile_typed(s, types[0], where);
    SchemaNode any_of = node_of(Kind::kAnyOf);
    const int32_t id = add(std::move(any_of));
    std::vector<int32_t> alternatives;
    // "integer" inside "number" would make two paths for one text.
    const bool has_number = std::count(types.begin(), types.end(), "number") > 0;
    for (const std::string& t : types) {
      if (t == "integer" && has_number) continue;
      alternatives.push_back(compile_typed(s, t, where));
    }
    nodes_[size_t(id)].alternatives = std::move(alternatives);
    return id;
  }

  // The types `s` may take: its "type", or those its keywords imply, or all.
  std::vector<std::string> types_of(const Json& s, const std::string& where) {
    const auto it = s.find("type");
    if (it == s.end()) {
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) return {"object"};
      if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) return {"array"};
      if (s.contains("minLength") || s.contains("maxLength")) return {"string"};
      if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
          s.contains("exclusiveMaximum")) {
        return {"number"};
      }
      return all_types();
    }
    std::vector<std::string> types;
    const auto add_type = [&](const Json& t) {
      if (!t.is_string()) refuse(where, "'type' must be a string or an array of strings");
      const std::string name = t.get<std::string>();
      if (std::find(all_types().begin(), all_types().end(), name) == all_types().end()) {
        refuse(where, "unknown type '" + name + "'");
      }
      if (std::find(types.begin(), types.end(), name) == types.end()) types.push_back(name);
    };
    if (it->is_array()) {
      for (const Json& t : *it) add_type(t);
      if (types.empty()) refuse(where, "'type' is an empty array");
    } else {
      add_type(*it);
    }
    return types;
  }

  int32_t compile_typed(const Json& s, const std::string& type, const std::string& where) {
    if (type == "object") return compile_object(s, where);
    if (type == "array") return compile_array(s, where);
    if (type == "string") return compile_string(s, where);
    if (type == "number" || type == "integer") return compile_number(s, type == "integer", where);
    SchemaNode literals = node_of(Kind::kLiterals);
    literals.literals = type == "boolean" ? std::vector<std::string>{"false", "true"} : std::vector<std::string>{"null"};
    return add(std::move(literals));
  }

  int32_t compile_object(const Json& s, const std::string& where) {
    const int32_t id = add(node_of(Kind::kObject));
    std::map<std::string, std::pair<std::string, const Json*>> properties;  // escaped key -> (name, schema)
    if (const auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) refuse(where, "'properties' must be an object");
      for (const auto& [name, schema] : it->items()) {
        const std::string quoted = Json(name).dump();
        properties[quoted.substr(1, quoted.size() - 2)] = {name, &schema};
      }
    }
    if (properties.size() > kMaxObjectKeys) {
      refuse(where, "more than " + std::to_string(kMaxObjectKeys) + " properties in one object");
    }
    std::vector<std::string> keys;
    std::vector<int32_t> key_nodes;
    std::map<std::string, size_t> index_of;  // property name -> index
    for (const auto& [key, named] : properties) {
      index_of[named.first] = keys.size();
      keys.push_back(key);
      key_nodes.push_back(compile(*named.second, where + "/properties/" + named.first));
    }
    uint64_t required = 0;
    if (const auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) refuse(where, "'required' must be an array of strings");
      for (const Json& name : *it) {
        if (!name.is_string()) refuse(where, "'required' must be an array of strings");
        const auto found = index_of.find(name.get<std::string>());
        if (found == index_of.end()) {
          refuse(where, "the required property '" + name.get<std::string>() + "' is not in 'properties'");
        }
        required |= uint64_t(1) << found->second;
      }
    }
    int32_t additional = -1;
    if (const auto it = s.find("additionalProperties"); it != s.end()) {
      if (!(it->is_boolean() && !it->get<bool>())) additional = compile(*it, where + "/additionalProperties");
    }
    SchemaNode& node = nodes_[size_t(id)];
    node.keys = std::move(keys);
    node.key_nodes = std::move(key_nodes);
    node.required = required;
    node.additional = additional;
    return id;
  }

  int32_t compile_array(const Json& s, const std::string& where) {
    const int32_t id = add(node_of(Kind::kArray));
    const auto it = s.find("items");
    if (it != s.end() && it->is_array()) refuse(where, "'items' as an array (tuple validation) is not supported");
    const int32_t items = it == s.end() ? any_value() : compile(*it, where + "/items");
    SchemaNode& node = nodes_[size_t(id)];
    node.items = items;
    if (s.contains("minItems")) node.min_items = count_keyword(s, "minItems", where);
    if (s.contains("maxItems")) node.max_items = count_keyword(s, "maxItems", where);
    if (node.max_items >= 0 && node.min_items > node.max_items) refuse(where, "minItems is larger than maxItems");
    return id;
  }

  int32_t compile_string(const Json& s, const std::string& where) {
    SchemaNode node = node_of(Kind::kString);
    if (s.contains("minLength")) node.min_length = count_keyword(s, "minLength", where);
    if (s.contains("maxLength")) node.max_length = count_keyword(s, "maxLength", where);
    if (node.max_length >= 0 && node.min_length > node.max_length) refuse(where, "minLength is larger than maxLength");
    return add(std::move(node));
  }

  int32_t compile_number(const Json& s, bool integer, const std::string& where) {
    SchemaNode node = node_of(Kind::kNumber);
    node.integer = integer;
    node.minimum = number_keyword(s, "minimum", where);
    node.maximum = number_keyword(s, "maximum", where);
    // The larger lower bound (the smaller upper bound) is the one that holds.
    if (const auto lo = number_keyword(s, "exclusiveMinimum", where); lo && (!node.minimum || *lo >= *node.minimum)) {
      node.minimum = lo;
      node.exclusive_minimum = true;
    }
    if (const auto hi = number_keyword(s, "exclusiveMaximum", where); hi && (!node.maximum || *hi <= *node.maximum)) {
      node.maximum = hi;
      node.exclusive_maximum = true;
    }
    // A number has at most kMaxRangedDigits digits where its range is checked (json_matcher.h).
    constexpr double kFarthest = 1e16;
    if ((node.minimum && *node.minimum > kFarthest) || (node.maximum && *node.maximum < -kFarthest)) {
      refuse(where, "a range beyond +-1e16 is not supported");
    }
    if (node.minimum && node.maximum) {
      const double lo = *node.minimum, hi = *node.maximum;
      const bool empty = integer ? std::floor(hi) - (node.exclusive_maximum && std::floor(hi) == hi) <
                                       std::ceil(lo) + (node.exclusive_minimum && std::ceil(lo) == lo)
                                 : lo > hi || (lo == hi && (node.exclusive_minimum || node.exclusive_maximum));
      if (empty) refuse(where, "no number lies between the minimum and the maximum");
    }
    return add(std::move(node));
  }

  int32_t compile_literals(const Json& s, const std::string& where) {
    std::vector<Json> values;
    if (const auto it = s.find("const"); it != s.end()) values.push_back(*it);
    if (const auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) refuse(where, "'enum' must be a non-empty array");
      if (!values.empty()) {  // both: the const, if the enum has it
        if (std::find(it->begin(), it->end(), values[0]) == it->end()) values.clear();
      } else {
        values.assign(it->begin(), it->end());
      }
    }
    for (const auto& [key, value] : s.items()) {
      if (key != "enum" && key != "const" && key != "type" && !annotations().count(key)) {
        refuse(where, "'" + key + "' beside enum or const is not supported");
      }
    }
    if (s.contains("type")) {
      const std::vector<std::string> types = types_of(s, where);
      std::erase_if(values, [&](const Json& v) {
        return std::none_of(types.begin(), types.end(), [&](const std::string& t) { return literal_has_type(v, t); });
      });
    }
    if (values.empty()) refuse(where, "no value of enum or const has the schema's type");
    SchemaNode node = node_of(Kind::kLiterals);
    for (const Json& v : values) node.literals.push_back(v.dump());
    std::sort(node.literals.begin(), node.literals.end());
    node.literals.erase(std::unique(node.literals.begin(), node.literals.end()), node.literals.end());
    return add(std::move(node));
  }

  int32_t compile_any_of(const Json& s, const std::string& where) {
    for (const auto& [key, value] : s.items()) {
      if (key != "anyOf" && !annotations().count(key)) refuse(where, "'" + key + "' beside anyOf is not supported");
    }
    const Json& list = s.at("anyOf");
    if (!list.is_array() || list.empty()) refuse(where, "'anyOf' must be a non-empty array");
    const int32_t id = add(node_of(Kind::kAnyOf));
    std::vector<int32_t> alternatives;
    for (size_t i = 0; i < list.size(); ++i) alternatives.push_back(compile(list[i], where + "/anyOf/" + std::to_string(i)));
    nodes_[size_t(id)].alternatives = std::move(alternatives);
    return id;
  }

  int32_t compile_ref(const Json& s, const std::string& where) {
    for (const auto& [key, value] : s.items()) {
      if (key != "$ref" && !annotations().count(key)) refuse(where, "'" + key + "' beside $ref is not supported");
    }
    if (!s.at("$ref").is_string()) refuse(where, "'$ref' must be a string");
    const std::string ref = s.at("$ref").get<std::string>();
    if (const auto done = refs_.find(ref); done != refs_.end()) return done->second;
    const Json* target = nullptr;
    if (ref == "#") {
      target = &document_;
    } else {
      for (const char* section : {"#/$defs/", "#/definitions/"}) {
        const std::string prefix = section;
        if (ref.rfind(prefix, 0) != 0 || !document_.is_object()) continue;
        const auto defs = document_.find(prefix.substr(2, prefix.size() - 3));
        if (defs == document_.end() || !defs->is_object()) continue;
        const auto found = defs->find(ref.substr(prefix.size()));
        if (found != defs->end()) target = &*found;
      }
    }
    if (target == nullptr) refuse(where, "'$ref' " + ref + " does not name a schema in this document's $defs");
    // A placeholder first, so a recursive schema refers to itself.
    const int32_t id = add(node_of(Kind::kAnyOf));
    refs_[ref] = id;
    const int32_t body = compile(*target, ref);
    nodes_[size_t(id)].alternatives = {body};
    return id;
  }

  // An anyOf that leads back to itself through anyOf alone ({"$ref": "#"})
  // never reaches a value; the matcher would expand it forever.
  void refuse_any_of_cycles() const {
    std::vector<uint8_t> state(nodes_.size(), 0);  // 0 unseen, 1 on the path, 2 done
    const std::function<void(int32_t)> visit = [&](int32_t id) {
      if (nodes_[size_t(id)].kind != Kind::kAnyOf || state[size_t(id)] == 2) return;
      if (state[size_t(id)] == 1) refuse("#", "a $ref cycle never reaches a value");
      state[size_t(id)] = 1;
      for (int32_t alternative : nodes_[size_t(id)].alternatives) visit(alternative);
      state[size_t(id)] = 2;
    };
    for (size_t id = 0; id < nodes_.size(); ++id) visit(int32_t(id));
  }

  const Json& document_;
  std::vector<SchemaNode> nodes_;
  std::map<std::string, int32_t> refs_;
  int32_t any_ = -1;
};

}  // namespace

JsonSchema compile_json_schema(const nlohmann::json& schema) { return Compiler(schema).run(); }

JsonSchema any_json_object() {
  const Json empty = Json::object();
  Compiler compiler(empty);
  const int32_t root = compiler.any_object();
  return compiler.finish(root);
}

JsonSchema one_of_texts(std::vector<std::string> choices) {
  if (choices.empty()) throw Error(ErrorCode::kInvalidArgument, "the list of choices is empty");
  SchemaNode node = node_of(Kind::kLiterals);
  std::sort(choices.begin(), choices.end());
  choices.erase(std::unique(choices.begin(), choices.end()), choices.end());
  if (choices.front().empty()) throw Error(ErrorCode::kInvalidArgument, "a choice is empty");
  node.literals = std::move(choices);
  JsonSchema out;
  out.nodes.push_back(std::move(node));
  out.root = 0;
  return out;
}

}  // namespace lazykv::grammar
