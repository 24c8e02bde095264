#include "eval/answers.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "common/error.h"

namespace lazykv::eval {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

// Index one past the '}' matching the '{' at open, or npos when unbalanced.
size_t match_brace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s[i] == '{') ++depth;
    if (s[i] == '}' && --depth == 0) return i + 1;
  }
  return std::string::npos;
}

// Replaces every "\cmd{content}" by its content.
void unwrap_command(std::string& s, std::string_view cmd) {
  const std::string prefix = std::string(cmd) + "{";
  size_t pos = 0;
  while ((pos = s.find(prefix, pos)) != std::string::npos) {
    const size_t open = pos + cmd.size();
    const size_t close = match_brace(s, open);
    if (close == std::string::npos) {
      s.erase(pos, prefix.size());  // unbalanced: drop the command, keep the rest
      continue;
    }
    const std::string content = s.substr(open + 1, close - open - 2);
    s.replace(pos, close - pos, content);
  }
}

// A plain decimal number with optional sign and thousands commas ("1,234.5").
std::optional<double> parse_plain_number(std::string_view text) {
  std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  size_t i = 0;
  if (s[0] == '-' || s[0] == '+') i = 1;
  // Thousands commas only in their proper places: 1-3 digits, then groups of 3.
  if (s.find(',') != std::string::npos) {
    size_t j = i, lead = 0;
    while (j < s.size() && is_digit(s[j])) ++j, ++lead;
    if (lead == 0 || lead > 3) return std::nullopt;
    while (j < s.size() && s[j] == ',') {
      for (int k = 1; k <= 3; ++k) {
        if (j + size_t(k) >= s.size() || !is_digit(s[j + size_t(k)])) return std::nullopt;
      }
      j += 4;
    }
    if (j < s.size() && s[j] != '.') return std::nullopt;
    std::string no_commas;
    for (char c : s) {
      if (c != ',') no_commas += c;
    }
    s = no_commas;
  }
  size_t digits = 0;
  for (size_t k = i; k < s.size(); ++k) {
    if (is_digit(s[k])) {
      ++digits;
    } else if (s[k] != '.') {
      return std::nullopt;
    }
  }
  if (digits == 0 || std::count(s.begin(), s.end(), '.') > 1) return std::nullopt;
  return std::strtod(s.c_str(), nullptr);
}

bool close_enough(double a, double b) { return std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b)); }

// "\frac12" -> "\frac{1}{2}", "\frac1{2}" -> "\frac{1}{2}", "\frac{1}2" -> "\frac{1}{2}".
std::string fix_fracs(const std::string& s) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t at = s.find("\\frac", pos);
    if (at == std::string::npos) break;
    out += s.substr(pos, at + 5 - pos);
    size_t i = at + 5;
    for (int arg = 0; arg < 2 && i < s.size(); ++arg) {
      if (s[i] == '{') {
        const size_t close = match_brace(s, i);
        if (close == std::string::npos) break;
        out += s.substr(i, close - i);
        i = close;
      } else if (s[i] != '\\') {
        out += '{';
        out += s[i];
        out += '}';
        ++i;
      } else {
        break;
      }
    }
    pos = i;
  }
  out += s.substr(pos);
  return out;
}

// "\sqrt2" -> "\sqrt{2}" (one character argument, as MATH writes it).
std::string fix_sqrt(const std::string& s) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t at = s.find("\\sqrt", pos);
    if (at == std::string::npos) break;
    out += s.substr(pos, at + 5 - pos);
    size_t i = at + 5;
    if (i < s.size() && s[i] != '{' && s[i] != '[' && s[i] != '\\' && !std::isspace(static_cast<unsigned char>(s[i]))) {
      out += '{';
      out += s[i];
      out += '}';
      ++i;
    }
    pos = i;
  }
  out += s.substr(pos);
  return out;
}

}  // namespace

Dataset parse_dataset(const std::string& name) {
  if (name == "gsm8k") return Dataset::kGsm8k;
  if (name == "math500") return Dataset::kMath500;
  throw Error(ErrorCode::kInvalidArgument, "unknown data set '" + name + "'; valid: gsm8k, math500");
}

const char* dataset_name(Dataset dataset) { return dataset == Dataset::kGsm8k ? "gsm8k" : "math500"; }

