// Splits a template into text and tag tokens, applying the whitespace rules
// Hugging Face renders chat templates with: trim_blocks, lstrip_blocks, and
// the {%- -%} / {{- -}} / {#- -#} markers. Comments and raw blocks are
// resolved here.
#pragma once

#include <string>
#include <vector>

namespace lazykv::jinja {

struct Token {
  enum class Type {
    kText,
    kVariableBegin,  // {{
    kVariableEnd,    // }}
    kBlockBegin,     // {%
    kBlockEnd,       // %}
    kName,
    kString,         // value is the unescaped string
    kInteger,
    kFloat,
    kOperator,
    kEnd,
  };
  Type type;
  std::string value;
  int line = 1;
  int column = 1;
};

// Throws Error(kInvalidModel, "chat template: ... at line L column C").
std::vector<Token> tokenize(const std::string& source);

// The error every syntax error becomes.
[[noreturn]] void syntax_error(const std::string& message, int line, int column);

}  // namespace lazykv::jinja
