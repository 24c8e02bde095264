#include "coordinator/grammar/json_matcher.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace lazykv::grammar {
namespace {

using Kind = SchemaNode::Kind;

enum FrameKind : uint8_t { kDocument, kValue, kObject, kKey, kArray, kString, kNumber, kLiteral };

// Document: kOpen until its value is complete, then kSuffix while the
// schema's suffix is being matched (count: bytes of it so far), then kDone.
// Object: kOpen, kBeforeKey (after ','), kAfterKey, kBeforeValue (after ':'), kAfterValue.
// Array: kOpen, kBeforeValue (after ','), kAfterValue.
enum : uint8_t { kOpen, kDone, kBeforeKey, kAfterKey, kBeforeValue, kAfterValue, kSuffix };
// String and key text.
enum : uint8_t { kBody, kEscape, kHex1, kHex2, kHex3, kHex4 };
// Number.
enum : uint8_t { kStart, kSign, kZero, kInt, kDot, kFrac, kExp, kExpSign, kExpDigits };

constexpr uint8_t kNegative = 1;   // number flag
constexpr uint8_t kDiverged = 1;   // key flag: no known key has this prefix (an additional key)
constexpr uint8_t kSurrogate = 2;  // string and key flag: a \u escape began with d

bool is_ws(uint8_t b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
bool is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

// Consumes a whitespace byte of the current gap. True when `b` was
// whitespace (accepted or over the limit), so the caller is done with it.
bool gap(Frame& f, uint8_t b, bool& accepted) {
  if (!is_ws(b)) {
    f.ws = 0;
    return false;
  }
  accepted = f.ws < kMaxGap;
  if (accepted) ++f.ws;
  return true;
}

void emit(const std::vector<Frame>& st, MatchState& out) {
  out.frames.insert(out.frames.end(), st.begin(), st.end());
  out.ends.push_back(uint32_t(out.frames.size()));
}

enum class TextStep { kTaken, kClosed, kRefused };

// The second byte of a sequence, narrower after some leads: no overlong
// forms (E0, F0), no surrogates (ED), nothing past U+10FFFF (F4).
bool first_continuation_valid(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0: return b >= 0xA0;
    case 0xED: return b <= 0x9F;
    case 0xF0: return b >= 0x90;
    case 0xF4: return b <= 0x8F;
    default: return true;
  }
}

// One byte of string text (a value's or a key's): escapes, UTF-8 sequences,
// and a length limit in characters. `room`: characters it may still take.
// The count stops at `cap`, the largest count the limits tell apart, so that
// the characters of an unbounded string all leave the same state (and mask).
TextStep text_byte(Frame& f, uint8_t b, int64_t room, int64_t cap) {
  const auto count_char = [&] {
    if (f.count < cap) ++f.count;
  };
  switch (f.phase) {
    case kBody:
      if (f.lo > 0) {  // inside a UTF-8 sequence; hi: its lead byte until the first continuation
        if ((b & 0xC0) != 0x80 || (f.hi != 0 && !first_continuation_valid(uint8_t(f.hi), b))) {
          return TextStep::kRefused;
        }
        f.hi = 0;
        --f.lo;
        return TextStep::kTaken;
      }
      if (b == '"') return TextStep::kClosed;
      if (b < 0x20 || room <= 0) return TextStep::kRefused;
      if (b == '\\') {
        f.phase = kEscape;
      } else if (b >= 0x80) {
        if (b >= 0xC2 && b <= 0xDF) f.lo = 1;
        else if (b >= 0xE0 && b <= 0xEF) f.lo = 2;
        else if (b >= 0xF0 && b <= 0xF4) f.lo = 3;
        else return TextStep::kRefused;  // a continuation byte first, or never valid
        f.hi = b;
        count_char();
      } else {
        count_char();
      }
      return TextStep::kTaken;
    case kEscape:
      if (b == 'u') {
        f.phase = kHex1;
      } else if (std::strchr("\"\\/bfnrt", b) != nullptr && b != 0) {
        f.phase = kBody;
      } else {
        return TextStep::kRefused;
      }
      count_char();
      return TextStep::kTaken;
    default:  // kHex1..kHex4
      if (!is_hex(b)) return TextStep::kRefused;
      if (f.phase == kHex1 && (b == 'd' || b == 'D')) f.flags |= kSurrogate;
      if (f.phase == kHex2) {
        // \ud800-\udfff: half a character, which validators count differently.
        if ((f.flags & kSurrogate) && (b == '8' || b == '9' || !is_digit(b))) return TextStep::kRefused;
        f.flags &= uint8_t(~kSurrogate);
      }
      f.phase = f.phase == kHex4 ? uint8_t(kBody) : uint8_t(f.phase + 1);
      return TextStep::kTaken;
  }
}

// A range of reachable numbers, each end open or closed.
struct Interval {
  double lo, hi;
  bool lo_closed, hi_closed;
};

bool meets(const Interval& reach, const SchemaNode& n) {
  double lo = reach.lo, hi = reach.hi;
  bool lo_closed = reach.lo_closed, hi_closed = reach.hi_closed;
  if (n.minimum && (*n.minimum > lo || (*n.minimum == lo && n.exclusive_minimum))) {
    lo = *n.minimum;
    lo_closed = !n.exclusive_minimum;
  }
  if (n.maximum && (*n.maximum < hi || (*n.maximum == hi && n.exclusive_maximum))) {
    hi = *n.maximum;
    hi_closed = !n.exclusive_maximum;
  }
  if (n.integer) {  // the integers in [lo, hi]
    const double first = lo_closed ? std::ceil(lo) : std::floor(lo) + 1;
    const double last = hi_closed ? std::floor(hi) : std::ceil(hi) - 1;
    return first <= last;
  }
  return lo < hi || (lo == hi && lo_closed && hi_closed);
}

// The magnitudes [a, b) as signed numbers.
Interval signed_interval(double a, double b, bool negative) {
  if (!negative) return {a, b, true, false};
  return {-b, -a, false, true};
}

// The integers in [a, b] of one sign, as a closed interval.
Interval integers(double a, double b, bool negative) {
  if (!negative) return {a, b, true, true};
  return {-b, -a, true, true};
}

// Drops stacks equal to an earlier one: alternatives that reached the same state.
void drop_repeats(MatchState& s) {
  if (s.ends.size() < 2) return;
  MatchState kept;
  uint32_t begin = 0;
  for (uint32_t end : s.ends) {
    const size_t n = end - begin;
    bool repeat = false;
    uint32_t kb = 0;
    for (uint32_t ke : kept.ends) {
      repeat = repeat || (ke - kb == n && std::memcmp(&kept.frames[kb], &s.frames[begin], n * sizeof(Frame)) == 0);
      kb = ke;
    }
    if (!repeat && kept.ends.size() < kMaxStacks) {
      kept.frames.insert(kept.frames.end(), s.frames.begin() + begin, s.frames.begin() + end);
      kept.ends.push_back(uint32_t(kept.frames.size()));
    }
    begin = end;
  }
  s = std::move(kept);
}

}  // namespace

