#include "worker/data/line_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/test_files.h"

namespace pscluster::data {
namespace {

using testing::NewTempDir;
using testing::SplitLines;
using testing::WriteGzip;
using testing::WriteText;

// Random text: lines of 0 to 200 bytes (some very short, some CRLF), ending with or without a
// newline.
std::string RandomText(std::mt19937_64& rng, size_t lines) {
  std::string text;
  for (size_t i = 0; i < lines; ++i) {
    const size_t len = rng() % 8 == 0 ? rng() % 3 : rng() % 200;
    for (size_t j = 0; j < len; ++j) text.push_back(static_cast<char>('a' + rng() % 26));
    if (rng() % 10 == 0) text.push_back('\r');
    if (i + 1 < lines || rng() % 2 == 0) text.push_back('\n');
  }
  return text;
}

struct Read {
  std::vector<std::string> lines;
  std::vector<uint64_t> offsets;
  absl::Status status;
};

Read ReadChunk(FileSystem* fs, const DataFile& info, uint64_t begin, uint64_t end,
               LineReaderOptions opts) {
  Read r;
  auto file = fs->Open(info.path);
  if (!file.ok()) {
    r.status = file.status();
    return r;
  }
  LineReader lines(file->get(), info, begin, end, opts);
  absl::string_view line;
  while (lines.Next(&line)) {
    r.lines.emplace_back(lines.line_too_long() ? "<too long>" : std::string(line));
    r.offsets.push_back(lines.line_offset());
  }
  r.status = lines.status();
  return r;
}

// Any cut of a file into byte ranges reads each line exactly once, in order, whatever the
// buffer size.
TEST(LineReaderTest, ByteRangesCutAnywhereReadEveryLineOnce) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("ranges");
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const std::string text = RandomText(rng, 1 + rng() % 300);
    const std::string path = absl::StrCat(dir, "/f", trial);
    WriteText(path, text);
    const DataFile info{path, text.size(), false};
    const int cuts = 1 + static_cast<int>(rng() % 12);
    std::vector<uint64_t> at = {0, text.size()};
    for (int c = 0; c < cuts; ++c) at.push_back(rng() % (text.size() + 1));
    if (trial % 3 == 0) {  // Cuts right after newlines and at line starts, the edge cases.
      for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\n' && rng() % 4 == 0) at.push_back(i + (rng() % 2));
      }
    }
    std::sort(at.begin(), at.end());
    LineReaderOptions opts;
    opts.block_bytes = 1 + rng() % 300;  // Lines across buffer refills.
    opts.max_line_bytes = 256;
    std::vector<std::string> got;
    for (size_t i = 0; i + 1 < at.size(); ++i) {
      Read r = ReadChunk(fs.get(), info, at[i], at[i + 1], opts);
      ASSERT_TRUE(r.status.ok()) << r.status;
      for (size_t k = 0; k < r.lines.size(); ++k) {
        // Each line starts inside its range, right after a newline or at the file's start.
        EXPECT_GE(r.offsets[k], at[i]);
        EXPECT_LT(r.offsets[k], at[i + 1]);
        EXPECT_TRUE(r.offsets[k] == 0 || text[r.offsets[k] - 1] == '\n');
      }
      got.insert(got.end(), r.lines.begin(), r.lines.end());
    }
    ASSERT_EQ(got, SplitLines(text)) << "trial " << trial;
  }
}

TEST(LineReaderTest, GzipFilesAreReadWholeAcrossMembers) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("gzip");
  std::mt19937_64 rng(5);
  for (int members : {1, 3}) {
    const std::string text = RandomText(rng, 5000);
    const std::string path = absl::StrCat(dir, "/g", members, ".gz");
    WriteGzip(path, text, members);
    auto st = fs->Stat(path);
    ASSERT_TRUE(st.ok());
    LineReaderOptions opts;
    opts.block_bytes = 4096;
    Read r = ReadChunk(fs.get(), {path, st->size, true}, 0, st->size, opts);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.lines, SplitLines(text));
    // Offsets are in the decompressed text.
    for (size_t k = 1; k < r.offsets.size(); ++k) EXPECT_EQ(text[r.offsets[k] - 1], '\n');
  }
}

