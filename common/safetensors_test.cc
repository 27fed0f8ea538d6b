#include "common/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace pscluster {
namespace {

std::string Le64(uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return s;
}

std::string FileWithHeader(const std::string& json, const std::string& data) {
  return Le64(json.size()) + json + data;
}

TEST(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  std::vector<float> w = {1.5f, -2.f, 3.25f, 0.f, 5.f, 6.f};
  std::vector<uint16_t> h = {0x3c00, 0xc000};
  std::vector<SafetensorsTensor> in = {
      {"fc1/weight", v1::DT_FLOAT32, {2, 3}, absl::string_view(reinterpret_cast<char*>(w.data()), 24)},
      {"b \"quoted\"", v1::DT_FLOAT16, {2}, absl::string_view(reinterpret_cast<char*>(h.data()), 4)},
      {"scalar", v1::DT_FLOAT32, {}, absl::string_view(reinterpret_cast<char*>(w.data()), 4)},
  };
  auto bytes = EncodeSafetensors(in, {{"format", "pt"}, {"step", "12"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  uint64_t n;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  auto f = SafetensorsFile::Parse(*bytes, "mem");
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->entries().size(), 3u);
  const auto* e = f->Find("fc1/weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, v1::DT_FLOAT32);
  EXPECT_EQ(e->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(f->Data(*e), in[0].data);
  const auto* q = f->Find("b \"quoted\"");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, v1::DT_FLOAT16);
  EXPECT_EQ(f->Data(*q), in[1].data);
  EXPECT_TRUE(f->Find("scalar")->shape.empty());
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("step"), "12");
}

// The example from the format's documentation, byte for byte as another writer produces it.
TEST(SafetensorsTest, ReadsAFileWrittenByTheReferenceLayout) {
  std::string json =
      R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{"foo":"bar"}})";
  std::string data(16, '\0');
  for (int i = 0; i < 4; ++i) data[4 * i] = static_cast<char>(i + 1);
  auto f = SafetensorsFile::Parse(FileWithHeader(json, data), "doc.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Find("test")->dtype, v1::DT_INT32);
  EXPECT_EQ(f->metadata().at("foo"), "bar");
  EXPECT_EQ(f->Data(*f->Find("test"))[8], 3);
}

TEST(SafetensorsTest, RefusesMalformedFilesNamingTheProblem) {
  auto expect_bad = [](const std::string& bytes, const std::string& needle) {
    auto f = SafetensorsFile::Parse(bytes, "bad.safetensors");
    ASSERT_FALSE(f.ok()) << needle;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find("bad.safetensors"), std::string::npos) << f.status();
    EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status();
  };
  std::string ok_json = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  expect_bad("abc", "no header length");
  expect_bad(Le64(1000) + ok_json, "exceeds the file");
  expect_bad(FileWithHeader(ok_json, std::string(4, '\0')), "outside the data section");
  expect_bad(FileWithHeader(ok_json, std::string(12, '\0')), "cover 8 bytes");
  expect_bad(FileWithHeader(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                            std::string(8, '\0')),
             "need 12");
  expect_bad(FileWithHeader(R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})",
                            std::string(8, '\0')),
             "unsupported dtype");
  expect_bad(FileWithHeader(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                            std::string(8, '\0')),
             "overlap");
  expect_bad(FileWithHeader(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})",
                            std::string(8, '\0')),
             "header JSON");
  expect_bad(FileWithHeader(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                            std::string(8, '\0')),
             "non-integer dimension");
}

TEST(SafetensorsTest, EncoderRefusesInconsistentTensors) {
  float x[2] = {1, 2};
  absl::string_view d(reinterpret_cast<char*>(x), 8);
  EXPECT_EQ(EncodeSafetensors({{"t", v1::DT_FLOAT32, {3}, d}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSafetensors({{"t", v1::DT_FLOAT32, {2}, d}, {"t", v1::DT_FLOAT32, {2}, d}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeSafetensors({{"t", v1::DT_INVALID, {2}, d}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, WritesAtomicallyAndReadsBack) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/model.safetensors";
  std::vector<float> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  auto size = WriteSafetensors(
      path, {{"w", v1::DT_FLOAT32, {10, 100}, absl::string_view(reinterpret_cast<char*>(w.data()), 4000)}});
  ASSERT_TRUE(size.ok()) << size.status();
  auto f = SafetensorsFile::Read(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Data(*f->Find("w")), absl::string_view(reinterpret_cast<char*>(w.data()), 4000));
  EXPECT_EQ(SafetensorsFile::Read(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pscluster
