#include "coordinator/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "common/error.h"

namespace lazykv::jinja {

Value::Value(Json json) : kind_(Kind::kJson), json_(std::make_shared<const Json>(std::move(json))) {}

Value Value::undefined(std::string hint) {
  Value v;
  v.hint_ = std::move(hint);
  return v;
}

Value Value::child(const Value& parent, const Json& element) {
  Value v;
  v.kind_ = Kind::kJson;
  v.json_ = std::shared_ptr<const Json>(parent.json_, &element);
  return v;
}

Value Value::from_namespace(std::shared_ptr<Namespace> ns) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.ns_ = std::move(ns);
  return v;
}

Value Value::from_callable(std::shared_ptr<Callable> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::move(fn);
  return v;
}

const Json& Value::json() const {
  if (kind_ != Kind::kJson) fail("internal: value is not data");
  return *json_;
}

Json Value::to_json() const {
  switch (kind_) {
    case Kind::kJson: return *json_;
    case Kind::kUndefined: require_defined(*this); return nullptr;
    case Kind::kNamespace: fail("a namespace cannot be stored in a list or dict");
    case Kind::kCallable: fail("a function cannot be stored in a list or dict");
  }
  return nullptr;
}

static std::optional<Value> loop_attribute(const LoopState& loop, std::string_view name) {
  const int64_t i = loop.index0;
  const auto length = static_cast<int64_t>(loop.items->size());
  if (name == "index") return Value(i + 1);
  if (name == "index0") return Value(i);
  if (name == "revindex") return Value(length - i);
  if (name == "revindex0") return Value(length - i - 1);
  if (name == "first") return Value(i == 0);
  if (name == "last") return Value(i == length - 1);
  if (name == "length") return Value(length);
  if (name == "depth") return Value(int64_t{1});
  if (name == "depth0") return Value(int64_t{0});
  if (name == "previtem")
    return i > 0 ? (*loop.items)[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item");
  if (name == "nextitem")
    return i + 1 < length ? (*loop.items)[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item");
  if (name == "cycle") {
    auto fn = std::make_shared<Callable>();
    fn->name = "cycle";
    fn->call = [i](CallArgs& args) -> Value {
      if (args.positional.empty()) fail("no items for cycling given");
      return args.positional[static_cast<size_t>(i) % args.positional.size()];
    };
    return Value::from_callable(fn);
  }
  return std::nullopt;
}

std::optional<Value> Namespace::find(std::string_view name) const {
  if (loop) return loop_attribute(*loop, name);
  for (const auto& [key, value] : attrs)
    if (key == name) return value;
  return std::nullopt;
}

void Namespace::set(const std::string& name, Value value) {
  for (auto& [key, existing] : attrs) {
    if (key == name) {
      existing = std::move(value);
      return;
    }
  }
  attrs.emplace_back(name, std::move(value));
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : named)
    if (key == name) return &value;
  return nullptr;
}

void fail(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

void require_defined(const Value& v) {
  if (v.is_undefined()) fail(v.hint().empty() ? "value is undefined" : v.hint());
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
    case Value::Kind::kJson: break;
  }
  const Json& j = v.json();
  if (j.is_string()) return "str";
  if (j.is_boolean()) return "bool";
  if (j.is_number_integer()) return "int";
  if (j.is_number_float()) return "float";
  if (j.is_null()) return "NoneType";
  if (j.is_array()) return "list";
  return "dict";
}

double to_double(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1.0 : 0.0;
  if (j.is_number_unsigned()) return static_cast<double>(j.get<uint64_t>());
  if (j.is_number_integer()) return static_cast<double>(j.get<int64_t>());
  return j.get<double>();
}

int64_t to_int(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_float()) return static_cast<int64_t>(j.get<double>());
  return j.get<int64_t>();
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable: return true;
    case Value::Kind::kJson: break;
  }
  const Json& j = v.json();
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number()) return to_double(j) != 0.0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();
  return !j.empty();
}

static bool is_numeric(const Json& j) { return j.is_number() || j.is_boolean(); }

bool json_equal(const Json& a, const Json& b) {
  if (is_numeric(a) && is_numeric(b)) {
    if (!a.is_number_float() && !b.is_number_float()) return to_int(a) == to_int(b);
    return to_double(a) == to_double(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [key, value] : a.items()) {
      auto it = b.find(key);
      if (it == b.end() || !json_equal(value, *it)) return false;
    }
    return true;
  }
  return a == b;
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.is_json() && b.is_json()) return json_equal(a.json(), b.json());
  if (a.kind() == Value::Kind::kNamespace && b.kind() == Value::Kind::kNamespace)
    return &a.ns() == &b.ns();
  if (a.kind() == Value::Kind::kCallable && b.kind() == Value::Kind::kCallable)
    return &a.fn() == &b.fn();
  return false;
}

static std::string json_type_name(const Json& j) { return type_name(Value(j)); }

int json_compare(const Json& a, const Json& b) {
  if (is_numeric(a) && is_numeric(b)) {
    if (!a.is_number_float() && !b.is_number_float()) {
      int64_t x = to_int(a), y = to_int(b);
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    double x = to_double(a), y = to_double(b);
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, which is Python's string order.
    int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (json_equal(a[i], b[i])) continue;
      return json_compare(a[i], b[i]);
    }
    return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
  }
  fail("'<' not supported between instances of '" + json_type_name(a) + "' and '" +
       json_type_name(b) + "'");
}

