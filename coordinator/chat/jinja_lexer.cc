#include "coordinator/chat/jinja_lexer.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "common/error.h"
#include "coordinator/chat/jinja_value.h"

namespace lazykv::jinja {

void syntax_error(const std::string& message, int line, int column) {
  throw Error(ErrorCode::kInvalidModel, "chat template: " + message + " at line " +
                                            std::to_string(line) + " column " +
                                            std::to_string(column));
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Python's unicode whitespace, as str.rstrip() and re's \s see it.
std::string rstrip_whitespace(const std::string& text) {
  std::vector<char32_t> cps = utf8_decode(text);
  size_t keep = cps.size();
  while (keep > 0 && is_py_space(cps[keep - 1])) --keep;
  std::string out;
  for (size_t i = 0; i < keep; ++i) out += utf8_encode(cps[i]);
  return keep == cps.size() ? text : out;
}

bool all_whitespace(std::string_view text) {
  for (char32_t cp : utf8_decode(text))
    if (!is_py_space(cp)) return false;
  return true;
}

// Newlines become "\n" and one trailing newline is dropped, as jinja2 does
// with its default newline_sequence and keep_trailing_newline=False.
std::string normalize_newlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t tag = find_tag_start(pos);
      if (tag == std::string::npos) {
        emit(Token::Type::kText, src_.substr(pos), pos);
        break;
      }
      std::string text = src_.substr(pos, tag - pos);
      char kind = src_[tag + 1];
      size_t p = tag + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      size_t raw_body = kind == '%' ? match_raw_begin(p) : std::string::npos;

      if (sign == '-') {
        text = rstrip_whitespace(text);
      } else if (sign != '+' && kind != '{') {
        text = lstrip_block(text, line_starting);
      }
      if (!text.empty()) emit(Token::Type::kText, text, pos);

      if (raw_body != std::string::npos) {
        pos = lex_raw(tag, raw_body);
      } else if (kind == '#') {
        pos = skip_comment(tag, p);
      } else {
        pos = lex_tag(tag, p, kind == '%');
      }
      line_starting = src_[pos - 1] == '\n';
    }
    emit(Token::Type::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  void position(size_t pos, int& line, int& column) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    size_t index = static_cast<size_t>(it - line_starts_.begin()) - 1;
    line = static_cast<int>(index) + 1;
    column = static_cast<int>(pos - line_starts_[index]) + 1;
  }

  [[noreturn]] void error_at(const std::string& message, size_t pos) const {
    int line, column;
    position(pos, line, column);
    syntax_error(message, line, column);
  }

  void emit(Token::Type type, std::string value, size_t pos) {
    Token token{type, std::move(value), 1, 1};
    position(pos, token.line, token.column);
    tokens_.push_back(std::move(token));
  }

  bool at(size_t pos, std::string_view s) const { return src_.compare(pos, s.size(), s) == 0; }

  size_t skip_space(size_t pos) const {
    while (pos < src_.size() && is_space(src_[pos])) ++pos;
    return pos;
  }

