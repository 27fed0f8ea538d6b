#include "common/status_convert.h"

#include <gtest/gtest.h>

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

TEST(StatusConvertTest, OutOfRangeCodeBecomesUnknown) {
  grpc::Status g(static_cast<grpc::StatusCode>(99), "weird");
  absl::Status s = FromGrpcStatus(g);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(s.message(), "weird");
}

TEST(StatusConvertTest, ContextPrefixesTheMessage) {
  absl::Status s = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"),
                                  "Pull to 127.0.0.1:1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "Pull to 127.0.0.1:1: connection refused");
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "x").ok());
}

}  // namespace
}  // namespace pscluster
