// Byte-at-a-time recognizer of the JSON texts a compiled schema admits: a
// pushdown automaton whose stack frames are the open values (object, key,
// array, string, number, literal). anyOf keeps one stack per alternative
// still possible, so a state is a small set of stacks. A state is plain
// data: cheap to copy, comparable byte for byte, and usable as a cache key
// (token_constraint.h caches masks by it).
//
// The language is JSON without leading or trailing whitespace, with at most
// kMaxGap whitespace bytes between tokens, numbers of at most kMaxNumberBytes
// bytes, strings of valid UTF-8 (surrogate \u escapes refused, so that a
// string's length in characters is what a validator counts) and values
// nested at most kMaxDepth deep: limits that make every admitted prefix
// finish within a bounded number of bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/grammar/json_schema.h"

namespace lazykv::grammar {

inline constexpr int kMaxGap = 32;
inline constexpr int kMaxNumberBytes = 24;
inline constexpr int kMaxRangedDigits = 17;  // digits of a number whose range is checked (its mantissa is exact)
inline constexpr int kMaxDepth = 32;
inline constexpr size_t kMaxStacks = 64;  // alternatives kept alive at once (more are dropped, never admitted wrongly)

struct Frame {
  uint64_t seen = 0;   // object: bit i set once keys[i] was given; number: its digits as an integer
  int32_t node = -1;   // the schema node (key: its object's node)
  int32_t count = 0;   // items / characters / bytes / current property, by kind
  int32_t lo = 0;      // literal and key: first candidate; string: continuation bytes owed; number: digits
  int32_t hi = 0;      // literal and key: one past the last candidate; string: a sequence's lead byte
  int32_t digits = 0;  // number: fraction digits
  uint8_t kind = 0;
  uint8_t phase = 0;
  uint8_t ws = 0;      // whitespace bytes in the current gap
  uint8_t flags = 0;
};
static_assert(sizeof(Frame) == 32, "frames are compared and hashed as bytes: no padding");

struct MatchState {
  std::vector<Frame> frames;    // the stacks, bottom first, back to back
  std::vector<uint32_t> ends;   // one past each stack's top frame
  bool empty() const { return ends.empty(); }
  // The state's bytes (a cache key).
  std::string key() const;
};

class JsonMatcher {
 public:
  explicit JsonMatcher(JsonSchema schema);

  MatchState start() const;
  // The state after `byte`; empty when no stack accepts it.
  void advance(const MatchState& in, uint8_t byte, MatchState& out) const;
  // Feeds `bytes` in place; false (and the state left empty) on the first refused byte.
  bool advance(MatchState& state, std::string_view bytes) const;
  // Whether the text so far is a complete value of the schema.
  bool can_end(const MatchState& state) const;
  // The characters the current string may still take, when the state is a
  // single stack inside a string's plain text (a value's, or a key's that is
  // none of the known keys; no escape, no partial UTF-8 sequence); -1 otherwise. INT64_MAX: unbounded. Plain bytes then only
  // count characters, which lets a mask admit such tokens without a walk.
  int64_t plain_string_room(const MatchState& state) const;
  // The state after one more plain character, where plain_string_room > 0.
  MatchState after_plain_char(const MatchState& state) const;


 private:
  using Stack = std::vector<Frame>;
  void feed(Stack& st, uint8_t b, MatchState& out) const;
  void feed_value(Stack& st, uint8_t b, MatchState& out) const;
  void feed_object(Stack& st, uint8_t b, MatchState& out) const;
  void feed_key(Stack& st, uint8_t b, MatchState& out) const;
  void feed_array(Stack& st, uint8_t b, MatchState& out) const;
  void feed_string(Stack& st, uint8_t b, MatchState& out) const;
  void feed_number(Stack& st, uint8_t b, MatchState& out) const;
  void feed_literal(Stack& st, uint8_t b, MatchState& out) const;
  void push_value(Stack& st, int32_t node, uint8_t b, MatchState& out) const;
  // Pops the completed top value and moves its parent on.
  void complete(Stack& st) const;
  bool number_viable(const Frame& f) const;
  bool number_complete(const Frame& f) const;
  bool literal_complete(const Frame& f) const;

  JsonSchema schema_;
};

}  // namespace lazykv::grammar
