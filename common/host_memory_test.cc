#include "common/host_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace pscluster {
namespace {

TEST(HostMemoryTest, CgroupLimitsParse) {
  EXPECT_EQ(ParseCgroupMemoryLimit("max\n"), 0u);
  EXPECT_EQ(ParseCgroupMemoryLimit("8589934592\n"), 8589934592u);
  EXPECT_EQ(ParseCgroupMemoryLimit("9223372036854771712\n"), 0u);  // v1's "no limit".
  EXPECT_EQ(ParseCgroupMemoryLimit(""), 0u);
  EXPECT_EQ(ParseCgroupMemoryLimit("lots"), 0u);
}

TEST(HostMemoryTest, IsPositiveAndAtMostThePhysicalMemory) {
  const uint64_t physical =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  const uint64_t mem = HostMemoryBytes();
  EXPECT_GT(mem, uint64_t{64} << 20);
  EXPECT_LE(mem, physical);
}

}  // namespace
}  // namespace pscluster
