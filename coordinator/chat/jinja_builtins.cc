#include "coordinator/chat/jinja_builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>

namespace lazykv::jinja {
namespace {

// ---- small helpers ---------------------------------------------------------

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

Value missing_attribute(const Value& object, const std::string& name) {
  return Value::undefined("'" + object_type_repr(object) + "' has no attribute '" + name + "'");
}

Value missing_element(const Value& object, const Value& key) {
  return Value::undefined(object_type_repr(object) + " has no element " +
                          (key.is_json() ? py_repr(key.json()) : py_str(key)));
}

void check_size(size_t bytes) {
  if (bytes > kMaxStringBytes) fail("chat template produced a string over " + std::to_string(kMaxStringBytes) + " bytes");
}

// Python's integers have no limit; a template's are 64-bit, and going past
// that is an error rather than a wrapped (undefined) result.
// Bytes of the strings in a JSON value (keys included), counted up to `cap`.
size_t content_bytes(const Json& j, size_t cap) {
  if (j.is_string()) return j.get_ref<const std::string&>().size();
  size_t total = 0;
  if (j.is_array()) {
    for (const Json& item : j) {
      total += content_bytes(item, cap);
      if (total > cap) break;
    }
  } else if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      total += key.size() + content_bytes(value, cap);
      if (total > cap) break;
    }
  }
  return total;
}

[[noreturn]] void integer_overflow() { fail("integer overflow: chat template integers are 64-bit"); }
int64_t add_int(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) integer_overflow();
  return r;
}
int64_t sub_int(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) integer_overflow();
  return r;
}
int64_t mul_int(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) integer_overflow();
  return r;
}

std::string as_string(const Value& v) { return py_str(v); }

const std::string& need_string(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_string()) fail(std::string(what) + " expects a string, got '" + type_name(v) + "'");
  return v.str();
}

int64_t need_int(const Value& v, const char* what) {
  require_defined(v);
  if (!v.is_json() || !(v.json().is_number_integer() || v.json().is_boolean()))
    fail(std::string(what) + " expects an integer, got '" + type_name(v) + "'");
  return to_int(v.json());
}

bool arg_bool(const CallArgs& args, size_t index, std::string_view name, bool fallback) {
  const Value* v = args.get(index, name);
  return v ? truthy(*v) : fallback;
}

Value arg_or(const CallArgs& args, size_t index, std::string_view name, Value fallback) {
  const Value* v = args.get(index, name);
  return v ? *v : fallback;
}

Value make_function(std::string name, std::function<Value(CallArgs&)> call) {
  auto fn = std::make_shared<Callable>();
  fn->name = std::move(name);
  fn->call = std::move(call);
  return Value::from_callable(std::move(fn));
}

char32_t to_upper(char32_t cp) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))); }
char32_t to_lower(char32_t cp) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))); }
bool is_cased(char32_t cp) { return to_upper(cp) != cp || to_lower(cp) != cp; }

// Python's str.upper() uses full case mapping: a few characters become two or three.
const char* special_upper(char32_t cp) {
  switch (cp) {
    case 0xDF: return "SS";
    case 0xFB00: return "FF";
    case 0xFB01: return "FI";
    case 0xFB02: return "FL";
    case 0xFB03: return "FFI";
    case 0xFB04: return "FFL";
    case 0xFB05:
    case 0xFB06: return "ST";
    default: return nullptr;
  }
}

std::string map_case(const std::string& s, char32_t (*fn)(char32_t)) {
  std::string out;
  for (char32_t cp : utf8_decode(s)) {
    const char* special = fn == to_upper ? special_upper(cp) : nullptr;
    out += special ? std::string(special) : utf8_encode(fn(cp));
  }
  return out;
}

std::string encode(const std::vector<char32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) out += utf8_encode(cps[i]);
  return out;
}

// Python str.title(): a letter after a cased letter is lowered, others raised.
std::string py_title(const std::string& s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t cp : utf8_decode(s)) {
    out += utf8_encode(previous_cased ? to_lower(cp) : to_upper(cp));
    previous_cased = is_cased(cp);
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::vector<char32_t> cps = utf8_decode(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) out += utf8_encode(i == 0 ? to_upper(cps[i]) : to_lower(cps[i]));
  return out;
}

// jinja2's title filter: words start after whitespace, '-', '(', '{', '[' or '<'.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (char32_t cp : utf8_decode(s)) {
    bool boundary = is_py_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    out += utf8_encode(boundary ? cp : (word_start ? to_upper(cp) : to_lower(cp)));
    word_start = boundary;
  }
  return out;
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<char32_t> cps = utf8_decode(s);
  std::vector<char32_t> set;
  bool whitespace = !chars || chars->is_none() || chars->is_undefined();
  if (!whitespace) set = utf8_decode(need_string(*chars, "strip"));
  auto strip_it = [&](char32_t cp) {
    return whitespace ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip_it(cps[begin])) ++begin;
  if (right)
    while (end > begin && strip_it(cps[end - 1])) --end;
  return encode(cps, begin, end);
}

Json py_split(const std::string& s, const Value* sep_value, int64_t max_split) {
  Json parts = Json::array();
  if (!sep_value || sep_value->is_none()) {
    std::vector<char32_t> cps = utf8_decode(s);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(parts.size()) >= max_split) {
        size_t end = cps.size();
        while (end > i && is_py_space(cps[end - 1])) --end;
        parts.push_back(encode(cps, i, end));
        break;
      }
      size_t start = i;
      while (i < cps.size() && !is_py_space(cps[i])) ++i;
      parts.push_back(encode(cps, start, i));
    }
    return parts;
  }
  const std::string& sep = need_string(*sep_value, "split");
  if (sep.empty()) fail("empty separator");
  size_t start = 0;
  while (true) {
    size_t found = s.find(sep, start);
    if (found == std::string::npos || (max_split >= 0 && static_cast<int64_t>(parts.size()) >= max_split)) {
      parts.push_back(s.substr(start));
      return parts;
    }
    parts.push_back(s.substr(start, found - start));
    start = found + sep.size();
  }
}

