// The checkpoint frame written in pieces (CheckpointWriter) is the frame written whole, and a
// file read a piece at a time (OpenCheckpointFile, VerifyCheckpoint) is checked as the bytes in
// memory are (ParseCheckpoint): the same header, the same refusals.
#include "common/checkpoint_file.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/testing/status_matchers.h"

namespace pscluster {
namespace {

std::string TempPath(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return std::string(t != nullptr ? t : "/tmp") + "/" + name;
}

v1::CheckpointHeader Header(uint64_t data_bytes) {
  v1::CheckpointHeader h;
  h.set_job_id("job");
  h.set_step(42);
  h.set_num_virtual_shards(4);
  h.set_data_bytes(data_bytes);
  return h;
}

// Data of `n` bytes, in pieces of every size from 1 byte to past the writer's 1 MiB.
std::string Data(size_t n, std::mt19937* rng) {
  std::string d(n, '\0');
  for (char& c : d) c = static_cast<char>((*rng)());
  return d;
}

TEST(CheckpointFileTest, WrittenInPiecesIsWrittenWhole) {
  std::mt19937 rng(7);
  const std::string data = Data(3 * (1 << 20) + 12345, &rng);
  std::string whole;
  AppendCheckpointHead(Header(data.size()), &whole);
  whole += data;
  const uint32_t crc = AppendCheckpointTrailer(&whole);

  std::string pieces;
  int sink_calls = 0;
  CheckpointWriter w([&](absl::string_view p) {
    ++sink_calls;
    pieces.append(p.data(), p.size());
    return absl::OkStatus();
  });
  ASSERT_TRUE(w.Head(Header(data.size())).ok());
  size_t at = 0;
  for (size_t len : {size_t{1}, size_t{7}, size_t{4096}, size_t{(1 << 20) - 3},
                     size_t{(1 << 20) + 5}, size_t{100}}) {
    ASSERT_TRUE(w.Append(absl::string_view(data).substr(at, len)).ok());
    at += len;
  }
  ASSERT_TRUE(w.Append(absl::string_view(data).substr(at)).ok());
  auto got = w.Finish();
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, crc);
  EXPECT_TRUE(pieces == whole);
  EXPECT_EQ(w.bytes(), whole.size());
  EXPECT_GE(sink_calls, 3) << "the file goes out as it is written";

  // A sink error comes back from the call that met it.
  CheckpointWriter failing([](absl::string_view) { return absl::ResourceExhaustedError("full"); });
  ASSERT_TRUE(failing.Head(Header(data.size())).ok());  // Buffered: nothing written yet.
  EXPECT_EQ(failing.Append(data).code(), absl::StatusCode::kResourceExhausted);
}

TEST(CheckpointFileTest, TheHeaderAloneIsReadFromASource) {
  std::string file;
  AppendCheckpointHead(Header(5), &file);
  file += "abcde";
  AppendCheckpointTrailer(&file);
  StringCheckpointSource good(file);
  auto h = ReadCheckpointHeader(good, "seed");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->job_id(), "job");
  EXPECT_EQ(h->step(), 42);
  std::string bad_magic = file;
  bad_magic[0] ^= 1;
  std::string long_header = file;
  long_header[8] = '\x7f';  // The header's length, past the file.
  const std::string short_file = file.substr(0, 10);
  const std::vector<const std::string*> bads = {&bad_magic, &long_header, &short_file};
  for (const std::string* bad : bads) {
    StringCheckpointSource source(*bad);
    auto r = ReadCheckpointHeader(source, "seed");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("checkpoint seed"), std::string::npos) << r.status();
  }
}

TEST(CheckpointFileTest, AFileReadInPiecesIsVerifiedAsTheBytesInMemory) {
  std::mt19937 rng(11);
  const std::string data = Data(20 * (1 << 20) + 3, &rng);  // More than two 8 MiB pieces.
  std::string good;
  AppendCheckpointHead(Header(data.size()), &good);
  good += data;
  AppendCheckpointTrailer(&good);
  const std::string path = TempPath("good.ckpt");
  ASSERT_TRUE(WriteFileAtomically(path, good).ok());
  auto source = OpenCheckpointFile(FileSystem::Default(), path);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), good.size());
  auto v = VerifyCheckpoint(**source, path);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->header.step(), 42);
  EXPECT_EQ(v->data_bytes, data.size());
  std::string scratch;
  auto tail = (*source)->Read(v->data_start + data.size() - 5, 5, &scratch);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(*tail, absl::string_view(data).substr(data.size() - 5));
  EXPECT_EQ((*source)->Read(good.size() - 2, 3, &scratch).status().code(),
            absl::StatusCode::kDataLoss);

  std::string flipped_late = good;
  flipped_late[good.size() - 100] ^= 1;  // In the last piece.
  std::string flipped_early = good;
  flipped_early[100] ^= 1;
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"flipped_late", flipped_late},
           {"flipped_early", flipped_early},
           {"truncated", good.substr(0, good.size() - 4096)},
           {"short", good.substr(0, 20)},
           {"padded", good + "x"}}) {
    const std::string p = TempPath(name + ".ckpt");
    ASSERT_TRUE(WriteFileAtomically(p, bytes).ok());
    auto in_memory = ParseCheckpoint(bytes, p);
    auto file = OpenCheckpointFile(FileSystem::Default(), p);
    ASSERT_TRUE(file.ok());
    auto streamed = VerifyCheckpoint(**file, p);
    ASSERT_FALSE(in_memory.ok()) << name;
    EXPECT_EQ(streamed.status(), in_memory.status()) << name;
  }
  EXPECT_EQ(OpenCheckpointFile(FileSystem::Default(), TempPath("missing.ckpt")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(OpenCheckpointFile(FileSystem::Default(), TempPath("")).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "a directory";
}

}  // namespace
}  // namespace pscluster
