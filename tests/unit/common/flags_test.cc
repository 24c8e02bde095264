// Flags: values checked before they are used, with errors that name the flag.
#include "common/flags.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace lazykv {
namespace {

std::string error_of(const auto& call) {
  try {
    call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.what();
  }
  return "no error";
}

TEST(Flags, RangedIntegersAreCheckedBeforeAnyCast) {
  Flags flags("test");
  flags.add("max-prefill-tokens", "512", "").add("port", "8000", "");
  flags.parse({"--max-prefill-tokens", "4294967296", "--port", "-1"});
  // 2^32 would wrap to 0 as an int32: refused, not cast.
  EXPECT_EQ(error_of([&] { flags.get_int_in("max-prefill-tokens", 1, 2147483647); }),
            "--max-prefill-tokens must be between 1 and 2147483647, got 4294967296");
  EXPECT_EQ(error_of([&] { flags.get_int_in("port", 0, 65535); }), "--port must be between 0 and 65535, got -1");
  EXPECT_EQ(flags.get_int_in("port", -1, 65535), -1);
}

TEST(Flags, NonIntegersAreNamed) {
  Flags flags("test");
  flags.add("max-batch", "32", "");
  flags.parse({"--max-batch", "12x"});
  EXPECT_EQ(error_of([&] { flags.get_int_in("max-batch", 1, 100); }), "--max-batch expects an integer, got '12x'");
}

}  // namespace
}  // namespace lazykv