std::string MatchState::key() const {
  std::string out(reinterpret_cast<const char*>(frames.data()), frames.size() * sizeof(Frame));
  out.append(reinterpret_cast<const char*>(ends.data()), ends.size() * sizeof(uint32_t));
  return out;
}

JsonMatcher::JsonMatcher(JsonSchema schema) : schema_(std::move(schema)) {}

MatchState JsonMatcher::start() const {
  Frame document;
  document.kind = kDocument;
  document.node = schema_.root;
  MatchState state;
  state.frames.push_back(document);
  state.ends.push_back(1);
  return state;
}

void JsonMatcher::advance(const MatchState& in, uint8_t byte, MatchState& out) const {
  out.frames.clear();
  out.ends.clear();
  thread_local Stack st;
  uint32_t begin = 0;
  for (uint32_t end : in.ends) {
    st.assign(in.frames.begin() + begin, in.frames.begin() + end);
    begin = end;
    feed(st, byte, out);
  }
  drop_repeats(out);
}

bool JsonMatcher::advance(MatchState& state, std::string_view bytes) const {
  thread_local MatchState next;
  for (char c : bytes) {
    advance(state, uint8_t(c), next);
    std::swap(state, next);
    if (state.empty()) return false;
  }
  return true;
}

bool JsonMatcher::can_end(const MatchState& state) const {
  uint32_t begin = 0;
  for (uint32_t end : state.ends) {
    const Frame* st = &state.frames[begin];
    const uint32_t n = end - begin;
    begin = end;
    if (n == 1 && st[0].phase == kDone) return true;
    if (n == 2 && schema_.suffix.empty() && ((st[1].kind == kNumber && number_complete(st[1])) ||
                   (st[1].kind == kLiteral && literal_complete(st[1])))) {
      return true;
    }
  }
  return false;
}