std::string py_replace(const std::string& s, const std::string& old_text, const std::string& new_text,
                       int64_t count) {
  std::string out;
  if (old_text.empty()) {
    std::vector<std::string> chars = utf8_chars(s);
    int64_t done = 0;
    for (const std::string& c : chars) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      out += c;
    }
    if (count < 0 || done < count) out += new_text;
    check_size(out.size());
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t found = s.find(old_text, start);
    if (found == std::string::npos) break;
    out.append(s, start, found - start);
    out += new_text;
    start = found + old_text.size();
    ++done;
    check_size(out.size());
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string repeat(const std::string& s, int64_t times) {
  if (times <= 0 || s.empty()) return "";
  if (uint64_t(times) > kMaxStringBytes / s.size()) check_size(kMaxStringBytes + 1);  // s.size() * times would wrap
  check_size(s.size() * static_cast<size_t>(times));
  const size_t total = s.size() * static_cast<size_t>(times);
  std::string out;
  out.reserve(total);  // no reallocation below, so appending from out itself is safe
  out.append(s);
  while (out.size() <= total / 2) out.append(out.data(), out.size());  // doubling: 'x' * 40000000 in 26 copies
  out.append(out.data(), total - out.size());
  return out;
}

// printf-style `str % args` for the conversions templates use.
std::string percent_format(const std::string& format, const Value& args_value) {
  std::vector<Value> args;
  if (args_value.is_array()) {
    for (const Json& item : args_value.json()) args.emplace_back(item);
  } else {
    args.push_back(args_value);
  }
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    size_t j = i + 1;
    while (j < format.size() && std::string_view("-+ 0#").find(format[j]) != std::string_view::npos) ++j;
    while (j < format.size() && (std::isdigit(static_cast<unsigned char>(format[j])) || format[j] == '.')) ++j;
    if (j >= format.size()) fail("incomplete format");
    char conv = format[j];
    std::string spec = format.substr(i, j - i);
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) fail("not enough arguments for format string");
    const Value& arg = args[next++];
    char buf[128];
    switch (conv) {
      case 's': out += py_str(arg); break;
      case 'r': out += arg.is_json() ? py_repr(arg.json()) : py_str(arg); break;
      case 'd':
      case 'i':
        if (!arg.is_number()) fail("%d format: a real number is required, not " + type_name(arg));
        std::snprintf(buf, sizeof(buf), (spec + "lld").c_str(), static_cast<long long>(to_double(arg.json())));
        out += buf;
        break;
      case 'f':
      case 'e':
      case 'g':
        if (!arg.is_number()) fail("must be real number, not " + type_name(arg));
        std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), to_double(arg.json()));
        out += buf;
        break;
      default: fail(std::string("unsupported format character '") + conv + "'");
    }
    check_size(out.size());
  }
  if (next < args.size() && args_value.is_array()) fail("not all arguments converted during string formatting");
  return out;
}

// str.format with {} / {0} / {name} fields and {{ }} escapes.
std::string brace_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    char c = format[i];
    if (c == '{' && i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < format.size() && format[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t close = format.find('}', i);
      if (close == std::string::npos) fail("single '{' encountered in format string");
      std::string field = format.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) fail("format specs are not supported in str.format");
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < args.positional.size() ? &args.positional[auto_index] : nullptr;
        ++auto_index;
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        if (field.size() > 9) fail("str.format: field index " + field + " out of range");
        size_t index = std::stoul(field);
        v = index < args.positional.size() ? &args.positional[index] : nullptr;
      } else {
        for (const auto& [key, value] : args.named)
          if (key == field) v = &value;
      }
      if (!v) fail("format field '" + field + "' has no argument");
      out += py_str(*v);
      check_size(out.size());
      i = close;
    } else if (c == '}') {
      fail("single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

// ---- methods of str, dict and list -----------------------------------------

bool is_string_method(const std::string& name) {
  static const char* const kNames[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith",
                                       "endswith", "upper", "lower", "title", "capitalize", "replace",
                                       "find", "rfind", "count", "join", "format", "splitlines",
                                       "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool starts_or_ends(const std::string& s, const Value& affix, bool start) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return start ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_array()) {
    for (const Json& item : affix.json())
      if (item.is_string() && one(item.get_ref<const std::string&>())) return true;
    return false;
  }
  return one(need_string(affix, start ? "startswith" : "endswith"));
}

template <typename Pred>
bool all_chars(const std::string& s, Pred pred) {
  std::vector<char32_t> cps = utf8_decode(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

Value call_string_method(const std::string& s, const std::string& name, const CallArgs& args) {
  if (name == "strip") return py_strip(s, args.get(0, "chars"), true, true);
  if (name == "lstrip") return py_strip(s, args.get(0, "chars"), true, false);
  if (name == "rstrip") return py_strip(s, args.get(0, "chars"), false, true);
  if (name == "split" || name == "rsplit") {
    const Value* max_split = args.get(1, "maxsplit");
    int64_t limit = max_split ? need_int(*max_split, "split") : -1;
    if (name == "rsplit" && limit >= 0) {
      // Split from the right: reverse, split, reverse back (exact for a literal separator).
      const Value* sep = args.get(0, "sep");
      if (!sep || sep->is_none()) fail("rsplit with maxsplit needs a separator");
      std::string sep_text = need_string(*sep, "rsplit");
      auto reverse = [](std::string t) {
        std::vector<std::string> chars = utf8_chars(t);
        std::string out;
        for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
        return out;
      };
      Value rsep(reverse(sep_text));
      Json parts = py_split(reverse(s), &rsep, limit);
      Json out = Json::array();
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) out.push_back(reverse(it->get<std::string>()));
      return out;
    }
    return py_split(s, args.get(0, "sep"), limit);
  }
  if (name == "startswith" || name == "endswith") {
    const Value* affix = args.get(0, "prefix");
    if (!affix) fail(name + "() takes at least 1 argument");
    return starts_or_ends(s, *affix, name == "startswith");
  }
  if (name == "upper") return map_case(s, to_upper);
  if (name == "lower") return map_case(s, to_lower);
  if (name == "title") return py_title(s);
  if (name == "capitalize") return py_capitalize(s);
  if (name == "replace") {
    const Value* old_text = args.get(0, "old");
    const Value* new_text = args.get(1, "new");
    if (!old_text || !new_text) fail("replace() takes at least 2 arguments");
    const Value* count = args.get(2, "count");
    return py_replace(s, need_string(*old_text, "replace"), need_string(*new_text, "replace"),
                      count ? need_int(*count, "replace") : -1);
  }
  if (name == "find" || name == "rfind" || name == "count") {
    const Value* sub_value = args.get(0, "sub");
    if (!sub_value) fail(name + "() takes at least 1 argument");
    const std::string& sub = need_string(*sub_value, name.c_str());
    if (name == "count") {
      if (sub.empty()) return static_cast<int64_t>(utf8_length(s) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return n;
    }
    size_t at = name == "find" ? s.find(sub) : s.rfind(sub);
    if (at == std::string::npos) return int64_t{-1};
    return static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, at)));
  }
  if (name == "join") {
    const Value* items = args.get(0, "iterable");
    if (!items) fail("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(*items)) {
      if (!first) out += s;
      first = false;
      if (!item.is_string()) fail("sequence item: expected str instance, " + type_name(item) + " found");
      out += item.str();
      check_size(out.size());
    }
    return out;
  }
  if (name == "format") return brace_format(s, args);
  if (name == "splitlines") {
    Json lines = Json::array();
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        lines.push_back(s.substr(start, i - start));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        start = i + 1;
      }
    }
    if (start < s.size()) lines.push_back(s.substr(start));
    return lines;
  }
  if (name == "isdigit") return all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isspace") return all_chars(s, is_py_space);
  auto is_letter = [](char32_t c) {
    auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    return category >= UTF8PROC_CATEGORY_LU && category <= UTF8PROC_CATEGORY_LO;
  };
  if (name == "isalpha") return all_chars(s, is_letter);
  if (name == "isalnum")
    return all_chars(s, [&](char32_t c) { return (c >= '0' && c <= '9') || is_letter(c); });
  if (name == "isupper") return map_case(s, to_upper) == s && map_case(s, to_lower) != s;
  if (name == "islower") return map_case(s, to_lower) == s && map_case(s, to_upper) != s;
  fail("'str' object has no attribute '" + name + "'");
}

