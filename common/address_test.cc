#include "common/address.h"

#include <gtest/gtest.h>

namespace pscluster {
namespace {

TEST(AddressTest, HostOf) {
  EXPECT_EQ(HostOf("10.0.0.5:7000"), "10.0.0.5");
  EXPECT_EQ(HostOf("[::1]:7000"), "::1");
  EXPECT_EQ(HostOf("sched-host:7070"), "sched-host");
  EXPECT_EQ(HostOf("sched-host"), "sched-host");
  EXPECT_EQ(HostOf("::1"), "::1");
}

TEST(AddressTest, LoopbackAdvertisedToARemoteSchedulerIsWarnedOf) {
  // Debian's `hostname -i` gives 127.0.1.1.
  auto w = LoopbackAdvertiseWarning("127.0.1.1:7000", "10.0.0.2:7070");
  ASSERT_TRUE(w.has_value());
  EXPECT_NE(w->find("127.0.1.1:7000"), std::string::npos) << *w;
  EXPECT_NE(w->find("--advertise_host"), std::string::npos) << *w;
  EXPECT_TRUE(LoopbackAdvertiseWarning("localhost:7100", "sched-host:7070").has_value());
  EXPECT_TRUE(LoopbackAdvertiseWarning("[::1]:7100", "sched-host:7070").has_value());
  // Everything on one machine, or a routable address: nothing to say.
  EXPECT_FALSE(LoopbackAdvertiseWarning("127.0.0.1:7000", "127.0.0.1:7070").has_value());
  EXPECT_FALSE(LoopbackAdvertiseWarning("localhost:7000", "localhost:7070").has_value());
  EXPECT_FALSE(LoopbackAdvertiseWarning("10.0.0.5:7000", "10.0.0.2:7070").has_value());
}

}  // namespace
TEST(AddressTest, ASchedulerListIsJudgedByItsFirstAddress) {
  EXPECT_EQ(LoopbackAdvertiseWarning("127.0.0.1:7000", "127.0.0.1:7070,127.0.0.1:7071"),
            std::nullopt);
  EXPECT_TRUE(
      LoopbackAdvertiseWarning("127.0.0.1:7000", "10.0.0.1:7070,10.0.0.2:7070").has_value());
}

}  // namespace pscluster
