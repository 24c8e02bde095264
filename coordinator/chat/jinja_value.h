// Values of the chat-template interpreter and the Python semantics they
// follow (truthiness, equality, ordering, str()/repr(), json.dumps), because
// reference renderings come from Python jinja2.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lazykv::jinja {

// Object keys keep insertion order, as Python dicts do (tojson relies on it).
using Json = nlohmann::ordered_json;

struct Namespace;
struct Callable;

// A template value. JSON data is immutable in the sandbox, so values share it:
// a child value aliases its parent's storage instead of copying it.
class Value {
 public:
  enum class Kind { kUndefined, kJson, kNamespace, kCallable };

  Value() = default;  // undefined, no hint
  Value(Json json);   // NOLINT: implicit on purpose, values are built from JSON everywhere
  // Strings, numbers, bools and nullptr convert as JSON does.
  template <typename T, typename = std::enable_if_t<!std::is_same_v<std::decay_t<T>, Value> &&
                                                    !std::is_same_v<std::decay_t<T>, Json> &&
                                                    std::is_constructible_v<Json, T>>>
  Value(T&& scalar) : Value(Json(std::forward<T>(scalar))) {}  // NOLINT
  static Value undefined(std::string hint);
  static Value child(const Value& parent, const Json& element);  // aliases parent's storage
  static Value from_namespace(std::shared_ptr<Namespace> ns);
  static Value from_callable(std::shared_ptr<Callable> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_json() const { return kind_ == Kind::kJson; }
  const Json& json() const;  // kJson only
  Namespace& ns() const { return *ns_; }
  const Callable& fn() const { return *fn_; }
  // Why the value is undefined, in jinja2's words ("'x' is undefined").
  const std::string& hint() const { return hint_; }

  bool is_string() const { return is_json() && json().is_string(); }
  bool is_number() const { return is_json() && (json().is_number() || json().is_boolean()); }
  bool is_int() const { return is_json() && json().is_number_integer(); }
  bool is_array() const { return is_json() && json().is_array(); }
  bool is_object() const { return is_json() && json().is_object(); }
  bool is_none() const { return is_json() && json().is_null(); }
  const std::string& str() const { return json().get_ref<const std::string&>(); }

  // For storing in a list or dict: throws for namespaces and callables.
  Json to_json() const;

 private:
  Kind kind_ = Kind::kUndefined;
  std::shared_ptr<const Json> json_;
  std::shared_ptr<Namespace> ns_;
  std::shared_ptr<Callable> fn_;
  std::string hint_;
};

// A for loop's position; the `loop` variable computes its attributes from it
// on demand, so an iteration costs no more than a few allocations.
struct LoopState {
  int64_t index0 = 0;
  std::shared_ptr<const std::vector<Value>> items;
};

struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;  // insertion order, for printing
  bool assignable = true;                            // false for `loop`
  std::optional<LoopState> loop;
  std::optional<Value> find(std::string_view name) const;
  void set(const std::string& name, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  // The argument at position `index` or named `name`; nullptr when absent.
  const Value* get(size_t index, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// Throws Error(kInvalidArgument) with the message.
[[noreturn]] void fail(const std::string& message);
// Throws the undefined value's own error when v is undefined.
void require_defined(const Value& v);

// Python type name for messages: str, int, float, bool, NoneType, list, dict.
std::string type_name(const Value& v);

bool truthy(const Value& v);
bool py_equal(const Value& a, const Value& b);
// Python ordering; throws TypeError-like errors on mixed types.
int py_compare(const Value& a, const Value& b);
bool json_equal(const Json& a, const Json& b);
int json_compare(const Json& a, const Json& b);

// str(v): what {{ v }} prints. Undefined prints as "".
std::string py_str(const Value& v);
std::string py_str(const Json& j);
std::string py_repr(const Json& j);
std::string py_float_repr(double d);

struct DumpOptions {
  std::string indent;   // used when has_indent
  bool has_indent = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps with the given options.
std::string py_json_dumps(const Json& j, const DumpOptions& options);

double to_double(const Json& j);  // number or bool
int64_t to_int(const Json& j);    // integer or bool

// UTF-8 helpers: strings are indexed by code point, like Python str.
std::vector<std::string> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);
std::string utf8_encode(char32_t cp);
std::vector<char32_t> utf8_decode(std::string_view s);
bool is_py_space(char32_t cp);

}  // namespace lazykv::jinja