Value call_dict_method(const Value& dict, const std::string& name, const CallArgs& args) {
  const Json& j = dict.json();
  if (name == "items") {
    Json out = Json::array();
    for (const auto& [key, value] : j.items()) out.push_back(Json::array({key, value}));
    return out;
  }
  if (name == "keys") {
    Json out = Json::array();
    for (const auto& [key, value] : j.items()) out.push_back(key);
    return out;
  }
  if (name == "values") {
    Json out = Json::array();
    for (const auto& [key, value] : j.items()) out.push_back(value);
    return out;
  }
  // get(key, default=None)
  const Value* key = args.get(0, "key");
  if (!key) fail("get expected at least 1 argument, got 0");
  if (key->is_string()) {
    auto it = j.find(key->str());
    if (it != j.end()) return Value::child(dict, *it);
  }
  return arg_or(args, 1, "default", Value(nullptr));
}

Value bound_method(const Value& object, const std::string& name) {
  return make_function(name, [object, name](CallArgs& args) -> Value {
    if (object.is_string()) return call_string_method(object.str(), name, args);
    return call_dict_method(object, name, args);
  });
}

bool is_list_mutator(const std::string& name) {
  static const char* const kNames[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool is_dict_method(const std::string& name) {
  return name == "items" || name == "keys" || name == "values" || name == "get";
}

// Index into a sequence of n items Python-style; false when out of range.
bool normalize_index(int64_t& index, size_t n) {
  if (index < 0) index += static_cast<int64_t>(n);
  return index >= 0 && index < static_cast<int64_t>(n);
}

// ---- filters ---------------------------------------------------------------

std::vector<Value> to_list(const Value& v) { return iterate(v); }

Json values_to_json(const std::vector<Value>& values) {
  Json out = Json::array();
  for (const Value& v : values) out.push_back(v.to_json());
  return out;
}

// An item's attribute by a dotted path ("a.b" or "0"), as jinja2's
// make_attrgetter resolves it.
Value attribute_path(const Value& item, const std::string& path) {
  Value current = item;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!part.empty() && part.size() <= 18 &&
        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
      current = get_item(current, Value(static_cast<int64_t>(std::stoll(part))));
    else
      current = get_item(current, Value(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

Value sort_key(const Value& item, const Value* attribute, bool case_sensitive) {
  Value key = attribute && !attribute->is_none() ? attribute_path(item, as_string(*attribute)) : item;
  if (!case_sensitive && key.is_string()) return map_case(key.str(), to_lower);
  return key;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string indent_filter(const std::string& text, const CallArgs& args) {
  Value width = arg_or(args, 0, "width", Value(int64_t{4}));
  bool first = arg_bool(args, 1, "first", false);
  bool blank = arg_bool(args, 2, "blank", false);
  std::string indentation = width.is_string() ? width.str() : std::string(static_cast<size_t>(std::max<int64_t>(0, need_int(width, "indent"))), ' ');
  std::vector<std::string> lines;
  size_t start = 0;
  std::string s = text + "\n";
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(start, i - start));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i == 0) {
      out += lines[0];
      continue;
    }
    out += "\n";
    if (blank || !lines[i].empty()) out += indentation;
    out += lines[i];
  }
  if (first) out = indentation + out;
  return out;
}

Value round_filter(const Value& value, const CallArgs& args) {
  require_defined(value);
  if (!value.is_number()) fail("round expects a number, got '" + type_name(value) + "'");
  int64_t precision = need_int(arg_or(args, 0, "precision", Value(int64_t{0})), "round");
  std::string method = as_string(arg_or(args, 1, "method", Value("common")));
  double x = to_double(value.json());
  if (method == "common") {
    if (!value.json().is_number_float() && precision >= 0) return value;
    // printf rounds the exact binary value half-to-even, as Python's round does.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), x);
    return std::stod(buf);
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return std::ceil(x * scale) / scale;
  if (method == "floor") return std::floor(x * scale) / scale;
  fail("method must be common, ceil or floor");
}

Value int_filter(const Value& value, const CallArgs& args) {
  Value fallback = arg_or(args, 0, "default", Value(int64_t{0}));
  if (value.is_json()) {
    const Json& j = value.json();
    if (j.is_number_integer() || j.is_boolean()) return to_int(j);
    if (j.is_number_float()) {
      double d = j.get<double>();
      if (std::isfinite(d)) return static_cast<int64_t>(d);
    }
    if (j.is_string()) {
      std::string s = py_strip(j.get<std::string>(), nullptr, true, true);
      try {
        size_t used = 0;
        long long n = std::stoll(s, &used, 10);
        if (used == s.size()) return static_cast<int64_t>(n);
        double d = std::stod(s, &used);
        if (used == s.size() && std::isfinite(d)) return static_cast<int64_t>(d);
      } catch (const std::exception&) {
      }
    }
  }
  return fallback;
}

Value float_filter(const Value& value, const CallArgs& args) {
  Value fallback = arg_or(args, 0, "default", Value(0.0));
  if (value.is_number()) return to_double(value.json());
  if (value.is_string()) {
    std::string s = py_strip(value.str(), nullptr, true, true);
    try {
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value tojson_filter(const Value& value, const CallArgs& args) {
  DumpOptions options;
  options.ensure_ascii = arg_bool(args, 0, "ensure_ascii", false);
  if (const Value* indent = args.get(1, "indent"); indent && !indent->is_none()) {
    options.has_indent = true;
    options.indent = indent->is_string() ? indent->str() : std::string(static_cast<size_t>(std::max<int64_t>(0, need_int(*indent, "tojson"))), ' ');
    options.item_separator = ",";
  }
  if (const Value* separators = args.get(2, "separators"); separators && !separators->is_none()) {
    if (!separators->is_array() || separators->json().size() != 2) fail("separators must be a pair of strings");
    options.item_separator = py_str(separators->json()[0]);
    options.key_separator = py_str(separators->json()[1]);
  }
  options.sort_keys = arg_bool(args, 3, "sort_keys", false);
  require_defined(value);
  if (!value.is_json()) fail("Object of type " + type_name(value) + " is not JSON serializable");
  return py_json_dumps(value.json(), options);
}

Value select_filter(const Value& input, const CallArgs& args, bool by_attribute, bool keep) {
  std::vector<Value> items = to_list(input);
  size_t first_test_arg = by_attribute ? 1 : 0;
  std::string attribute;
  if (by_attribute) {
    const Value* a = args.get(0, "attribute");
    if (!a) fail("selectattr needs an attribute name");
    attribute = as_string(*a);
  }
  std::string test;
  CallArgs test_args;
  if (args.positional.size() > first_test_arg) {
    test = need_string(args.positional[first_test_arg], "select");
    if (!has_test(test)) fail("no test named '" + test + "'");
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(first_test_arg) + 1,
                                args.positional.end());
  }
  Json out = Json::array();
  for (const Value& item : items) {
    Value subject = by_attribute ? attribute_path(item, attribute) : item;
    bool passed = test.empty() ? truthy(subject) : apply_test(test, subject, test_args);
    if (passed == keep) out.push_back(item.to_json());
  }
  return out;
}

Value map_filter(const Value& input, const CallArgs& args) {
  std::vector<Value> items = to_list(input);
  Json out = Json::array();
  if (const Value* attribute = args.get(99, "attribute")) {
    const Value* fallback = args.get(99, "default");
    for (const Value& item : items) {
      Value v = attribute_path(item, as_string(*attribute));
      if (v.is_undefined() && fallback) v = *fallback;
      out.push_back(v.to_json());
    }
    return out;
  }
  if (args.positional.empty()) fail("map needs a filter name or attribute=");
  std::string filter = need_string(args.positional[0], "map");
  if (!has_filter(filter)) fail("no filter named '" + filter + "'");
  CallArgs filter_args;
  filter_args.positional.assign(args.positional.begin() + 1, args.positional.end());
  filter_args.named = args.named;
  for (const Value& item : items) out.push_back(apply_filter(filter, item, filter_args).to_json());
  return out;
}

Value join_filter(const Value& input, const CallArgs& args) {
  std::string separator = as_string(arg_or(args, 0, "d", Value("")));
  const Value* attribute = args.get(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : to_list(input)) {
    if (!first) out += separator;
    first = false;
    out += py_str(attribute && !attribute->is_none() ? attribute_path(item, as_string(*attribute)) : item);
    check_size(out.size());
  }
  return out;
}

Value sort_filter(const Value& input, const CallArgs& args) {
  bool reverse = arg_bool(args, 0, "reverse", false);
  bool case_sensitive = arg_bool(args, 1, "case_sensitive", false);
  const Value* attribute = args.get(2, "attribute");
  std::vector<Value> items = to_list(input);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) keyed.emplace_back(sort_key(item, attribute, case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    int c = py_compare(a.first, b.first);
    return reverse ? c > 0 : c < 0;
  });
  Json out = Json::array();
  for (const auto& [key, item] : keyed) out.push_back(item.to_json());
  return out;
}

Value unique_filter(const Value& input, const CallArgs& args) {
  bool case_sensitive = arg_bool(args, 0, "case_sensitive", false);
  const Value* attribute = args.get(1, "attribute");
  std::vector<Value> seen;
  Json out = Json::array();
  for (const Value& item : to_list(input)) {
    Value key = sort_key(item, attribute, case_sensitive);
    bool duplicate = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); });
    if (duplicate) continue;
    seen.push_back(key);
    out.push_back(item.to_json());
  }
  return out;
}

Value min_max_filter(const Value& input, const CallArgs& args, bool want_max) {
  bool case_sensitive = arg_bool(args, 0, "case_sensitive", false);
  const Value* attribute = args.get(1, "attribute");
  std::vector<Value> items = to_list(input);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = sort_key(items[0], attribute, case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = sort_key(items[i], attribute, case_sensitive);
    int c = py_compare(key, best_key);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}

Value sum_filter(const Value& input, const CallArgs& args) {
  const Value* attribute = args.get(0, "attribute");
  Value total = arg_or(args, 1, "start", Value(int64_t{0}));
  for (const Value& item : to_list(input))
    total = binary_op("+", total, attribute && !attribute->is_none() ? attribute_path(item, as_string(*attribute)) : item);
  return total;
}

Value length_of(const Value& v) {
  if (v.is_undefined()) return int64_t{0};
  if (v.is_string()) return static_cast<int64_t>(utf8_length(v.str()));
  if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.json().size());
  if (v.kind() == Value::Kind::kNamespace) fail("object of type 'Namespace' has no len()");
  fail("object of type '" + type_name(v) + "' has no len()");
}

Value reverse_filter(const Value& v) {
  require_defined(v);
  if (v.is_string()) {
    std::vector<std::string> chars = utf8_chars(v.str());
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
    return out;
  }
  std::vector<Value> items = to_list(v);
  std::reverse(items.begin(), items.end());
  return values_to_json(items);
}

Value items_filter(const Value& v) {
  if (v.is_undefined()) return Json::array();
  if (!v.is_object()) fail("Can only get item pairs from a mapping.");
  return call_dict_method(v, "items", CallArgs{});
}

Value dictsort_filter(const Value& v, const CallArgs& args) {
  if (!v.is_object()) fail("dictsort expects a mapping");
  bool case_sensitive = arg_bool(args, 0, "case_sensitive", false);
  std::string by = as_string(arg_or(args, 1, "by", Value("key")));
  bool reverse = arg_bool(args, 2, "reverse", false);
  std::vector<std::pair<std::string, Json>> entries;
  for (const auto& [key, value] : v.json().items()) entries.emplace_back(key, value);
  std::stable_sort(entries.begin(), entries.end(), [&](const auto& a, const auto& b) {
    Value ka = by == "value" ? Value(a.second) : Value(a.first);
    Value kb = by == "value" ? Value(b.second) : Value(b.first);
    if (!case_sensitive && ka.is_string()) ka = map_case(ka.str(), to_lower);
    if (!case_sensitive && kb.is_string()) kb = map_case(kb.str(), to_lower);
    int c = py_compare(ka, kb);
    return reverse ? c > 0 : c < 0;
  });
  Json out = Json::array();
  for (auto& [key, value] : entries) out.push_back(Json::array({key, value}));
  return out;
}

using FilterFn = std::function<Value(const Value&, const CallArgs&)>;

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> kFilters = [] {
    std::map<std::string, FilterFn, std::less<>> f;
    f["trim"] = [](const Value& v, const CallArgs& a) -> Value { return py_strip(as_string(v), a.get(0, "chars"), true, true); };
    f["length"] = [](const Value& v, const CallArgs&) { return length_of(v); };
    f["count"] = f["length"];
    f["upper"] = [](const Value& v, const CallArgs&) -> Value { return map_case(as_string(v), to_upper); };
    f["lower"] = [](const Value& v, const CallArgs&) -> Value { return map_case(as_string(v), to_lower); };
    f["title"] = [](const Value& v, const CallArgs&) -> Value { return jinja_title(as_string(v)); };
    f["capitalize"] = [](const Value& v, const CallArgs&) -> Value { return py_capitalize(as_string(v)); };
    f["default"] = [](const Value& v, const CallArgs& a) -> Value {
      bool boolean = arg_bool(a, 1, "boolean", false);
      if (v.is_undefined() || (boolean && !truthy(v))) return arg_or(a, 0, "default_value", Value(""));
      return v;
    };
    f["d"] = f["default"];
    f["first"] = [](const Value& v, const CallArgs&) -> Value {
      std::vector<Value> items = to_list(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    f["last"] = [](const Value& v, const CallArgs&) -> Value {
      std::vector<Value> items = to_list(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    f["join"] = join_filter;
    f["replace"] = [](const Value& v, const CallArgs& a) -> Value {
      const Value* old_text = a.get(0, "old");
      const Value* new_text = a.get(1, "new");
      if (!old_text || !new_text) fail("replace needs old and new strings");
      const Value* count = a.get(2, "count");
      return py_replace(as_string(v), as_string(*old_text), as_string(*new_text),
                        count && !count->is_none() ? need_int(*count, "replace") : -1);
    };
    f["tojson"] = tojson_filter;
    f["string"] = [](const Value& v, const CallArgs&) -> Value { return as_string(v); };
    f["safe"] = f["string"];
    f["escape"] = [](const Value& v, const CallArgs&) -> Value { return html_escape(as_string(v)); };
    f["e"] = f["escape"];
    f["int"] = int_filter;
    f["float"] = float_filter;
    f["abs"] = [](const Value& v, const CallArgs&) -> Value {
      if (!v.is_number()) fail("bad operand type for abs(): '" + type_name(v) + "'");
      if (v.json().is_number_float()) return std::fabs(v.json().get<double>());
      return std::llabs(to_int(v.json()));
    };
    f["round"] = round_filter;
    f["list"] = [](const Value& v, const CallArgs&) -> Value { return values_to_json(to_list(v)); };
    f["items"] = [](const Value& v, const CallArgs&) { return items_filter(v); };
    f["dictsort"] = dictsort_filter;
    f["selectattr"] = [](const Value& v, const CallArgs& a) { return select_filter(v, a, true, true); };
    f["rejectattr"] = [](const Value& v, const CallArgs& a) { return select_filter(v, a, true, false); };
    f["select"] = [](const Value& v, const CallArgs& a) { return select_filter(v, a, false, true); };
    f["reject"] = [](const Value& v, const CallArgs& a) { return select_filter(v, a, false, false); };
    f["map"] = map_filter;
    f["indent"] = [](const Value& v, const CallArgs& a) -> Value { return indent_filter(as_string(v), a); };
    f["unique"] = unique_filter;
    f["reverse"] = [](const Value& v, const CallArgs&) { return reverse_filter(v); };
    f["sort"] = sort_filter;
    f["min"] = [](const Value& v, const CallArgs& a) { return min_max_filter(v, a, false); };
    f["max"] = [](const Value& v, const CallArgs& a) { return min_max_filter(v, a, true); };
    f["sum"] = sum_filter;
    f["attr"] = [](const Value& v, const CallArgs& a) -> Value {
      const Value* name = a.get(0, "name");
      if (!name) fail("attr needs a name");
      return get_attribute(v, as_string(*name));
    };
    f["format"] = [](const Value& v, const CallArgs& a) -> Value {
      Json args = Json::array();
      for (const Value& p : a.positional) args.push_back(p.to_json());
      return percent_format(as_string(v), Value(args));
    };
    f["wordcount"] = [](const Value& v, const CallArgs&) -> Value {
      return static_cast<int64_t>(py_split(as_string(v), nullptr, -1).size());
    };
    return f;
  }();
  return kFilters;
}

// ---- tests -----------------------------------------------------------------

using TestFn = std::function<bool(const Value&, const CallArgs&)>;

const Value& test_arg(const CallArgs& args, const char* test) {
  const Value* v = args.get(0, "value");
  if (!v) fail(std::string("test '") + test + "' needs an argument");
  return *v;
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> kTests = [] {
    std::map<std::string, TestFn, std::less<>> t;
    t["defined"] = [](const Value& v, const CallArgs&) { return !v.is_undefined(); };
    t["undefined"] = [](const Value& v, const CallArgs&) { return v.is_undefined(); };
    t["none"] = [](const Value& v, const CallArgs&) { return v.is_none(); };
    t["boolean"] = [](const Value& v, const CallArgs&) { return v.is_json() && v.json().is_boolean(); };
    t["true"] = [](const Value& v, const CallArgs&) { return v.is_json() && v.json().is_boolean() && v.json().get<bool>(); };
    t["false"] = [](const Value& v, const CallArgs&) { return v.is_json() && v.json().is_boolean() && !v.json().get<bool>(); };
    t["integer"] = [](const Value& v, const CallArgs&) { return v.is_json() && v.json().is_number_integer(); };
    t["float"] = [](const Value& v, const CallArgs&) { return v.is_json() && v.json().is_number_float(); };
    t["number"] = [](const Value& v, const CallArgs&) { return v.is_number(); };
    t["string"] = [](const Value& v, const CallArgs&) { return v.is_string(); };
    t["mapping"] = [](const Value& v, const CallArgs&) { return v.is_object(); };
    t["iterable"] = [](const Value& v, const CallArgs&) {
      return v.is_undefined() || v.is_string() || v.is_array() || v.is_object();
    };
    t["sequence"] = [](const Value& v, const CallArgs&) {
      return v.is_undefined() || v.is_string() || v.is_array() || v.is_object();
    };
    t["callable"] = [](const Value& v, const CallArgs&) { return v.kind() == Value::Kind::kCallable; };
    t["sameas"] = [](const Value& v, const CallArgs& a) {
      const Value& other = test_arg(a, "sameas");
      if (v.is_json() && other.is_json() && (v.json().is_null() || v.json().is_boolean()))
        return v.json() == other.json();
      return v.kind() == other.kind() && v.kind() != Value::Kind::kJson && py_equal(v, other);
    };
    t["escaped"] = [](const Value&, const CallArgs&) { return false; };
    t["eq"] = [](const Value& v, const CallArgs& a) { return py_equal(v, test_arg(a, "eq")); };
    t["equalto"] = t["eq"];
    t["=="] = t["eq"];
    t["ne"] = [](const Value& v, const CallArgs& a) { return !py_equal(v, test_arg(a, "ne")); };
    t["!="] = t["ne"];
    t["lt"] = [](const Value& v, const CallArgs& a) { return py_compare(v, test_arg(a, "lt")) < 0; };
    t["lessthan"] = t["lt"];
    t["<"] = t["lt"];
    t["le"] = [](const Value& v, const CallArgs& a) { return py_compare(v, test_arg(a, "le")) <= 0; };
    t["<="] = t["le"];
    t["gt"] = [](const Value& v, const CallArgs& a) { return py_compare(v, test_arg(a, "gt")) > 0; };
    t["greaterthan"] = t["gt"];
    t[">"] = t["gt"];
    t["ge"] = [](const Value& v, const CallArgs& a) { return py_compare(v, test_arg(a, "ge")) >= 0; };
    t[">="] = t["ge"];
    t["in"] = [](const Value& v, const CallArgs& a) { return truthy(binary_op("in", v, test_arg(a, "in"))); };
    t["odd"] = [](const Value& v, const CallArgs&) {
      int64_t n = need_int(v, "odd");
      return n % 2 != 0;
    };
    t["even"] = [](const Value& v, const CallArgs&) { return need_int(v, "even") % 2 == 0; };
    t["divisibleby"] = [](const Value& v, const CallArgs& a) {
      int64_t d = need_int(test_arg(a, "divisibleby"), "divisibleby");
      if (d == 0) fail("integer division or modulo by zero");
      return need_int(v, "divisibleby") % d == 0;
    };
    t["lower"] = [](const Value& v, const CallArgs&) { return v.is_string() && map_case(v.str(), to_lower) == v.str(); };
    t["upper"] = [](const Value& v, const CallArgs&) { return v.is_string() && map_case(v.str(), to_upper) == v.str(); };
    t["filter"] = [](const Value& v, const CallArgs&) { return v.is_string() && has_filter(v.str()); };
    t["test"] = [](const Value& v, const CallArgs&) { return v.is_string() && has_test(v.str()); };
    return t;
  }();
  return kTests;
}

// ---- arithmetic ------------------------------------------------------------

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  auto unsupported = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (!a.is_json() || !b.is_json()) unsupported();
  const Json& x = a.json();
  const Json& y = b.json();
  bool numbers = a.is_number() && b.is_number();
  bool floats = numbers && (x.is_number_float() || y.is_number_float());
  if (op == "+") {
    if (numbers) return floats ? Value(to_double(x) + to_double(y)) : Value(add_int(to_int(x), to_int(y)));
    if (x.is_string() && y.is_string()) {
      check_size(a.str().size() + b.str().size());
      return a.str() + b.str();
    }
    if (x.is_array() && y.is_array()) {
      if (x.size() + y.size() > kMaxListItems) fail("list too long");
      Json out = x;
      for (const Json& item : y) out.push_back(item);
      return out;
    }
    return unsupported();
  }
  if (op == "*") {
    if (numbers) return floats ? Value(to_double(x) * to_double(y)) : Value(mul_int(to_int(x), to_int(y)));
    const Value* seq = x.is_string() || x.is_array() ? &a : (y.is_string() || y.is_array() ? &b : nullptr);
    const Value* times = seq == &a ? &b : &a;
    if (!seq || !times->is_json() || !(times->json().is_number_integer() || times->json().is_boolean())) return unsupported();
    int64_t n = to_int(times->json());
    if (seq->is_string()) return repeat(seq->str(), n);
    if (n > 0 && seq->json().size() * static_cast<size_t>(std::min<int64_t>(n, kMaxListItems + 1)) > kMaxListItems)
      fail("list too long");
    // Every copy copies the items' strings too: [s] * n holds n copies of s.
    if (n > 0 && uint64_t(n) > kMaxStringBytes / std::max<size_t>(1, content_bytes(seq->json(), kMaxStringBytes))) {
      fail("list too large: its strings would pass " + std::to_string(kMaxStringBytes) + " bytes");
    }
    Json out = Json::array();
    for (int64_t i = 0; i < n; ++i)
      for (const Json& item : seq->json()) out.push_back(item);
    return out;
  }
  if (op == "%" && x.is_string()) return percent_format(a.str(), b);
  if (!numbers) return unsupported();
  if (op == "-") return floats ? Value(to_double(x) - to_double(y)) : Value(sub_int(to_int(x), to_int(y)));
  if (op == "/") {
    if (to_double(y) == 0.0) fail(floats ? "float division by zero" : "division by zero");
    return to_double(x) / to_double(y);
  }
  if (op == "//" || op == "%") {
    if (to_double(y) == 0.0) fail(floats ? "float divmod()" : "integer division or modulo by zero");
    if (!floats) {
      int64_t p = to_int(x), q = to_int(y);
      if (p == std::numeric_limits<int64_t>::min() && q == -1) integer_overflow();  // traps on x86
      int64_t quotient = p / q, remainder = p % q;
      if (remainder != 0 && ((remainder < 0) != (q < 0))) {
        --quotient;
        remainder += q;
      }
      return op == "//" ? quotient : remainder;
    }
    double p = to_double(x), q = to_double(y);
    if (op == "//") return std::floor(p / q);
    double r = std::fmod(p, q);
    if (r != 0 && ((r < 0) != (q < 0))) r += q;
    return r;
  }
  if (op == "**") {
    if (!floats && to_int(y) >= 0) {
      // By squaring: as many steps as the exponent has bits. While bits are
      // left the squared base is still to be multiplied in, so its overflow
      // is the result's (a base of 0, 1 or -1 never overflows).
      int64_t base = to_int(x), result = 1;
      for (int64_t e = to_int(y); e > 0; e >>= 1) {
        if (e & 1) result = mul_int(result, base);
        if (e > 1) base = mul_int(base, base);
      }
      return result;
    }
    return std::pow(to_double(x), to_double(y));
  }
  return unsupported();
}

bool contains(const Value& container, const Value& item) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + type_name(item));
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_array()) {
    for (const Json& element : container.json())
      if (py_equal(Value::child(container, element), item)) return true;
    return false;
  }
  if (container.is_object()) return item.is_string() && container.json().contains(item.str());
  if (container.kind() == Value::Kind::kNamespace) return item.is_string() && container.ns().find(item.str()).has_value();
  fail("argument of type '" + type_name(container) + "' is not iterable");
}

// Python slice.indices + iteration, over n items.
std::vector<size_t> slice_indices(size_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto get = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    return need_int(v, "slice");
  };
  int64_t len = static_cast<int64_t>(n);
  int64_t step = get(step_v).value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t i = *v;
    if (i < 0) i += len;
    if (step > 0) return std::clamp<int64_t>(i, 0, len);
    return std::clamp<int64_t>(i, -1, len - 1);
  };
  int64_t start = clamp(get(start_v), step > 0 ? 0 : len - 1);
  int64_t stop = clamp(get(stop_v), step > 0 ? len : -1);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    out.push_back(static_cast<size_t>(i));
    if (__builtin_add_overflow(i, step, &i)) break;  // a step past the end of int64 is past the end of the slice
  }
  return out;
}

}  // namespace