std::optional<std::string> last_boxed(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> starts;  // (position, keyword length)
  for (std::string_view keyword : {std::string_view("\\boxed"), std::string_view("\\fbox")}) {
    size_t pos = 0;
    while ((pos = text.find(keyword, pos)) != std::string_view::npos) {
      starts.emplace_back(pos, keyword.size());
      pos += keyword.size();
    }
  }
  std::sort(starts.begin(), starts.end());
  // The last complete one: a box cut off by the token limit does not count.
  for (auto it = starts.rbegin(); it != starts.rend(); ++it) {
    size_t i = it->first + it->second;
    // "\boxed {x}" is "\boxed{x}"; "\boxed 5" (no brace) takes the next word.
    size_t brace = i;
    while (brace < text.size() && text[brace] == ' ') ++brace;
    if (brace < text.size() && text[brace] == '{') i = brace;
    if (i < text.size() && text[i] == '{') {
      const size_t close = match_brace(text, i);
      if (close != std::string_view::npos) return std::string(text.substr(i + 1, close - i - 2));
    } else if (i < text.size() && text[i] == ' ') {
      size_t b = i;
      while (b < text.size() && text[b] == ' ') ++b;
      size_t e = b;
      while (e < text.size() && text[e] != '$' && !std::isspace(static_cast<unsigned char>(text[e]))) ++e;
      if (e > b) return std::string(text.substr(b, e - b));
    }
  }
  return std::nullopt;
}

std::optional<std::string> last_number(std::string_view text) {
  std::optional<std::string> last;
  size_t i = 0;
  while (i < text.size()) {
    if (!is_digit(text[i])) {
      ++i;
      continue;
    }
    size_t start = i;
    if (start > 0 && text[start - 1] == '-') --start;
    while (i < text.size() && is_digit(text[i])) ++i;
    // Thousands groups: a comma followed by exactly three digits.
    while (i + 3 < text.size() && text[i] == ',' && is_digit(text[i + 1]) && is_digit(text[i + 2]) &&
           is_digit(text[i + 3]) && (i + 4 >= text.size() || !is_digit(text[i + 4]))) {
      i += 4;
    }
    if (i + 1 < text.size() && text[i] == '.' && is_digit(text[i + 1])) {
      ++i;
      while (i < text.size() && is_digit(text[i])) ++i;
    }
    last = std::string(text.substr(start, i - start));
  }
  return last;
}

std::optional<std::string> gsm8k_gold(std::string_view answer) {
  const size_t at = answer.rfind("####");
  if (at == std::string_view::npos) return std::nullopt;
  std::string rest;
  for (char c : answer.substr(at + 4)) {
    if (c != ',') rest += c;
  }
  const size_t end = rest.find('\n');
  if (end != std::string::npos) rest.resize(end);
  // The first number after the marker ("#### $18" -> "18").
  size_t i = 0;
  while (i < rest.size() && !is_digit(rest[i])) ++i;
  if (i == rest.size()) return std::nullopt;
  size_t start = i > 0 && rest[i - 1] == '-' ? i - 1 : i;
  while (i < rest.size() && (is_digit(rest[i]) || (rest[i] == '.' && i + 1 < rest.size() && is_digit(rest[i + 1])))) ++i;
  return rest.substr(start, i - start);
}

std::optional<std::string> extract_prediction(std::string_view completion, Dataset dataset) {
  if (std::optional<std::string> boxed = last_boxed(completion)) return trim(*boxed);
  if (dataset == Dataset::kGsm8k) return last_number(completion);
  return std::nullopt;
}

std::optional<double> parse_gsm8k_number(std::string_view answer) {
  std::string s = trim(answer);
  if (s.find("frac") != std::string::npos) return parse_simple_number(normalize_math_answer(s));
  for (std::string_view cmd : {"\\textbf", "\\text", "\\mathrm", "\\mbox"}) unwrap_command(s, cmd);
  const size_t eq = s.rfind('=');
  if (eq != std::string::npos) s = s.substr(eq + 1);
  std::string kept;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == ',' || c == '$' || c == '%' || c == '\\' || c == '{' || c == '}' || is_alpha(c)) continue;
    kept += c;
  }
  kept = trim(kept);
  while (!kept.empty() && kept.back() == '.') kept = trim(kept.substr(0, kept.size() - 1));
  return parse_plain_number(kept);
}

bool gsm8k_equal(std::string_view prediction, std::string_view gold) {
  const std::optional<double> p = parse_gsm8k_number(prediction);
  const std::optional<double> g = parse_gsm8k_number(gold);
  return p && g && close_enough(*p, *g);
}