  size_t find_tag_start(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  // lstrip_blocks: whitespace between the line start and a block tag goes.
  static std::string lstrip_block(const std::string& text, bool line_starting) {
    size_t newline = text.rfind('\n');
    size_t line_pos = newline == std::string::npos ? 0 : newline + 1;
    if (line_pos == 0 && !line_starting) return text;
    std::string_view rest = std::string_view(text).substr(line_pos);
    if (rest.empty() || !all_whitespace(rest)) return text;
    return text.substr(0, line_pos);
  }

  // After "{%[-+]": the position after the raw tag's end, or npos.
  size_t match_raw_begin(size_t p) const {
    size_t q = skip_space(p);
    if (!at(q, "raw")) return std::string::npos;
    q = skip_space(q + 3);
    if (at(q, "-%}")) return skip_space(q + 3);
    if (at(q, "%}")) return q + 2;
    return std::string::npos;
  }

  size_t lex_raw(size_t tag, size_t body_start) {
    bool line_starting = src_[body_start - 1] == '\n';
    for (size_t i = src_.find("{%", body_start); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t q = i + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_space(q);
      if (!at(q, "endraw")) continue;
      q = skip_space(q + 6);
      size_t end;
      if (at(q, "+%}")) {
        end = q + 3;
      } else if (at(q, "-%}")) {
        end = skip_space(q + 3);
      } else if (at(q, "%}")) {
        end = q + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;
      } else {
        continue;
      }
      std::string text = src_.substr(body_start, i - body_start);
      if (sign == '-') text = rstrip_whitespace(text);
      else if (sign != '+') text = lstrip_block(text, line_starting);
      if (!text.empty()) emit(Token::Type::kText, text, body_start);
      return end;
    }
    error_at("missing end of raw directive", tag);
  }

  size_t skip_comment(size_t tag, size_t p) {
    size_t close = src_.find("#}", p);
    if (close == std::string::npos) error_at("missing end of comment tag", tag);
    if (close > p && src_[close - 1] == '-') return skip_space(close + 2);
    if (close > p && src_[close - 1] == '+') return close + 2;
    size_t end = close + 2;
    if (end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
    return end;
  }

  size_t lex_tag(size_t tag, size_t p, bool block) {
    emit(block ? Token::Type::kBlockBegin : Token::Type::kVariableBegin, "", tag);
    int depth = 0;
    size_t pos = p;
    while (true) {
      pos = skip_space(pos);
      if (pos >= src_.size())
        error_at(std::string("unexpected end of template, expected '") + (block ? "%}" : "}}") + "'", tag);
      if (depth == 0) {
        size_t end = tag_end(pos, block);
        if (end != std::string::npos) {
          emit(block ? Token::Type::kBlockEnd : Token::Type::kVariableEnd, "", pos);
          return end;
        }
      }
      pos = lex_token(pos, depth);
    }
  }

  size_t tag_end(size_t pos, bool block) const {
    if (block) {
      if (at(pos, "-%}")) return skip_space(pos + 3);
      if (at(pos, "+%}")) return pos + 3;
      if (at(pos, "%}")) {
        size_t end = pos + 2;
        if (end < src_.size() && src_[end] == '\n') ++end;  // trim_blocks
        return end;
      }
      return std::string::npos;
    }
    if (at(pos, "-}}")) return skip_space(pos + 3);
    if (at(pos, "}}")) return pos + 2;
    return std::string::npos;
  }

  size_t lex_token(size_t pos, int& depth) {
    char c = src_[pos];
    if (is_name_start(c)) {
      size_t end = pos;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      emit(Token::Type::kName, src_.substr(pos, end - pos), pos);
      return end;
    }
    if (is_digit(c)) return lex_number(pos);
    if (c == '\'' || c == '"') return lex_string(pos);
    static constexpr std::array<std::string_view, 6> kTwoChar = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwoChar) {
      if (at(pos, op)) {
        emit(Token::Type::kOperator, std::string(op), pos);
        return pos + 2;
      }
    }
    if (std::string_view("+-/*%~[](){}<>=.:|,;").find(c) != std::string_view::npos) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) error_at(std::string("unexpected '") + c + "'", pos);
        --depth;
      }
      emit(Token::Type::kOperator, std::string(1, c), pos);
      return pos + 1;
    }
    error_at(std::string("unexpected character '") + c + "'", pos);
  }

  size_t scan_digits(size_t pos, std::string& out) const {
    while (pos < src_.size() && (is_digit(src_[pos]) || (src_[pos] == '_' && pos + 1 < src_.size() &&
                                                          is_digit(src_[pos + 1])))) {
      if (src_[pos] != '_') out += src_[pos];
      ++pos;
    }
    return pos;
  }

  size_t lex_number(size_t start) {
    std::string digits;
    size_t pos = scan_digits(start, digits);
    bool is_float = false;
    if (pos + 1 < src_.size() && src_[pos] == '.' && is_digit(src_[pos + 1])) {
      digits += '.';
      pos = scan_digits(pos + 1, digits);
      is_float = true;
    }
    if (pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      size_t q = pos + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && is_digit(src_[q])) {
        digits += 'e';
        digits.append(src_, pos + 1, q - pos - 1);
        pos = scan_digits(q, digits);
        is_float = true;
      }
    }
    emit(is_float ? Token::Type::kFloat : Token::Type::kInteger, digits, start);
    return pos;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python's unicode-escape rules, which jinja2 applies to string literals.
  size_t lex_string(size_t start) {
    char quote = src_[start];
    std::string value;
    size_t pos = start + 1;
    while (true) {
      if (pos >= src_.size()) error_at("unterminated string literal", start);
      char c = src_[pos];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++pos;
        continue;
      }
      if (pos + 1 >= src_.size()) error_at("unterminated string literal", start);
      char e = src_[pos + 1];
      pos += 2;
      switch (e) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '\n': break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t count = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (size_t k = 0; k < count; ++k) {
            int h = pos + k < src_.size() ? hex_value(src_[pos + k]) : -1;
            if (h < 0) error_at("truncated \\" + std::string(1, e) + " escape in string", pos - 2);
            cp = cp * 16 + static_cast<char32_t>(h);
          }
          if (cp > 0x10FFFF) error_at("illegal Unicode character in string", pos - 2);
          value += utf8_encode(cp);
          pos += count;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && pos < src_.size() && src_[pos] >= '0' && src_[pos] <= '7'; ++k)
              cp = cp * 8 + static_cast<char32_t>(src_[pos++] - '0');
            value += utf8_encode(cp);
          } else {
            value += '\\';  // unknown escapes stay as written
            value += e;
          }
      }
    }
    emit(Token::Type::kString, value, start);
    return pos + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace lazykv::jinja