bool has_filter(std::string_view name) { return filters().count(name) != 0; }
bool has_test(std::string_view name) { return tests().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& input, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("no filter named '" + name + "'");
  return it->second(input, args);
}

bool apply_test(const std::string& name, const Value& subject, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("no test named '" + name + "'");
  return it->second(subject, args);
}

Value get_attribute(const Value& object, const std::string& name) {
  require_defined(object);
  switch (object.kind()) {
    case Value::Kind::kNamespace: {
      std::optional<Value> v = object.ns().find(name);
      return v ? *v : Value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    case Value::Kind::kCallable: return Value::undefined("'function object' has no attribute '" + name + "'");
    default: break;
  }
  const Json& j = object.json();
  if (j.is_object()) {
    if (is_dict_method(name)) return bound_method(object, name);
    auto it = j.find(name);
    if (it != j.end()) return Value::child(object, *it);
    return missing_attribute(object, name);
  }
  if (j.is_string() && is_string_method(name)) return bound_method(object, name);
  if (j.is_array() && is_list_mutator(name))
    return Value::undefined("access to attribute '" + name + "' of 'list' object is unsafe.");
  return missing_attribute(object, name);
}

Value get_item(const Value& object, const Value& key) {
  require_defined(object);
  require_defined(key);
  if (object.kind() == Value::Kind::kNamespace && key.is_string()) return get_attribute(object, key.str());
  if (!object.is_json()) return missing_element(object, key);
  const Json& j = object.json();
  bool int_key = key.is_json() && (key.json().is_number_integer() || key.json().is_boolean());
  if (j.is_array() && int_key) {
    int64_t index = to_int(key.json());
    if (!normalize_index(index, j.size())) return missing_element(object, key);
    return Value::child(object, j[static_cast<size_t>(index)]);
  }
  if (j.is_string() && int_key) {
    std::vector<std::string> chars = utf8_chars(j.get_ref<const std::string&>());
    int64_t index = to_int(key.json());
    if (!normalize_index(index, chars.size())) return missing_element(object, key);
    return chars[static_cast<size_t>(index)];
  }
  if (j.is_object() && key.is_string()) {
    auto it = j.find(key.str());
    if (it != j.end()) return Value::child(object, *it);
  }
  if (key.is_string()) return get_attribute(object, key.str());
  return missing_element(object, key);
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  require_defined(object);
  if (object.is_string()) {
    std::vector<std::string> chars = utf8_chars(object.str());
    std::string out;
    for (size_t i : slice_indices(chars.size(), start, stop, step)) out += chars[i];
    return out;
  }
  if (object.is_array()) {
    Json out = Json::array();
    for (size_t i : slice_indices(object.json().size(), start, stop, step)) out.push_back(object.json()[i]);
    return out;
  }
  fail("'" + type_name(object) + "' object is not subscriptable");
}

Value binary_op(const std::string& op, const Value& left, const Value& right) {
  if (op == "==") return py_equal(left, right);
  if (op == "!=") return !py_equal(left, right);
  if (op == "<") return py_compare(left, right) < 0;
  if (op == "<=") return py_compare(left, right) <= 0;
  if (op == ">") return py_compare(left, right) > 0;
  if (op == ">=") return py_compare(left, right) >= 0;
  if (op == "in" || op == "notin") {
    require_defined(left);
    return contains(right, left) == (op == "in");
  }
  if (op == "~") {
    std::string out = py_str(left) + py_str(right);
    check_size(out.size());
    return out;
  }
  require_defined(left);
  require_defined(right);
  return arithmetic(op, left, right);
}

Value negate(const Value& operand) {
  require_defined(operand);
  if (!operand.is_number()) fail("bad operand type for unary -: '" + type_name(operand) + "'");
  if (operand.json().is_number_float()) return -operand.json().get<double>();
  return sub_int(0, to_int(operand.json()));
}

std::vector<Value> iterate(const Value& iterable) {
  std::vector<Value> items;
  switch (iterable.kind()) {
    case Value::Kind::kUndefined: return items;
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable: fail("'" + type_name(iterable) + "' object is not iterable");
    case Value::Kind::kJson: break;
  }
  const Json& j = iterable.json();
  if (j.is_array()) {
    items.reserve(j.size());
    for (const Json& item : j) items.push_back(Value::child(iterable, item));
  } else if (j.is_object()) {
    for (const auto& [key, value] : j.items()) items.emplace_back(key);
  } else if (j.is_string()) {
    for (std::string& c : utf8_chars(j.get_ref<const std::string&>())) items.emplace_back(std::move(c));
  } else {
    fail("'" + type_name(iterable) + "' object is not iterable");
  }
  return items;
}

std::vector<std::pair<std::string, Value>> global_functions() {
  std::vector<std::pair<std::string, Value>> globals;
  globals.emplace_back("range", make_function("range", [](CallArgs& args) -> Value {
    if (!args.named.empty()) fail("range() takes no keyword arguments");
    std::vector<int64_t> a;
    for (const Value& v : args.positional) a.push_back(need_int(v, "range"));
    if (a.empty() || a.size() > 3) fail("range expected 1 to 3 arguments, got " + std::to_string(a.size()));
    int64_t start = a.size() == 1 ? 0 : a[0];
    int64_t stop = a.size() == 1 ? a[0] : a[1];
    int64_t step = a.size() == 3 ? a[2] : 1;
    if (step == 0) fail("range() arg 3 must not be zero");
    Json out = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (out.size() >= kMaxListItems) fail("range too large");
      out.push_back(i);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return out;
  }));
  globals.emplace_back("namespace", make_function("namespace", [](CallArgs& args) -> Value {
    auto ns = std::make_shared<Namespace>();
    for (const Value& v : args.positional) {
      if (!v.is_object()) fail("namespace() positional argument must be a mapping");
      for (const auto& [key, value] : v.json().items()) ns->set(key, Value::child(v, value));
    }
    for (auto& [key, value] : args.named) ns->set(key, value);
    return Value::from_namespace(ns);
  }));
  globals.emplace_back("dict", make_function("dict", [](CallArgs& args) -> Value {
    Json out = Json::object();
    for (const Value& v : args.positional) {
      if (!v.is_object()) fail("dict() positional argument must be a mapping");
      for (const auto& [key, value] : v.json().items()) out[key] = value;
    }
    for (auto& [key, value] : args.named) out[key] = value.to_json();
    return out;
  }));
  globals.emplace_back("raise_exception", make_function("raise_exception", [](CallArgs& args) -> Value {
    fail(args.positional.empty() ? std::string() : py_str(args.positional[0]));
  }));
  globals.emplace_back("strftime_now", make_function("strftime_now", [](CallArgs& args) -> Value {
    std::string format = args.positional.empty() ? "" : need_string(args.positional[0], "strftime_now");
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &local);
    if (n == 0 && !format.empty()) fail("strftime_now: format too long");
    return std::string(buf, n);
  }));
  return globals;
}

}  // namespace lazykv::jinja
