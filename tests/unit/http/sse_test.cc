#include "coordinator/http/sse.h"

#include <gtest/gtest.h>

namespace lazykv::http {
namespace {

TEST(SseTest, OneLineEvent) { EXPECT_EQ(sse_event("{\"a\":1}"), "data: {\"a\":1}\n\n"); }

TEST(SseTest, DoneAndEmpty) {
  EXPECT_EQ(sse_event("[DONE]"), "data: [DONE]\n\n");
  EXPECT_EQ(sse_event(""), "data: \n\n");
}

TEST(SseTest, EveryLineGetsItsOwnDataField) {
  EXPECT_EQ(sse_event("a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(sse_event("a\r\nb\rc"), "data: a\ndata: b\ndata: c\n\n");
  EXPECT_EQ(sse_event("a\n"), "data: a\ndata: \n\n");
}

}  // namespace
}  // namespace lazykv::http
