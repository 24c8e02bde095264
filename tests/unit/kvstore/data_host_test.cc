// Where a client reaches the kvstore's UCX data plane (data_host_for).
#include <gtest/gtest.h>

#include "common/host_port.h"
#include "kvstore/client/kvstore_client.h"

namespace lazykv::kvstore {
namespace {

TEST(DataHost, ABoundAddressIsUsedAsAdvertised) {
  EXPECT_EQ(data_host_for("kvstore:7100", "10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(data_host_for("127.0.0.1:7100", "127.0.0.1"), "127.0.0.1");
}

TEST(DataHost, AWildcardIsReachedWhereTheControlPlaneAnswered) {
  EXPECT_EQ(data_host_for("10.0.0.7:7100", "0.0.0.0"), "10.0.0.7");
  EXPECT_EQ(data_host_for("[fd00::7]:7100", "::"), "fd00::7");
  // 0.0.0.0 listens on IPv4 only: a name is resolved to its IPv4 address
  // (localhost may resolve to ::1 first).
  EXPECT_EQ(data_host_for("localhost:7100", "0.0.0.0"), "127.0.0.1");
  EXPECT_EQ(ipv4_address_of("localhost"), "127.0.0.1");
  EXPECT_EQ(ipv4_address_of("no-such-host.invalid"), "");
  // A name without an IPv4 address stays a name (UCX resolves it).
  EXPECT_EQ(data_host_for("no-such-host.invalid:7100", "0.0.0.0"), "no-such-host.invalid");
}

TEST(DataHost, AControlAddressThatIsNotHostPortKeepsTheWildcard) {
  EXPECT_EQ(data_host_for("dns:///kvstore", "0.0.0.0"), "0.0.0.0");
  EXPECT_EQ(data_host_for("dns:///kvstore:7100", "0.0.0.0"), "0.0.0.0");
  EXPECT_EQ(data_host_for("unix:/run/kvstore.sock", "0.0.0.0"), "0.0.0.0");
}

}  // namespace
}  // namespace lazykv::kvstore
