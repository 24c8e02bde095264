// Syntax tree of a parsed chat template.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/chat/jinja_value.h"

namespace lazykv::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // items
    kDict,       // items as key, value pairs
    kAttribute,  // items[0].name
    kIndex,      // items[0][items[1]]
    kSlice,      // items[0][items[1]:items[2]:items[3]], null parts are omitted
    kCall,       // items[0](items[1..], named)
    kFilter,     // items[0] | name(items[1..], named)
    kTest,       // items[0] is [not] name(items[1..])
    kUnary,      // op items[0]: "-", "+", "not"
    kBinary,     // items[0] op items[1]: arithmetic, comparison, "in", "notin", "~"
    kAnd,
    kOr,
    kCondition,  // items[1] if items[0] else items[2] (items[2] may be null)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  Json literal;
  std::string name;  // name, attribute, filter, test or operator
  bool negated = false;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> named;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches; else_body
    kFor,       // targets in expr [if filter]: body; else_body
    kSet,       // targets (or targets[0].attribute) = expr
    kSetBlock,  // {% set targets[0] %}body{% endset %}
    kMacro,     // name(params) body
    kCallBlock, // {% call expr %}body{% endcall %}; params are the caller's
    kBreak,
    kContinue,
    kScope,     // body rendered in place (generation blocks)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attribute;  // kSet on a namespace attribute
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

}  // namespace lazykv::jinja
