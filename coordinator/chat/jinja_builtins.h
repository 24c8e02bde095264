// The built-in behaviour of template values: operators, attribute and item
// access (including Python str/dict methods), filters, tests and global
// functions, following Python jinja2 in Hugging Face's sandboxed setup.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coordinator/chat/jinja_value.h"

namespace lazykv::jinja {

// No string or list a template builds may exceed this (guards `'x' * 10**12`).
constexpr size_t kMaxStringBytes = size_t{64} << 20;
constexpr size_t kMaxListItems = size_t{1} << 20;

bool has_filter(std::string_view name);
bool has_test(std::string_view name);

Value apply_filter(const std::string& name, const Value& input, const CallArgs& args);
bool apply_test(const std::string& name, const Value& subject, const CallArgs& args);

Value get_attribute(const Value& object, const std::string& name);
Value get_item(const Value& object, const Value& key);
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// op: + - * / // % ** ~ == != < <= > >= in notin
Value binary_op(const std::string& op, const Value& left, const Value& right);
Value negate(const Value& operand);

// What a for loop visits: list items, dict keys, string characters; an
// undefined value visits nothing.
std::vector<Value> iterate(const Value& iterable);

// range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> global_functions();

}  // namespace lazykv::jinja
