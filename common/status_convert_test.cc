#include "common/status_convert.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

TEST(StatusConvertTest, EveryCanonicalCodeRoundTrips) {
  for (int c = 0; c <= static_cast<int>(absl::StatusCode::kUnauthenticated); ++c) {
    absl::Status in(static_cast<absl::StatusCode>(c), c == 0 ? "" : "message for code");
    grpc::Status g = ToGrpcStatus(in);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    absl::Status out = FromGrpcStatus(g);
    EXPECT_EQ(out, in) << "code " << c;
  }
}

TEST(StatusConvertTest, OutOfRangeCodeFromTheWireBecomesUnknown) {
  absl::Status s = StatusFromWire(99, "weird", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "weird");
  s = StatusFromWire(0xffffffffu, "weirder", "PushPull to 127.0.0.1:1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "PushPull to 127.0.0.1:1: weirder");
  s = StatusFromWire(14, "gone", "PushPull to 127.0.0.1:1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "PushPull to 127.0.0.1:1: gone");
  EXPECT_TRUE(StatusFromWire(0, "", "x").ok());
}

TEST(StatusConvertTest, ContextPrefixesTheMessage) {
  absl::Status s = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"),
                                  "Pull to 127.0.0.1:1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "Pull to 127.0.0.1:1: connection refused");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "x").ok());
}

}  // namespace
TEST(StatusConvertTest, LongMessagesAreCutInTheMiddleOnACharacterBoundary) {
  // What a 1 MiB job name in a job file would give.
  const std::string name(1 << 20, 'n');
  absl::Status st = absl::InvalidArgumentError(
      absl::StrCat("job.yaml:1: name: must be 1-64 characters (got '", name, "\xc3\xa9')"));
  grpc::Status g = ToGrpcStatus(st);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LE(g.error_message().size(), kMaxStatusMessageBytes + 64);
  EXPECT_EQ(g.error_message().rfind("job.yaml:1: name: must be 1-64 characters (got 'nnn", 0), 0u);
  EXPECT_NE(g.error_message().find("bytes cut]"), std::string::npos);
  EXPECT_EQ(g.error_message().substr(g.error_message().size() - 5), "n\xc3\xa9')");
  // A cut never splits a character: every byte of a 2-byte character stays with its partner.
  std::string accents;
  for (int i = 0; i < 2000; ++i) accents += "\xc3\xa9";
  std::string cut = BoundedStatusMessage(accents);
  EXPECT_LT(cut.size(), accents.size());
  const size_t marker = cut.find(" ... [");
  ASSERT_NE(marker, std::string::npos);
  EXPECT_EQ(marker % 2, 0u);
  EXPECT_EQ((cut.size() - cut.find("] ... ") - 6) % 2, 0u);
  // Short messages pass unchanged.
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError("job_id: no job 'x'")).error_message(),
            "job_id: no job 'x'");
}

}  // namespace pscluster