int64_t JsonMatcher::plain_string_room(const MatchState& state) const {
  if (state.ends.size() != 1) return -1;
  const Frame& top = state.frames.back();
  if (top.phase != kBody || top.lo != 0) return -1;
  if (top.kind == kKey && (top.flags & kDiverged)) return std::numeric_limits<int64_t>::max();  // another key's text
  if (top.kind != kString) return -1;
  const SchemaNode& n = schema_.nodes[size_t(top.node)];
  return n.max_length < 0 ? std::numeric_limits<int64_t>::max() : n.max_length - top.count;
}

MatchState JsonMatcher::after_plain_char(const MatchState& state) const {
  MatchState next;
  advance(state, 'a', next);
  return next;
}

void JsonMatcher::feed(Stack& st, uint8_t b, MatchState& out) const {
  switch (st.back().kind) {
    case kDocument: {
      Frame& f = st.back();
      if (f.phase == kOpen) return push_value(st, f.node, b, out);
      if (f.phase != kSuffix || uint8_t(schema_.suffix[size_t(f.count)]) != b) return;
      if (size_t(++f.count) == schema_.suffix.size()) f.phase = kDone;
      return emit(st, out);
    }
    case kValue: return feed_value(st, b, out);
    case kObject: return feed_object(st, b, out);
    case kKey: return feed_key(st, b, out);
    case kArray: return feed_array(st, b, out);
    case kString: return feed_string(st, b, out);
    case kNumber: return feed_number(st, b, out);
    default: return feed_literal(st, b, out);
  }
}

void JsonMatcher::push_value(Stack& st, int32_t node, uint8_t b, MatchState& out) const {
  if (st.size() + 1 >= size_t(kMaxDepth)) return;  // room for the value and, in an object, a key
  Frame value;
  value.kind = kValue;
  value.node = node;
  st.push_back(value);
  feed_value(st, b, out);
}

void JsonMatcher::feed_value(Stack& st, uint8_t b, MatchState& out) const {
  const SchemaNode& n = schema_.nodes[size_t(st.back().node)];
  Frame& f = st.back();
  switch (n.kind) {
    case Kind::kAnyOf:
      for (int32_t alternative : n.alternatives) {
        Stack branch = st;
        branch.back().node = alternative;
        feed_value(branch, b, out);
      }
      return;
    case Kind::kObject:
      if (b != '{') return;
      f.kind = kObject;
      f.phase = kOpen;
      return emit(st, out);
    case Kind::kArray:
      if (b != '[') return;
      f.kind = kArray;
      f.phase = kOpen;
      return emit(st, out);
    case Kind::kString:
      if (b != '"') return;
      f.kind = kString;
      f.phase = kBody;
      return emit(st, out);
    case Kind::kNumber:
      f.kind = kNumber;
      f.phase = kStart;
      return feed_number(st, b, out);
    case Kind::kLiterals:
      f.kind = kLiteral;
      f.lo = 0;
      f.hi = int32_t(n.literals.size());
      return feed_literal(st, b, out);
  }
}

