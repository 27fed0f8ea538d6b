#include "common/audit_log.h"

#include <sys/stat.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_split.h"
#include "common/atomic_file.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;

TEST(AuditLogTest, AuditsTheMethodsThatChangeStateOnly) {
  EXPECT_TRUE(AuditedMethod("pscluster.v1.Scheduler.SubmitJob"));
  EXPECT_TRUE(AuditedMethod("pscluster.v1.Scheduler.CancelJob"));
  EXPECT_TRUE(AuditedMethod("pscluster.v1.ParameterServer.DropJob"));
  EXPECT_TRUE(AuditedMethod("pscluster.v1.WorkerControl.AssignTask"));
  EXPECT_FALSE(AuditedMethod("pscluster.v1.Scheduler.GetJob"));     // viewer: a read
  EXPECT_FALSE(AuditedMethod("pscluster.v1.Scheduler.Heartbeat"));  // node
  EXPECT_FALSE(AuditedMethod("pscluster.v1.ParameterServer.Push"));  // the data plane
  EXPECT_FALSE(AuditedMethod("pscluster.v1.Nope.Nothing"));
}

TEST(AuditLogTest, AppendsOneJsonLinePerRecordAndEscapes) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/audit.log";
  std::remove(path.c_str());
  {
    auto log = AuditLog::Open(path);
    ASSERT_THAT(log.status(), IsOk());
    AuditRecord r;
    r.time = absl::FromUnixMillis(1795000000123);
    r.method = "pscluster.v1.Scheduler.CancelJob";
    r.identity = "alice";
    r.peer = "ipv4:127.0.0.1:5000";
    r.job_id = "job-\"3\"";
    (*log)->Record(r);
    r.identity = "";
    r.job_id = "";
    r.status = absl::UnauthenticatedError("no credential\nsecond line");
    (*log)->Record(r);
  }
  {
    auto again = AuditLog::Open(path);  // Appends, never truncates.
    ASSERT_THAT(again.status(), IsOk());
    AuditRecord r;
    r.method = "m";
    (*again)->Record(r);
  }
  auto text = ReadFile(path);
  ASSERT_THAT(text.status(), IsOk());
  std::vector<std::string> lines = absl::StrSplit(*text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "{\"time\":\"2026-11-18T11:06:40.123Z\","
            "\"method\":\"pscluster.v1.Scheduler.CancelJob\","
            "\"identity\":\"alice\",\"peer\":\"ipv4:127.0.0.1:5000\",\"job_id\":\"job-\\\"3\\\"\","
            "\"code\":\"OK\"}");
  EXPECT_THAT(lines[1],
              HasSubstr("\"code\":\"UNAUTHENTICATED\",\"message\":\"no credential\\nsecond line\""));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(AuditLogTest, AFileThatCannotBeOpenedIsNamed) {
  EXPECT_THAT(AuditLog::Open("/nonexistent-dir/audit.log").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("/nonexistent-dir/audit.log")));
}

TEST(AuditCountsTest, CountsByMethodAndCodeAsMetricSamples) {
  AuditCounts counts;
  EXPECT_TRUE(counts.Samples().empty());
  counts.Count("pscluster.v1.Scheduler.CancelJob", absl::StatusCode::kPermissionDenied);
  counts.Count("pscluster.v1.Scheduler.CancelJob", absl::StatusCode::kPermissionDenied);
  counts.Count("pscluster.v1.Scheduler.SubmitJob", absl::StatusCode::kOk);
  auto samples = counts.Samples();
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(samples[0].labels, "method=\"CancelJob\",code=\"PERMISSION_DENIED\"");
  EXPECT_EQ(samples[0].value, 2);
  EXPECT_EQ(samples[1].labels, "method=\"SubmitJob\",code=\"OK\"");
  EXPECT_EQ(samples[1].value, 1);
  MetricsRegistry registry;
  registry.AddCounterCallback("audit_total", "test", [&] { return counts.Samples(); });
  EXPECT_THAT(registry.Render(),
              HasSubstr("audit_total{method=\"CancelJob\",code=\"PERMISSION_DENIED\"} 2"));
}

}  // namespace
}  // namespace pscluster
