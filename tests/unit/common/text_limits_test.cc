// The helpers for text and JSON from outside: quote/printable, the log
// limiter, and JSON parsed with bounded nesting.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "common/bounded_json.h"
#include "common/log_limiter.h"
#include "common/quote.h"

namespace lazykv {
namespace {

TEST(Printable, KeepsTextAndEscapesWhatCouldForgeALine) {
  EXPECT_EQ(printable("plain name_1"), "plain name_1");
  EXPECT_EQ(printable("a\nb\r\tc"), "a\\x0ab\\x0d\\x09c");
  EXPECT_EQ(printable("\x1b[31mred\x7f"), "\\x1b[31mred\\x7f");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe4\xb8\xad"), "caf\xc3\xa9 \xe4\xb8\xad");  // UTF-8 kept
  EXPECT_EQ(printable("\xc2\x9b"), "\\xc2\\x9b");                               // C1 CSI
  EXPECT_EQ(printable("x\xe2\x80\xa8y"), "x\\xe2\\x80\\xa8y");                  // line separator
  EXPECT_EQ(printable("\xe2\x80\xae" "evil"), "\\xe2\\x80\\xae" "evil");        // right-to-left override
  EXPECT_EQ(printable("\xff\xc3"), "\\xff\\xc3");                               // invalid, truncated
}

TEST(Printable, CutsAtACharacterBoundary) {
  EXPECT_EQ(printable(std::string(200, 'x'), 10), std::string(10, 'x') + "...");
  // The 2-byte character at bytes 4-5 does not fit in 5 bytes: cut before it.
  EXPECT_EQ(printable("abcd\xc3\xa9z", 5), "abcd...");
  EXPECT_EQ(printable("abcd", 4), "abcd");
  EXPECT_EQ(quote("it's"), "'it's'");
  EXPECT_EQ(quote(std::string(130, 'q')), "'" + std::string(120, 'q') + "...'");
}

TEST(LogLimiterTest, BurstThenSuppressedThenCounted) {
  std::vector<std::string> lines;
  LogLimiter limiter("test line", 3, std::chrono::milliseconds(200),
                     [&](std::string_view line) { lines.emplace_back(line); });
  for (int i = 0; i < 10; ++i) limiter.write("line " + std::to_string(i));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2], "line 2");
  EXPECT_EQ(limiter.suppressed(), 7u);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  limiter.write("later");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[3], "lazykv: 7 more 'test line' log lines were suppressed (at most 3 per 200 ms)");
  EXPECT_EQ(lines[4], "later");
}

TEST(BoundedJson, RefusesDeepNestingWhileParsingWhereverItIs) {
  const auto deep = [](int levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  EXPECT_NO_THROW(parse_bounded_json(deep(64)));
  EXPECT_THROW(parse_bounded_json(deep(65)), JsonLimitError);
  // In a first member (the copy that crashed the server recursed there).
  EXPECT_THROW(parse_bounded_json<nlohmann::ordered_json>("{\"a\":" + deep(200000) + ",\"b\":1}"), JsonLimitError);
  std::string objects;
  for (int i = 0; i < 100; ++i) objects += "{\"a\":";
  objects += "1" + std::string(100, '}');
  EXPECT_THROW(parse_bounded_json(objects), JsonLimitError);
  EXPECT_NO_THROW(parse_bounded_json(objects, 100));
  try {
    parse_bounded_json(deep(10), 4);
    FAIL();
  } catch (const JsonLimitError& e) {
    EXPECT_STREQ(e.what(), "JSON nested deeper than 4 levels");
  }
  EXPECT_THROW(parse_bounded_json("[1, 2]", 64, 3), JsonLimitError);
  EXPECT_THROW(parse_bounded_json("[1,"), nlohmann::json::parse_error);
}

TEST(BoundedJson, EventHookSeesEveryEvent) {
  int keys = 0;
  const JsonEventHook<nlohmann::json> hook = [&](int, nlohmann::json::parse_event_t event, nlohmann::json&) {
    keys += event == nlohmann::json::parse_event_t::key;
  };
  const nlohmann::json value = parse_bounded_json<nlohmann::json>(R"({"a": {"b": 1, "c": [2]}})", 8, 1 << 20, hook);
  EXPECT_EQ(keys, 3);
  EXPECT_EQ(value["a"]["c"][0], 2);
}

}  // namespace
}  // namespace lazykv