void JsonMatcher::complete(Stack& st) const {
  st.pop_back();
  Frame& parent = st.back();
  switch (parent.kind) {
    case kDocument: parent.phase = schema_.suffix.empty() ? kDone : kSuffix; break;
    case kArray: ++parent.count; [[fallthrough]];
    default: parent.phase = kAfterValue; break;
  }
}

void JsonMatcher::feed_object(Stack& st, uint8_t b, MatchState& out) const {
  Frame& f = st.back();
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  bool accepted = false;
  if (gap(f, b, accepted)) {
    if (accepted) emit(st, out);
    return;
  }
  const uint64_t all = n.keys.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.keys.size()) - 1;
  const bool key_left = n.additional >= 0 || (f.seen & all) != all;
  const bool may_close = (f.seen & n.required) == n.required;
  switch (f.phase) {
    case kOpen:
    case kBeforeKey:
      if (b == '"' && key_left && st.size() + 1 < size_t(kMaxDepth)) {  // room for the key's value
        Frame key;
        key.kind = kKey;
        key.node = f.node;
        key.hi = int32_t(n.keys.size());
        if (n.keys.empty()) key.flags = kDiverged;
        st.push_back(key);
        return emit(st, out);
      }
      if (b == '}' && f.phase == kOpen && may_close) {
        complete(st);
        return emit(st, out);
      }
      return;
    case kAfterKey:
      if (b != ':') return;
      f.phase = kBeforeValue;
      return emit(st, out);
    case kBeforeValue: {
      const int32_t node = f.count >= 0 ? n.key_nodes[size_t(f.count)] : n.additional;
      return push_value(st, node, b, out);
    }
    default:  // kAfterValue
      if (b == ',' && key_left) {
        f.phase = kBeforeKey;
        return emit(st, out);
      }
      if (b == '}' && may_close) {
        complete(st);
        return emit(st, out);
      }
      return;
  }
}

void JsonMatcher::feed_key(Stack& st, uint8_t b, MatchState& out) const {
  Frame& f = st.back();
  const Frame& object = st[st.size() - 2];
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  const auto unseen = [&](int32_t i) { return !(object.seen >> i & 1); };
  if (!(f.flags & kDiverged)) {
    // The known keys that go on with b: a contiguous run of the sorted keys.
    // (Keys are escaped text: a quote goes on a key only after a backslash.)
    int32_t lo = f.lo, hi = f.hi;
    const size_t at = size_t(f.count);
    while (lo < hi && (n.keys[size_t(lo)].size() <= at || uint8_t(n.keys[size_t(lo)][at]) < b)) ++lo;
    int32_t end = lo;
    while (end < hi && n.keys[size_t(end)].size() > at && uint8_t(n.keys[size_t(end)][at]) == b) ++end;
    bool live = false;
    for (int32_t i = lo; i < end && !live; ++i) live = unseen(i);
    if (live || (lo < end && n.additional >= 0)) {
      f.lo = lo;
      f.hi = end;
      ++f.count;
      return emit(st, out);
    }
    if (b == '"') {
      const bool exact = f.lo < f.hi && n.keys[size_t(f.lo)].size() == size_t(f.count);
      if (exact && !unseen(f.lo)) return;  // a key given twice
      if (!exact && n.additional < 0) return;
      const int32_t property = exact ? f.lo : -1;
      st.pop_back();
      Frame& parent = st.back();
      parent.count = property;
      if (property >= 0) parent.seen |= uint64_t(1) << property;
      parent.phase = kAfterKey;
      return emit(st, out);
    }
    if (n.additional < 0) return;
    // Leaving a known key inside one of its escapes would lose the escape's
    // state: refused (this costs only keys that have escapes).
    if (f.count > 0 && n.keys[size_t(f.lo)].find('\\') < size_t(f.count)) return;
    // From here on any key text; what came before was plain text.
    f.flags |= kDiverged;
    f.lo = f.hi = 0;
  }
  // An escape could spell a known key another way (\u0061 for a), which
  // would then escape its schema: other keys are written plainly.
  if (b == '\\' && f.phase == kBody && f.lo == 0) return;
  switch (text_byte(f, b, std::numeric_limits<int64_t>::max(), 0)) {
    case TextStep::kTaken: return emit(st, out);
    case TextStep::kClosed: {
      st.pop_back();
      Frame& parent = st.back();
      parent.count = -1;
      parent.phase = kAfterKey;
      return emit(st, out);
    }
    case TextStep::kRefused: return;
  }
}