TEST(LineReaderTest, BrokenGzipIsDataLossNamingTheFile) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("badgz");
  std::mt19937_64 rng(6);
  const std::string text = RandomText(rng, 3000);
  const std::string good = dir + "/good.gz";
  WriteGzip(good, text);
  auto bytes = fs->Open(good);
  ASSERT_TRUE(bytes.ok());
  auto st = fs->Stat(good);
  std::string raw(st->size, '\0');
  ASSERT_TRUE((*bytes)->Read(0, raw.size(), raw.data()).ok());

  const std::string truncated = dir + "/truncated.gz";
  WriteText(truncated, raw.substr(0, raw.size() / 2));
  Read r = ReadChunk(fs.get(), {truncated, raw.size() / 2, true}, 0, raw.size() / 2, {});
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.status.message(), truncated + ": truncated gzip data");
  EXPECT_LT(r.lines.size(), SplitLines(text).size());

  std::string damaged = raw;
  for (size_t i = 20; i < 60; ++i) damaged[i] = static_cast<char>(~damaged[i]);
  const std::string corrupt = dir + "/corrupt.gz";
  WriteText(corrupt, damaged);
  r = ReadChunk(fs.get(), {corrupt, raw.size(), true}, 0, raw.size(), {});
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(r.status.message().substr(0, corrupt.size() + 21), corrupt + ": corrupt gzip data (");
}

// A line longer than the limit is passed over (never held whole) and flagged; the lines after
// it are read.
TEST(LineReaderTest, OverlongLinesAreFlaggedAndPassedOver) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("long");
  const std::string text = "short\n" + std::string(5000, 'x') + "\nafter\n" +
                           std::string(300, 'y') + "\nlast" + std::string(400, 'z');
  const std::string path = dir + "/f";
  WriteText(path, text);
  LineReaderOptions opts;
  opts.max_line_bytes = 100;
  opts.block_bytes = 64;
  Read r = ReadChunk(fs.get(), {path, text.size(), false}, 0, text.size(), opts);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.lines,
            (std::vector<std::string>{"short", "<too long>", "after", "<too long>", "<too long>"}));
  EXPECT_EQ(r.offsets[1], 6u);
  EXPECT_EQ(r.offsets[2], 5007u);
}

TEST(LineReaderTest, ReadErrorsStopTheReaderWithTheFileSystemsError) {
  auto base = NewPosixFileSystem();
  const std::string dir = NewTempDir("fault");
  std::mt19937_64 rng(8);
  const std::string text = RandomText(rng, 2000);
  const std::string path = dir + "/f";
  WriteText(path, text);
  testing::FaultyFileSystem fs(base.get(), path, text.size() / 2,
                               absl::UnavailableError(path + ": read: Input/output error"));
  LineReaderOptions opts;
  opts.block_bytes = 1024;
  Read r = ReadChunk(&fs, {path, text.size(), false}, 0, text.size(), opts);
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(r.status.message(), path + ": read: Input/output error");
  EXPECT_GT(r.lines.size(), 0u);
}

TEST(LineReaderTest, CountNewlinesGivesLineNumbers) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("count");
  const std::string text = "a\nbb\n\nccc\nd";
  WriteText(dir + "/f", text);
  auto f = fs->Open(dir + "/f");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*CountNewlines(f->get(), 0, 0), 0u);
  EXPECT_EQ(*CountNewlines(f->get(), 0, 5), 2u);  // The empty line 3 starts at 5.
  EXPECT_EQ(*CountNewlines(f->get(), 2, 11), 3u);
  EXPECT_EQ(*CountNewlines(f->get(), 0, 1000), 4u);
}

}  // namespace
}  // namespace pscluster::data
