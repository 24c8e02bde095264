// HOST:PORT parsing and wildcard hosts (common/host_port.h).
#include "common/host_port.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace lazykv {
namespace {

TEST(HostPort, ParsesNamesAddressesAndBracketedV6) {
  EXPECT_EQ(parse_host_port("127.0.0.1:7100", "--listen"), (std::pair<std::string, int>{"127.0.0.1", 7100}));
  EXPECT_EQ(parse_host_port("t-lazykv-kvstore:7100", "--kvstore"), (std::pair<std::string, int>{"t-lazykv-kvstore", 7100}));
  EXPECT_EQ(parse_host_port("[::1]:0", "--listen"), (std::pair<std::string, int>{"::1", 0}));
}

TEST(HostPort, RefusesWhatIsNotHostPortNamingTheFlag) {
  for (const char* bad : {"7100", ":7100", "host:", "host:65536", "host:-1", "host:12x"}) {
    try {
      parse_host_port(bad, "--kvstore");
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("--kvstore '"), std::string::npos) << e.what();
    }
  }
}

TEST(HostPort, WildcardsAreTheBindEverywhereAddresses) {
  EXPECT_TRUE(is_wildcard_host("0.0.0.0"));
  EXPECT_TRUE(is_wildcard_host("::"));
  EXPECT_TRUE(is_wildcard_host(""));
  EXPECT_FALSE(is_wildcard_host("127.0.0.1"));
  EXPECT_FALSE(is_wildcard_host("10.0.0.7"));
  EXPECT_FALSE(is_wildcard_host("kvstore"));
}

}  // namespace
}  // namespace lazykv