void JsonMatcher::feed_array(Stack& st, uint8_t b, MatchState& out) const {
  Frame& f = st.back();
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  bool accepted = false;
  if (gap(f, b, accepted)) {
    if (accepted) emit(st, out);
    return;
  }
  const bool may_close = f.count >= n.min_items;
  const bool item_left = n.max_items < 0 || f.count < n.max_items;
  switch (f.phase) {
    case kOpen:
      if (b == ']') {
        if (!may_close) return;
        complete(st);
        return emit(st, out);
      }
      if (item_left) push_value(st, n.items, b, out);
      return;
    case kBeforeValue:
      return push_value(st, n.items, b, out);
    default:  // kAfterValue
      if (b == ',' && item_left) {
        f.phase = kBeforeValue;
        return emit(st, out);
      }
      if (b == ']' && may_close) {
        complete(st);
        return emit(st, out);
      }
      return;
  }
}

void JsonMatcher::feed_string(Stack& st, uint8_t b, MatchState& out) const {
  Frame& f = st.back();
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  const int64_t room = n.max_length < 0 ? std::numeric_limits<int64_t>::max() : n.max_length - f.count;
  switch (text_byte(f, b, room, std::max(n.min_length, n.max_length))) {
    case TextStep::kTaken: return emit(st, out);
    case TextStep::kClosed:
      if (f.count < n.min_length) return;
      complete(st);
      return emit(st, out);
    case TextStep::kRefused: return;
  }
}

void JsonMatcher::feed_number(Stack& st, uint8_t b, MatchState& out) const {
  Frame& f = st.back();
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  const bool ranged = n.minimum || n.maximum;
  const bool exponent_allowed = !n.integer && !ranged;
  // A digit: its value joins the mantissa (seen), counted in lo.
  const auto digit = [&] {
    f.seen = f.seen * 10 + uint64_t(b - '0');
    ++f.lo;
  };
  bool taken = true;
  switch (f.phase) {
    case kStart:
      if (b == '-') {
        f.flags |= kNegative;
        f.phase = kSign;
        break;
      }
      [[fallthrough]];
    case kSign:
      if (!is_digit(b)) return;
      f.phase = b == '0' ? kZero : kInt;
      digit();
      break;
    case kZero:
    case kInt:
      if (f.phase == kInt && is_digit(b)) {
        digit();
      } else if (b == '.' && !n.integer) {
        f.phase = kDot;
      } else if ((b == 'e' || b == 'E') && exponent_allowed) {
        f.phase = kExp;
      } else {
        taken = false;
      }
      break;
    case kDot:
    case kFrac:
      if (is_digit(b)) {
        digit();
        ++f.digits;
        f.phase = kFrac;
      } else if (f.phase == kFrac && (b == 'e' || b == 'E') && exponent_allowed) {
        f.phase = kExp;
      } else {
        taken = false;
      }
      break;
    case kExp:
      if (b == '+' || b == '-') f.phase = kExpSign;
      else if (is_digit(b)) f.phase = kExpDigits;
      else taken = false;
      break;
    case kExpSign:
    case kExpDigits:
      if (!is_digit(b)) taken = false;
      else f.phase = kExpDigits;
      break;
  }
  if (taken) {
    ++f.count;
    const bool whole = f.phase == kZero || f.phase == kInt || f.phase == kFrac || f.phase == kExpDigits;
    // Past the byte limit, or at it without a whole number ("1." needs a digit more).
    if (f.count > kMaxNumberBytes || (f.count == kMaxNumberBytes && !whole)) return;
    if (ranged && (f.lo > kMaxRangedDigits || !number_viable(f))) return;
    return emit(st, out);
  }
  // Not part of the number: it ends here if it is whole, and b goes to the parent.
  if (!number_complete(f)) return;
  complete(st);
  feed(st, b, out);
}

