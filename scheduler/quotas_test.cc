#include "scheduler/quotas.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;

TEST(QuotasTest, EachIdentityGetsItsLineElseTheDefault) {
  auto q = Quotas::Parse(R"(# identity  jobs  server_memory
alice   2   8GiB
bob     -   512MiB   # memory only
*       4   -
)",
                         "q.txt");
  ASSERT_THAT(q, IsOk());
  const Quota* alice = q->For("alice");
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->jobs, 2u);
  EXPECT_EQ(alice->server_memory, uint64_t{8} << 30);
  EXPECT_EQ(alice->line, 2);
  const Quota* bob = q->For("bob");
  ASSERT_NE(bob, nullptr);
  EXPECT_FALSE(bob->jobs.has_value());
  EXPECT_EQ(bob->server_memory, uint64_t{512} << 20);
  const Quota* carol = q->For("carol");
  ASSERT_NE(carol, nullptr);
  EXPECT_EQ(carol->jobs, 4u);
  EXPECT_FALSE(carol->server_memory.has_value());
  EXPECT_EQ(carol->line, 4);
  EXPECT_TRUE(q->limits_memory());
}

TEST(QuotasTest, WithoutADefaultOthersHaveNoQuota) {
  auto q = Quotas::Parse("alice 1 -\n", "q.txt");
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->For("bob"), nullptr);
  EXPECT_FALSE(q->limits_memory());
  auto sizes = Quotas::Parse("a - 100\nb - 3KiB\nc - 2TiB\nd 0 -\n", "q.txt");
  ASSERT_THAT(sizes, IsOk());
  EXPECT_EQ(sizes->For("a")->server_memory, 100u);
  EXPECT_EQ(sizes->For("b")->server_memory, 3072u);
  EXPECT_EQ(sizes->For("c")->server_memory, uint64_t{2} << 40);
  EXPECT_EQ(sizes->For("d")->jobs, 0u);
}

TEST(QuotasTest, MalformedLinesAreNamedByFileAndLine) {
  struct Case {
    const char* text;
    const char* error;
  } cases[] = {
      {"alice 2\n", "q.txt:1: expected 'IDENTITY JOBS SERVER_MEMORY'"},
      {"\nalice two 1GiB\n", "q.txt:2: jobs: 'two' is not a count"},
      {"alice -1 -\n", "q.txt:1: jobs: '-1'"},
      {"alice 1 1GB\n", "q.txt:1: server_memory: '1GB': not a size"},
      {"alice 1 -5\n", "q.txt:1: server_memory: '-5'"},
      {"alice 1 99999999999TiB\n", "q.txt:1: server_memory: '99999999999TiB': too large"},
      {"alice 1 -\nalice 2 -\n", "q.txt:2: identity 'alice' already has a quota on line 1"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(Quotas::Parse(c.text, "q.txt"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.error)))
        << c.text;
  }
  EXPECT_THAT(Quotas::Load("/nonexistent/quotas"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--quota_file")));
}

TEST(QuotasTest, BytesTextUsesTheLargestWholeUnit) {
  EXPECT_EQ(BytesText(uint64_t{8} << 30), "8 GiB");
  EXPECT_EQ(BytesText(1536 * 1024), "1536 KiB");
  EXPECT_EQ(BytesText(100), "100 bytes");
}

}  // namespace
}  // namespace pscluster::scheduler
