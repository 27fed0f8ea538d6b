// Enum values checked against their declarations, driven by the descriptors: nested, repeated
// and unset fields.
#include "common/validate_enums.h"

#include <gtest/gtest.h>

#include "proto/scheduler.pb.h"

namespace pscluster {
namespace {

void ExpectRefused(const google::protobuf::Message& m, const std::string& field,
                   const std::string& value) {
  absl::Status s = ValidateEnums(m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message().rfind(field + ": " + value + " is not a value of ", 0), 0u) << s;
}

TEST(ValidateEnumsTest, DeclaredValuesPass) {
  v1::SubmitJobRequest req;
  req.mutable_job()->mutable_consistency()->set_mode(v1::ConsistencySpec::SSP);
  req.mutable_job()->mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  EXPECT_TRUE(ValidateEnums(req).ok());
  EXPECT_TRUE(ValidateEnums(v1::SubmitJobRequest()).ok());
}

TEST(ValidateEnumsTest, UndeclaredValuesAreNamedByTheirPath) {
  v1::SubmitJobRequest req;
  req.mutable_job()->mutable_consistency()->set_mode(static_cast<v1::ConsistencySpec::Mode>(7));
  ExpectRefused(req, "job.consistency.mode", "7");
  req.mutable_job()->mutable_consistency()->set_mode(v1::ConsistencySpec::BSP);
  req.mutable_job()->mutable_optimizer()->set_kind(static_cast<v1::OptimizerSpec::Kind>(42));
  ExpectRefused(req, "job.optimizer.kind", "42");
  req.mutable_job()->mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  req.mutable_job()->mutable_optimizer()->set_lr_schedule(
      static_cast<v1::OptimizerSpec::Schedule>(9));
  ExpectRefused(req, "job.optimizer.lr_schedule", "9");
  absl::Status s = ValidateEnums(req);
  EXPECT_NE(s.message().find("COSINE"), std::string::npos) << "lists the declared values: " << s;
}

TEST(ValidateEnumsTest, MapValuesAndRepeatedFieldsAreCovered) {
  v1::SubmitJobRequest req;
  (*req.mutable_job()->mutable_table_optimizers())["w"].set_kind(
      static_cast<v1::OptimizerSpec::Kind>(-3));
  absl::Status s = ValidateEnums(req);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("table_optimizers[0].value.kind: -3"), std::string::npos) << s;
  v1::SubmitJobRequest ok;
  (*ok.mutable_job()->mutable_table_compression())["w"].set_transport(v1::DT_BFLOAT16);
  EXPECT_TRUE(ValidateEnums(ok).ok());
  (*ok.mutable_job()->mutable_table_compression())["w"].set_transport(
      static_cast<v1::DataType>(99));
  ExpectRefused(ok, "job.table_compression[0].value.transport", "99");
}

}  // namespace
}  // namespace pscluster
