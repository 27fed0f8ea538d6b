// What a push chunk says of itself, checked without a job: each malformed chunk is refused with
// the code and the field at fault.
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ps.pb.h"
#include "server/validate.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::PushChunk Chunk(uint32_t worker = 0, int64_t step = 0) {
  v1::PushChunk c;
  c.mutable_tag()->set_worker(worker);
  c.mutable_tag()->set_step(step);
  c.mutable_slice()->set_table("w");
  return c;
}

void ExpectRefused(const absl::Status& st, absl::StatusCode code, const std::string& field) {
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(field)) << st;
}

TEST(ValidatePushTest, TheTagNamesARankOfTheJobAndAValidStep) {
  EXPECT_TRUE(ValidatePushTag(Chunk(1, 5), "j", 2).ok());
  ExpectRefused(ValidatePushTag(Chunk(2, 5), "j", 2), absl::StatusCode::kInvalidArgument,
                "tag.worker: rank 2 is outside job 'j' (2 workers)");
  ExpectRefused(ValidatePushTag(Chunk(0, -1), "j", 2), absl::StatusCode::kInvalidArgument,
                "tag.step: -1 is negative");
}

TEST(ValidatePushTest, TheEncodingIsAFloatTypeOrInt8WithSoundScales) {
  v1::PushChunk c = Chunk();
  EXPECT_TRUE(ValidatePushEncoding(c, 400, 1 << 20).ok());
  ExpectRefused(ValidatePushEncoding(c, 2 << 20, 1 << 20),
                absl::StatusCode::kResourceExhausted, "values: 2097152 bytes exceed the limit");
  c.set_dtype(v1::DT_UINT64);
  ExpectRefused(ValidatePushEncoding(c, 8, 1 << 20), absl::StatusCode::kInvalidArgument,
                "dtype: values must be float32");
  c.set_dtype(v1::DT_INT8);
  ExpectRefused(ValidatePushEncoding(c, 8, 1 << 20), absl::StatusCode::kInvalidArgument,
                "scale_group: an int8 push needs scales");
  c.set_scale_group(4);
  ExpectRefused(ValidatePushEncoding(c, 8, 1 << 20), absl::StatusCode::kInvalidArgument,
                "scales: 0 bytes do not hold one float32 per group of 4 of the 8 int8 values");
  float scales[2] = {0.5f, -1.f};
  c.set_scales(std::string(reinterpret_cast<const char*>(scales), sizeof(scales)));
  ExpectRefused(ValidatePushEncoding(c, 8, 1 << 20), absl::StatusCode::kInvalidArgument,
                "scales: group 1's scale -1 is not a finite number >= 0");
  scales[1] = 2.f;
  c.set_scales(std::string(reinterpret_cast<const char*>(scales), sizeof(scales)));
  EXPECT_TRUE(ValidatePushEncoding(c, 8, 1 << 20).ok());
  c.mutable_slice()->set_keys(std::string(8, '\0'));  // One key.
  ExpectRefused(ValidatePushEncoding(c, 8, 1 << 20), absl::StatusCode::kInvalidArgument,
                "dtype: int8 pushes apply to dense blocks only");
  v1::PushChunk f = Chunk();
  f.set_scale_group(4);
  ExpectRefused(ValidatePushEncoding(f, 8, 1 << 20), absl::StatusCode::kInvalidArgument,
                "scales: set only on int8 pushes");
  v1::PushChunk no_table = Chunk();
  no_table.mutable_slice()->clear_table();
  EXPECT_TRUE(ValidatePushEncoding(no_table, 0, 1 << 20).ok()) << "a step's end with no values";
  ExpectRefused(ValidatePushEncoding(no_table, 4, 1 << 20), absl::StatusCode::kInvalidArgument,
                "slice.table: values or pull_after without a table");
  v1::PushChunk pull = Chunk();
  pull.set_pull_after(true);
  pull.set_pull_clock(-3);
  ExpectRefused(ValidatePushEncoding(pull, 4, 1 << 20), absl::StatusCode::kInvalidArgument,
                "pull_clock: -3 is negative");
}

TEST(ValidatePushTest, TheValuesFitTheSliceInWholeRowsAndTopKIndicesInsideTheBlock) {
  uint64_t n = 0;
  v1::PushChunk c = Chunk();
  const PushTarget dense{/*dense=*/true, /*block=*/2, /*elems=*/100, /*width=*/1};
  EXPECT_TRUE(ValidatePushExtent(c, dense, v1::DT_FLOAT32, 400, &n).ok());
  EXPECT_EQ(n, 100u);
  ExpectRefused(ValidatePushExtent(c, dense, v1::DT_FLOAT32, 402, &n),
                absl::StatusCode::kInvalidArgument, "values: 402 bytes is not a whole number");
  c.set_offset(60);
  ExpectRefused(ValidatePushExtent(c, dense, v1::DT_FLOAT16, 100, &n),
                absl::StatusCode::kInvalidArgument,
                "values: 50 elements at offset 60 overrun the slice of 'w' (100 elements)");
  const PushTarget rows{/*dense=*/false, 0, /*elems=*/30, /*width=*/3};
  c.set_offset(1);
  ExpectRefused(ValidatePushExtent(c, rows, v1::DT_FLOAT32, 12, &n),
                absl::StatusCode::kInvalidArgument, "must be whole rows of width 3");
  c.set_offset(3);
  EXPECT_TRUE(ValidatePushExtent(c, rows, v1::DT_FLOAT32, 12, &n).ok());
  v1::PushChunk topk = Chunk();
  uint32_t idx[2] = {5, 100};
  topk.set_indices(std::string(reinterpret_cast<const char*>(idx), sizeof(idx)));
  ExpectRefused(ValidatePushExtent(topk, dense, v1::DT_FLOAT32, 8, &n),
                absl::StatusCode::kInvalidArgument,
                "indices: index 100 is outside block 2 (100 elements)");
  ExpectRefused(ValidatePushExtent(topk, dense, v1::DT_FLOAT32, 12, &n),
                absl::StatusCode::kInvalidArgument, "indices: 8 bytes do not hold one uint32");
  ExpectRefused(ValidatePushExtent(topk, rows, v1::DT_FLOAT32, 8, &n),
                absl::StatusCode::kInvalidArgument, "indices: top-k indices apply to dense");
  idx[1] = 99;
  topk.set_indices(std::string(reinterpret_cast<const char*>(idx), sizeof(idx)));
  EXPECT_TRUE(ValidatePushExtent(topk, dense, v1::DT_FLOAT32, 8, &n).ok());
  topk.set_offset(4);
  ExpectRefused(ValidatePushExtent(topk, dense, v1::DT_FLOAT32, 8, &n),
                absl::StatusCode::kInvalidArgument, "offset: must be 0 for a top-k push");
}

}  // namespace
}  // namespace pscluster