int py_compare(const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (!a.is_json() || !b.is_json())
    fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) +
         "'");
  return json_compare(a.json(), b.json());
}

// ---- UTF-8 -----------------------------------------------------------------

static size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 6) return 2;
  if ((lead >> 4) == 14) return 3;
  if ((lead >> 3) == 30) return 4;
  return 1;
}

std::vector<char32_t> utf8_decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto lead = static_cast<unsigned char>(s[i]);
    size_t n = utf8_sequence_length(lead);
    if (lead < 0x80 || n == 1 || i + n > s.size()) {
      out.push_back(lead < 0x80 ? lead : 0xFFFD);  // invalid or truncated sequence
      ++i;
      continue;
    }
    char32_t cp = lead & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string utf8_encode(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

std::vector<std::string> utf8_chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = std::min(utf8_sequence_length(static_cast<unsigned char>(s[i])), s.size() - i);
    out.emplace_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n)
    i += utf8_sequence_length(static_cast<unsigned char>(s[i]));
  return n;
}

bool is_py_space(char32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---- str() and repr() ------------------------------------------------------

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits, then Python's layout: fixed notation for
  // exponents in [-4, 16), scientific otherwise.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, end);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else {
      auto point = static_cast<size_t>(exponent) + 1;
      if (digits.size() <= point) {
        out += digits + std::string(point - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, point) + "." + digits.substr(point);
      }
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out.append(digits, 1, std::string::npos);
  }
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

static std::string repr_string(const std::string& s) {
  char quote = '\'';
  if (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) quote = '"';
  std::string out(1, quote);
  for (char32_t cp : utf8_decode(s)) {
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<char32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0)) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out += utf8_encode(cp);
    }
  }
  out += quote;
  return out;
}

std::string py_repr(const Json& j) {
  if (j.is_string()) return repr_string(j.get_ref<const std::string&>());
  if (j.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += ", ";
      out += py_repr(j[i]);
    }
    return out + "]";
  }
  if (j.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, value] : j.items()) {
      if (!first) out += ", ";
      first = false;
      out += repr_string(key) + ": " + py_repr(value);
    }
    return out + "}";
  }
  return py_str(j);
}

std::string py_str(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "None";
  if (j.is_boolean()) return j.get<bool>() ? "True" : "False";
  if (j.is_number_unsigned()) return std::to_string(j.get<uint64_t>());
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  if (j.is_number_float()) return py_float_repr(j.get<double>());
  return py_repr(j);
}

std::string py_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kCallable: return "<function " + v.fn().name + ">";
    case Value::Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [key, value] : v.ns().attrs) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(key) + ": " + (value.is_json() ? py_repr(value.json()) : py_str(value));
      }
      return out + "}>";
    }
    case Value::Kind::kJson: return py_str(v.json());
  }
  return "";
}

// ---- json.dumps ------------------------------------------------------------

static void dump_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (char32_t cp : utf8_decode(s)) {
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            char32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                          static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
          }
          out += buf;
        } else {
          out += utf8_encode(cp);
        }
      }
    }
  }
  out += '"';
}

static void dump(const Json& j, const DumpOptions& opt, int level, std::string& out) {
  auto newline = [&](int depth) {
    out += '\n';
    for (int i = 0; i < depth; ++i) out += opt.indent;
  };
  if (j.is_string()) {
    dump_string(j.get_ref<const std::string&>(), opt.ensure_ascii, out);
  } else if (j.is_null()) {
    out += "null";
  } else if (j.is_boolean()) {
    out += j.get<bool>() ? "true" : "false";
  } else if (j.is_number_float()) {
    double d = j.get<double>();
    if (std::isnan(d)) out += "NaN";
    else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
    else out += py_float_repr(d);
  } else if (j.is_number()) {
    out += py_str(j);
  } else if (j.is_array()) {
    if (j.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    for (size_t i = 0; i < j.size(); ++i) {
      if (i) out += opt.item_separator;
      if (opt.has_indent) newline(level + 1);
      dump(j[i], opt, level + 1, out);
    }
    if (opt.has_indent) newline(level);
    out += ']';
  } else {
    if (j.empty()) {
      out += "{}";
      return;
    }
    std::vector<std::pair<const std::string*, const Json*>> entries;
    for (const auto& [key, value] : j.items()) entries.emplace_back(&key, &value);
    if (opt.sort_keys)
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return *a.first < *b.first; });
    out += '{';
    bool first = true;
    for (const auto& [key, value] : entries) {
      if (!first) out += opt.item_separator;
      first = false;
      if (opt.has_indent) newline(level + 1);
      dump_string(*key, opt.ensure_ascii, out);
      out += opt.key_separator;
      dump(*value, opt, level + 1, out);
    }
    if (opt.has_indent) newline(level);
    out += '}';
  }
}

std::string py_json_dumps(const Json& j, const DumpOptions& options) {
  std::string out;
  dump(j, options, 0, out);
  return out;
}

}  // namespace lazykv::jinja