std::string normalize_math_answer(std::string_view answer) {
  std::string s = trim(answer);
  replace_all(s, "\n", "");
  replace_all(s, "\\!", "");
  replace_all(s, "\\\\", "\\");
  replace_all(s, "tfrac", "frac");
  replace_all(s, "dfrac", "frac");
  replace_all(s, "\\left", "");
  replace_all(s, "\\right", "");
  replace_all(s, "^{\\circ}", "");
  replace_all(s, "^\\circ", "");
  replace_all(s, "\\$", "");
  replace_all(s, "$", "");
  // "5\text{ cm}": a \text with a leading space after the value is a unit.
  const size_t unit = s.find("\\text{ ");
  if (unit != std::string::npos && unit > 0) s = trim(s.substr(0, unit));
  for (std::string_view cmd : {"\\textbf", "\\text", "\\mbox", "\\mathrm"}) unwrap_command(s, cmd);
  replace_all(s, "\\%", "");
  replace_all(s, "%", "");
  for (std::string_view space : {"\\,", "\\;", "\\:", "\\ ", "\\qquad", "\\quad", "\\displaystyle"}) replace_all(s, space, "");
  replace_all(s, " .", " 0.");
  replace_all(s, "{.", "{0.");
  s = trim(s);
  while (!s.empty() && s.back() == '.') s = trim(s.substr(0, s.size() - 1));
  if (!s.empty() && s[0] == '.') s = "0" + s;
  // "x = 5", "y=3": a single short variable assigned.
  const size_t eq = s.find('=');
  if (eq != std::string::npos && s.find('=', eq + 1) == std::string::npos && trim(s.substr(0, eq)).size() <= 2) {
    s = trim(s.substr(eq + 1));
  }
  s = fix_sqrt(s);
  std::string no_spaces;
  for (char c : s) {
    if (!std::isspace(static_cast<unsigned char>(c))) no_spaces += c;
  }
  s = fix_fracs(no_spaces);
  // "3/4" -> "\frac{3}{4}" for two integers.
  const size_t slash = s.find('/');
  if (slash != std::string::npos && slash > 0 && slash + 1 < s.size()) {
    const std::string a = s.substr(0, slash), b = s.substr(slash + 1);
    const auto all_digits = [](const std::string& t) {
      return !t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return is_digit(c); });
    };
    if (all_digits(a) && all_digits(b)) s = "\\frac{" + a + "}{" + b + "}";
  }
  return s;
}

std::optional<double> parse_simple_number(std::string_view normalized) {
  std::string s = trim(normalized);
  double sign = 1;
  if (!s.empty() && (s[0] == '-' || s[0] == '+') && s.size() > 1 && !is_digit(s[1])) {
    sign = s[0] == '-' ? -1 : 1;
    s = s.substr(1);
  }
  if (s.rfind("\\frac{", 0) == 0) {
    const size_t close1 = match_brace(s, 5);
    if (close1 == std::string::npos || close1 >= s.size() || s[close1] != '{') return std::nullopt;
    const size_t close2 = match_brace(s, close1);
    if (close2 != s.size()) return std::nullopt;
    const auto num = parse_plain_number(s.substr(6, close1 - 7));
    const auto den = parse_plain_number(s.substr(close1 + 1, close2 - close1 - 2));
    if (!num || !den || *den == 0) return std::nullopt;
    return sign * *num / *den;
  }
  const size_t slash = s.find('/');
  if (slash != std::string::npos) {
    const auto num = parse_plain_number(s.substr(0, slash));
    const auto den = parse_plain_number(s.substr(slash + 1));
    if (!num || !den || *den == 0) return std::nullopt;
    return sign * *num / *den;
  }
  const auto value = parse_plain_number(s);
  if (!value) return std::nullopt;
  return sign * *value;
}

bool math_equal(std::string_view prediction, std::string_view gold) {
  const std::string p = normalize_math_answer(prediction);
  const std::string g = normalize_math_answer(gold);
  if (p.empty() || g.empty()) return false;
  if (p == g) return true;
  const std::optional<double> pv = parse_simple_number(p);
  const std::optional<double> gv = parse_simple_number(g);
  return pv && gv && close_enough(*pv, *gv);
}

bool answer_correct(const std::optional<std::string>& prediction, const std::string& gold, Dataset dataset) {
  if (!prediction) return false;
  return dataset == Dataset::kGsm8k ? gsm8k_equal(*prediction, gold) : math_equal(*prediction, gold);
}

}  // namespace lazykv::eval
