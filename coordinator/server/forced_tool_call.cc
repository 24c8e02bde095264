#include "coordinator/server/forced_tool_call.h"

#include "common/error.h"

namespace lazykv {
namespace {

using Json = nlohmann::json;

// The opening without a grammar: the prompt names the function itself. It
// ends on the key's colon: the space and the brace are one token in these
// vocabularies, so the model writes them.
std::string unconstrained_opening(ToolCallFormat format, const api::ToolChoice& choice) {
  const std::string name = choice.mode == api::ToolChoice::Mode::kFunction ? choice.function + "\", " : "";
  if (format == ToolCallFormat::kHermes) return "<tool_call>\n{\"name\": \"" + name + (name.empty() ? "" : "\"arguments\":");
  return "{\"name\": \"" + name + (name.empty() ? "" : "\"parameters\":");
}

// Throws Error(kInvalidArgument) for a $ref that would point elsewhere once
// the parameters sit inside the call's schema ("#" itself).
void check_refs(const Json& schema) {
  if (schema.is_object()) {
    if (const auto ref = schema.find("$ref"); ref != schema.end() && ref->is_string()) {
      const std::string target = ref->get<std::string>();
      if (target.rfind("#/$defs/", 0) != 0 && target.rfind("#/definitions/", 0) != 0) {
        throw Error(ErrorCode::kInvalidArgument, "a $ref to " + target + " inside a tool's parameters");
      }
    }
  }
  if (schema.is_structured()) {
    for (const Json& child : schema) check_refs(child);
  }
}

// {"anyOf": [{"name": const, "arguments": parameters}, ...]} over the tools
// the choice allows; each tool's $defs move to the top, where its $refs
// point. Throws Error(kInvalidArgument) when two tools' $defs collide.
Json call_schema(ToolCallFormat format, const api::GenerationRequest& request) {
  const char* arguments = format == ToolCallFormat::kLlama3 ? "parameters" : "arguments";
  Json alternatives = Json::array();
  Json defs = Json::object();
  for (const auto& tool : request.tools) {
    const auto& function = tool.at("function");
    const std::string name = function.at("name").get<std::string>();
    if (request.tool_choice.mode == api::ToolChoice::Mode::kFunction && name != request.tool_choice.function) continue;
    Json parameters = function.contains("parameters") ? Json::parse(function.at("parameters").dump())
                                                      : Json{{"type", "object"}};
    check_refs(parameters);
    for (const char* section : {"$defs", "definitions"}) {
      if (!parameters.is_object() || !parameters.contains(section)) continue;
      for (const auto& [key, def] : parameters[section].items()) {
        if (defs.contains(key) && defs[key] != def) {
          throw Error(ErrorCode::kInvalidArgument, "two tools define '" + key + "' differently");
        }
        defs[key] = def;
      }
      parameters.erase(section);
    }
    alternatives.push_back({{"type", "object"},
                            {"properties", {{"name", {{"const", name}}}, {arguments, parameters}}},
                            {"required", {"name", arguments}},
                            {"additionalProperties", false}});
  }
  Json schema = alternatives.size() == 1 ? alternatives[0] : Json{{"anyOf", alternatives}};
  if (!defs.empty()) {
    // $refs into either section resolve through $defs.
    for (auto& [key, def] : defs.items()) schema["$defs"][key] = def;
    schema["definitions"] = schema["$defs"];
  }
  return schema;
}

}  // namespace

ForcedToolCall force_tool_call(ToolCallFormat format, const api::GenerationRequest& request) {
  using Mode = api::ToolChoice::Mode;
  if (format == ToolCallFormat::kNone ||
      (request.tool_choice.mode != Mode::kRequired && request.tool_choice.mode != Mode::kFunction)) {
    return {};
  }
  try {
    const Json schema = call_schema(format, request);
    auto compiled = std::make_shared<grammar::JsonSchema>(grammar::compile_json_schema(schema));
    if (format == ToolCallFormat::kHermes) compiled->suffix = "\n</tool_call>";
    ForcedToolCall out;
    out.opening = format == ToolCallFormat::kHermes ? "<tool_call>\n" : "";
    out.grammar = {"tool:" + compiled->suffix + schema.dump(), std::move(compiled)};
    return out;
  } catch (const std::exception&) {  // outside the subset, or text nlohmann cannot write
    return {unconstrained_opening(format, request.tool_choice), {}};
  }
}

}  // namespace lazykv