namespace {

// mantissa / 10^fraction_digits as the double a JSON parser reads from the
// same digits (correctly rounded), so that a bound compares as a validator
// compares it.
double decimal(uint64_t mantissa, int fraction_digits) {
  char text[48];
  std::snprintf(text, sizeof(text), "%llue%d", static_cast<unsigned long long>(mantissa), -fraction_digits);
  return std::strtod(text, nullptr);
}

}  // namespace

bool JsonMatcher::number_viable(const Frame& f) const {
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  const bool negative = f.flags & kNegative;
  const int bytes = kMaxNumberBytes - f.count, digits = kMaxRangedDigits - f.lo;  // what it may still take
  // Whether k more integer digits, then a fraction ('.' and a digit), still fit.
  const auto fraction_fits = [&](int k) { return !n.integer && k + 2 <= bytes && k + 1 <= digits; };
  switch (f.phase) {
    case kSign: return meets(signed_interval(0, std::pow(10.0, std::min(bytes, digits)), negative), n);
    case kZero: return meets(fraction_fits(0) ? signed_interval(0, 1, negative) : integers(0, 0, false), n);
    case kInt:
      // k more integer digits reach [v 10^k, (v+1) 10^k): all of it with
      // room for a fraction, its integers without.
      for (int k = 0; k <= std::min(bytes, digits); ++k) {
        const double a = decimal(f.seen, -k), b = decimal(f.seen + 1, -k);
        const Interval reach = fraction_fits(k) ? signed_interval(a, b, negative) : integers(a, b - 1, negative);
        if (meets(reach, n)) return true;
      }
      return false;
    case kDot:
    case kFrac: {
      // More fraction digits reach [v, v + 10^-digits); v itself if it stops here.
      if (f.phase == kFrac && number_complete(f)) return true;
      return bytes > 0 && digits > 0 &&
             meets(signed_interval(decimal(f.seen, f.digits), decimal(f.seen + 1, f.digits), negative), n);
    }
    default: return true;  // exponents only without a range
  }
}

bool JsonMatcher::number_complete(const Frame& f) const {
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  if (f.phase != kZero && f.phase != kInt && f.phase != kFrac && f.phase != kExpDigits) return false;
  if (!n.minimum && !n.maximum) return true;
  const double v = decimal(f.seen, f.digits);
  return meets({f.flags & kNegative ? -v : v, f.flags & kNegative ? -v : v, true, true}, n);
}

bool JsonMatcher::literal_complete(const Frame& f) const {
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  return f.lo < f.hi && n.literals[size_t(f.lo)].size() == size_t(f.count);
}

void JsonMatcher::feed_literal(Stack& st, uint8_t b, MatchState& out) const {
  Frame& f = st.back();
  const SchemaNode& n = schema_.nodes[size_t(f.node)];
  const size_t at = size_t(f.count);
  int32_t lo = f.lo;
  while (lo < f.hi && (n.literals[size_t(lo)].size() <= at || uint8_t(n.literals[size_t(lo)][at]) < b)) ++lo;
  int32_t end = lo;
  while (end < f.hi && n.literals[size_t(end)].size() > at && uint8_t(n.literals[size_t(end)][at]) == b) ++end;
  if (lo < end) {
    f.lo = lo;
    f.hi = end;
    ++f.count;
    return emit(st, out);
  }
  // No literal goes on with b: one that is whole ends here, and b goes to the parent.
  if (!literal_complete(f)) return;
  complete(st);
  feed(st, b, out);
}

}  // namespace lazykv::grammar
