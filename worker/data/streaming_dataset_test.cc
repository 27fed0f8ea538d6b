#include "worker/data/streaming_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/test_files.h"

namespace pscluster::data {
namespace {

using testing::NewTempDir;
using testing::ReadAll;

// LibSVM lines with ids [first, first + n): "label 1:<id> <id+2>:0.5", each line unique.
// Returns the lines; appends each example's signature to *want.
std::string LibSvmText(int first, int n, std::vector<std::string>* want) {
  std::string text;
  for (int id = first; id < first + n; ++id) {
    const int label = (id * 7) % 3 == 0 ? 1 : 0;
    absl::StrAppend(&text, label == 1 ? "+1" : "-1", " 1:", id, " ", id + 2, ":0.5\n");
    want->push_back(absl::StrCat(label, "||0:", id, ",", id + 1, ":0.5,"));
  }
  return text;
}

struct Fixture {
  std::string dir;
  std::vector<std::string> want;  // Sorted signatures of the whole set.
};

// Three files: two plain, one gzip; 3,000 examples.
Fixture LibSvmDir() {
  Fixture f;
  f.dir = NewTempDir("libsvm");
  testing::WriteText(f.dir + "/a.svm", LibSvmText(0, 1000, &f.want));
  testing::WriteGzip(f.dir + "/b.svm.gz", LibSvmText(1000, 700, &f.want), 2);
  testing::WriteText(f.dir + "/c.svm", "# a comment line\n\n" + LibSvmText(1700, 1300, &f.want));
  testing::WriteText(f.dir + "/_SUCCESS", "");
  testing::WriteText(f.dir + "/.hidden", "garbage");
  std::sort(f.want.begin(), f.want.end());
  return f;
}

DatasetOptions Options(const std::string& train) {
  DatasetOptions o;
  o.train = train;
  o.seed = 42;
  o.shuffle_window = 100;
  o.chunk_bytes = 4096;
  o.batch_examples = 64;
  o.prefetch_batches = 2;
  return o;
}

std::unique_ptr<StreamingDataset> Open(const DatasetOptions& o, FileSystem* fs) {
  auto ds = StreamingDataset::Open(o, fs);
  EXPECT_TRUE(ds.ok()) << ds.status();
  return ds.ok() ? std::move(*ds) : nullptr;
}

std::vector<std::string> Pass(const StreamingDataset& ds, ReadRequest req, size_t batch = 7) {
  auto reader = ds.Read(req);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return {};
  auto all = ReadAll(reader->get(), batch);
  EXPECT_TRUE(all.ok()) << all.status();
  return all.ok() ? *all : std::vector<std::string>{};
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(StreamingDatasetTest, EveryRankCountReadsEachExampleOnce) {
  auto fs = NewPosixFileSystem();
  Fixture f = LibSvmDir();
  for (SplitMode split : {SplitMode::kAuto, SplitMode::kBytes}) {
    DatasetOptions o = Options(f.dir);
    o.split = split;
    auto ds = Open(o, fs.get());
    ASSERT_NE(ds, nullptr);
    EXPECT_EQ(ds->layout(Split::kTrain).files.size(), 3u);
    for (uint32_t n = 1; n <= 6; ++n) {
      std::vector<std::string> all;
      for (uint32_t r = 0; r < n; ++r) {
        ReadRequest req;
        req.part = {r, n};
        std::vector<std::string> part = Pass(*ds, req);
        all.insert(all.end(), part.begin(), part.end());
      }
      EXPECT_EQ(Sorted(all), f.want) << n << " ranks";
    }
  }
}

TEST(StreamingDatasetTest, PassesRepeatBySeedAndEpochAndShuffle) {
  auto fs = NewPosixFileSystem();
  Fixture f = LibSvmDir();
  auto ds = Open(Options(f.dir), fs.get());
  ASSERT_NE(ds, nullptr);
  ReadRequest req;
  req.part = {0, 1};
  std::vector<std::string> a = Pass(*ds, req, 5), b = Pass(*ds, req, 64);
  EXPECT_EQ(a, b);  // The batch size a consumer asks for does not change the order.
  EXPECT_EQ(Sorted(a), f.want);
  req.epoch = 1;
  std::vector<std::string> c = Pass(*ds, req);
  EXPECT_NE(a, c);
  EXPECT_EQ(Sorted(c), f.want);
  DatasetOptions other = Options(f.dir);
  other.seed = 43;
  auto ds2 = Open(other, fs.get());
  req.epoch = 0;
  EXPECT_NE(Pass(*ds2, req), a);
  // Without shuffling: file order.
  req.shuffle = false;
  std::vector<std::string> in_order = Pass(*ds, req);
  std::vector<std::string> want_order;
  LibSvmText(0, 3000, &want_order);
  EXPECT_EQ(in_order, want_order);
}

TEST(StreamingDatasetTest, HeldOutLinesAreTheSameForAnyRankCountAndNeverTrained) {
  auto fs = NewPosixFileSystem();
  Fixture f = LibSvmDir();
  DatasetOptions o = Options(f.dir);
  o.holdout_fraction = 0.25;
  auto ds = Open(o, fs.get());
  ASSERT_NE(ds, nullptr);
  ASSERT_TRUE(ds->has_test());
  std::vector<std::string> test_one_rank;
  for (uint32_t n : {1u, 3u, 4u}) {
    std::vector<std::string> train, test;
    for (uint32_t r = 0; r < n; ++r) {
      ReadRequest req;
      req.part = {r, n};
      auto p = Pass(*ds, req);
      train.insert(train.end(), p.begin(), p.end());
      req.split = Split::kTest;
      req.shuffle = false;
      p = Pass(*ds, req);
      test.insert(test.end(), p.begin(), p.end());
      // CountLines gives what a pass reads.
      auto count = ds->CountLines(req);
      ASSERT_TRUE(count.ok());
      EXPECT_EQ(*count, p.size());
    }
    train = Sorted(train);
    test = Sorted(test);
    std::vector<std::string> both;
    std::set_intersection(train.begin(), train.end(), test.begin(), test.end(),
                          std::back_inserter(both));
    EXPECT_TRUE(both.empty());
    std::vector<std::string> all = train;
    all.insert(all.end(), test.begin(), test.end());
    EXPECT_EQ(Sorted(all), f.want);
    EXPECT_NEAR(test.size() / 3000.0, 0.25, 0.03);
    if (n == 1) test_one_rank = test;
    EXPECT_EQ(test, test_one_rank);
  }
  // Another seed, another split.
  o.seed = 7;
  auto ds7 = Open(o, fs.get());
  ReadRequest req;
  req.split = Split::kTest;
  EXPECT_NE(Sorted(Pass(*ds7, req)), test_one_rank);
}

TEST(StreamingDatasetTest, ResumingAPassSkipsTheExamplesAlreadyRead) {
  auto fs = NewPosixFileSystem();
  Fixture f = LibSvmDir();
  auto ds = Open(Options(f.dir), fs.get());
  ReadRequest req;
  req.part = {1, 2};
  req.epoch = 3;
  std::vector<std::string> full = Pass(*ds, req);
  req.skip_examples = 777;
  EXPECT_EQ(Pass(*ds, req), std::vector<std::string>(full.begin() + 777, full.end()));
}

// Rank 2 of 3 leaves mid-pass: rank 0 takes its part on, in the same pass.
TEST(StreamingDatasetTest, APartHandedOverMidPassIsReadOnce) {
  auto fs = NewPosixFileSystem();
  Fixture f = LibSvmDir();
  DatasetOptions o = Options(f.dir);
  o.split = SplitMode::kBytes;
  auto ds = Open(o, fs.get());
  ReadRequest req;
  req.part = {0, 3};
  auto reader = ds->Read(req);
  ASSERT_TRUE(reader.ok());
  ExampleBatch b;
  std::vector<std::string> got;
  ASSERT_TRUE((*reader)->Next(50, &b).ok());
  got = testing::Signatures(b);
  PartitionSpec next = req.part;
  next.also = {2};
  ASSERT_TRUE(ds->AddParts(reader->get(), req, next).ok());
  auto rest = ReadAll(reader->get());
  ASSERT_TRUE(rest.ok());
  got.insert(got.end(), rest->begin(), rest->end());
  // Once the pass has read its last chunk, parts apply from the next epoch.
  PartitionSpec more = req.part;
  more.also = {1, 2};
  EXPECT_EQ(ds->AddParts(reader->get(), req, more).code(), absl::StatusCode::kFailedPrecondition);
  PartitionSpec reshared = req.part;
  reshared.shares = {1, 2, 3};
  EXPECT_EQ(ds->AddParts(reader->get(), req, reshared).code(),
            absl::StatusCode::kFailedPrecondition);
  ReadRequest one = req;
  one.part = {1, 3};
  std::vector<std::string> r1 = Pass(*ds, one);
  got.insert(got.end(), r1.begin(), r1.end());
  EXPECT_EQ(Sorted(got), f.want);
}

TEST(StreamingDatasetTest, MissingPathsAndBadOptionsAreNamed) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("missing");
  DatasetOptions o = Options(dir + "/nope.svm");
  auto ds = StreamingDataset::Open(o, fs.get());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ds.status().message(), "train: " + dir + "/nope.svm: no such file or directory");
  o.train = dir + "/*.svm";
  ds = StreamingDataset::Open(o, fs.get());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ds.status().message(), "train: " + dir + "/*.svm matches no file");
  o.train = dir;
  ds = StreamingDataset::Open(o, fs.get());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ds.status().message(), "train: " + dir + " holds no data files");
  testing::WriteText(dir + "/t.svm", "1 1:1\n");
  o.train = dir + "/t*.svm";
  o.test = dir + "/test/";
  ds = StreamingDataset::Open(o, fs.get());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ds.status().message(), "test: " + dir + "/test/: no such file or directory");
  o.holdout_fraction = 0.2;
  ds = StreamingDataset::Open(o, fs.get());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ds.status().message(),
            "holdout_fraction: with a test set (test: " + dir + "/test/) nothing is held out");
  o.test.clear();
  ds = StreamingDataset::Open(o, fs.get());
  ASSERT_TRUE(ds.ok()) << ds.status();
  ReadRequest req;
  req.part = {0, 2};
  auto reader = (*ds)->Read(req);  // 6 bytes, 2 parts.
  ASSERT_TRUE(reader.ok());
  req.part = {0, 7};
  EXPECT_EQ((*ds)->Read(req).status().code(), absl::StatusCode::kInvalidArgument);
}

// A malformed line stops the pass with file:line:column, also in a chunk that starts mid-file.
TEST(StreamingDatasetTest, FailNamesTheFileLineAndColumn) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("fail");
  std::vector<std::string> unused;
  std::string text = LibSvmText(0, 1233, &unused) + "1 5=1\n" + LibSvmText(2000, 100, &unused);
  testing::WriteText(dir + "/d.svm", text);
  DatasetOptions o = Options(dir + "/d.svm");
  auto ds = Open(o, fs.get());
  for (bool shuffle : {false, true}) {
    ReadRequest req;
    req.shuffle = shuffle;
    auto reader = ds->Read(req);
    ASSERT_TRUE(reader.ok());
    auto all = ReadAll(reader->get());
    EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(all.status().message(),
              dir + "/d.svm:1234:4: expected ':' after the feature index, found '=1'");
  }
  ASSERT_GT(text.find("1 5=1"), 3 * o.chunk_bytes);  // The line is in a chunk after the first.
}

TEST(StreamingDatasetTest, SkipCountsMalformedLinesUpToTheFraction) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("skip");
  std::vector<std::string> want;
  std::string text;
  for (int block = 0; block < 20; ++block) {
    text += LibSvmText(block * 100, 100, &want);
    if (block == 2 || block == 5 || block == 8) text += absl::StrCat("1 1:", block, "x\n");
  }
  const std::string path = dir + "/d.svm";
  testing::WriteText(path, text);
  DatasetOptions o = Options(path);
  o.on_error = OnError::kSkip;
  o.max_error_fraction = 0.01;
  auto ds = Open(o, fs.get());
  ReadRequest req;
  req.shuffle = false;
  auto reader = ds->Read(req);
  ASSERT_TRUE(reader.ok());
  auto all = ReadAll(reader->get());
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, want);
  ReaderStats st = (*reader)->stats();
  EXPECT_TRUE(st.finished);
  EXPECT_EQ(st.lines, 2003u);
  EXPECT_EQ(st.skipped_lines, 3u);
  EXPECT_EQ(st.examples, 2000u);
  // Each chunk reads its bytes, and at most 4 KiB past its end for its last line.
  const uint64_t chunks = (text.size() + o.chunk_bytes - 1) / o.chunk_bytes;
  EXPECT_GE(st.bytes_read, text.size());
  EXPECT_LE(st.bytes_read, text.size() + chunks * 4096);
  EXPECT_EQ(
      st.first_errors,
      (std::vector<std::string>{
          path + ":301:6: expected a space or the end of the line after the value, found 'x'",
          path + ":602:6: expected a space or the end of the line after the value, found 'x'",
          path + ":903:6: expected a space or the end of the line after the value, found 'x'"}));
  // 3 of 2,003 is more than 0.1% (checked at the end, the skips being in the first 1,000
  // lines): the pass fails at its end, after its examples.
  o.max_error_fraction = 0.001;
  ds = Open(o, fs.get());
  reader = ds->Read(req);
  ExampleBatch b;
  size_t examples = 0;
  absl::Status s;
  while (true) {
    auto n = (*reader)->Next(100, &b);
    if (!n.ok() || *n == 0) {
      s = n.status();
      break;
    }
    examples += *n;
  }
  EXPECT_EQ(examples, 2000u);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(),
            "train: 3 of 2003 lines malformed (0.15%), more than max_error_fraction "
            "0.001; the first: " +
                st.first_errors[0]);
}

TEST(StreamingDatasetTest, AFileOfGarbageFailsSoonWithSkip) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("garbage");
  std::vector<std::string> unused;
  std::string text = LibSvmText(0, 1000, &unused);
  for (int i = 0; i < 50000; ++i) text += "not libsvm\n";
  testing::WriteText(dir + "/d.svm", text);
  DatasetOptions o = Options(dir + "/d.svm");
  o.on_error = OnError::kSkip;
  auto ds = Open(o, fs.get());
  ReadRequest req;
  req.shuffle = false;
  auto reader = ds->Read(req);
  auto all = ReadAll(reader->get());
  EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(all.status().message().substr(0, 32), "train: 2 of 1002 lines malformed");
  EXPECT_LT((*reader)->stats().lines, 1003u);
}

TEST(StreamingDatasetTest, CsvFilesCutIntoByteRangesSkipEachHeader) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("csv");
  std::set<std::string> ids;
  for (int f = 0; f < 2; ++f) {
    std::string text = "id,y,x\n";
    for (int i = 0; i < 500; ++i) {
      const int id = f * 1000 + i;
      absl::StrAppend(&text, id, ",", id % 2, ",", id * 0.5, "\n");
      ids.insert(absl::StrCat(id));
    }
    testing::WriteText(absl::StrCat(dir, "/p", f, ".csv"), text);
  }
  DatasetOptions o = Options(dir);
  o.format = DataFormat::kCsv;
  o.label_column = "y";
  o.split = SplitMode::kBytes;
  o.chunk_bytes = 4096;
  auto ds = Open(o, fs.get());
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->schema().dense, (std::vector<std::string>{"id", "x"}));
  std::vector<std::string> all;
  for (uint32_t r = 0; r < 5; ++r) {
    ReadRequest req;
    req.part = {r, 5};
    auto p = Pass(*ds, req);
    all.insert(all.end(), p.begin(), p.end());
  }
  ASSERT_EQ(all.size(), 1000u);
  std::set<std::string> got;
  for (const std::string& s : all) got.insert(s.substr(2, s.find(',') - 2));
  EXPECT_EQ(got, ids);
  // A file with another header.
  testing::WriteText(dir + "/p2.csv", "id,x,y\n1,2,1\n");
  ds = Open(o, fs.get());
  ReadRequest req;
  req.shuffle = false;
  auto reader = ds->Read(req);
  auto res = ReadAll(reader->get());
  EXPECT_EQ(res.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(res.status().message(), dir + "/p2.csv:1:4: expected the header of " + dir +
                                        "/p0.csv: column 2 'y', found 'x'");
}

TEST(StreamingDatasetTest, CriteoGzip) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("criteo");
  std::string text;
  int clicks = 0;
  for (int i = 0; i < 600; ++i) {
    const int label = i % 4 == 0;
    clicks += label;
    absl::StrAppend(&text, label);
    for (int j = 0; j < 13; ++j) absl::StrAppend(&text, "\t", j == i % 13 ? "" : absl::StrCat(i));
    for (int j = 0; j < 26; ++j) absl::StrAppend(&text, "\t", absl::Hex(i * 26 + j));
    text += "\n";
  }
  testing::WriteGzip(dir + "/day_0.gz", text);
  DatasetOptions o = Options(dir + "/day_0.gz");
  o.format = DataFormat::kCriteo;
  o.hash_buckets = 1000;
  auto ds = Open(o, fs.get());
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->schema().key_space, 26000u);
  ReadRequest req;
  auto reader = ds->Read(req);
  ExampleBatch b;
  int got = 0, got_clicks = 0;
  while (true) {
    auto n = (*reader)->Next(128, &b);
    ASSERT_TRUE(n.ok()) << n.status();
    if (*n == 0) break;
    ASSERT_EQ(b.dense.size(), *n * 13);
    ASSERT_EQ(b.keys.size(), *n * 26);
    for (size_t i = 0; i < *n; ++i) got_clicks += b.labels[i];
    got += static_cast<int>(*n);
  }
  EXPECT_EQ(got, 600);
  EXPECT_EQ(got_clicks, clicks);
}

TEST(StreamingDatasetTest, ReadErrorsNameTheFile) {
  auto base = NewPosixFileSystem();
  Fixture f = LibSvmDir();
  const std::string path = f.dir + "/c.svm";
  testing::FaultyFileSystem fs(base.get(), path, 10000,
                               absl::UnavailableError(path + ": read: Input/output error"));
  auto ds = Open(Options(f.dir), &fs);
  ReadRequest req;
  auto reader = ds->Read(req);
  auto all = ReadAll(reader->get());
  EXPECT_EQ(all.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(all.status().message(), "train: " + path + ": read: Input/output error");
}

// The reader thread stops when the queue is full: what it has read stays bounded by the
// options, not by the file.
TEST(StreamingDatasetTest, ReadingAheadIsBounded) {
  auto fs = NewPosixFileSystem();
  const std::string dir = NewTempDir("bounded");
  std::vector<std::string> unused;
  const std::string text = LibSvmText(0, 400000, &unused);  // About 10 MB.
  testing::WriteText(dir + "/big.svm", text);
  DatasetOptions o = Options(dir + "/big.svm");
  o.chunk_bytes = 1 << 20;
  auto ds = Open(o, fs.get());
  ReadRequest req;
  auto reader = ds->Read(req);
  ASSERT_TRUE(reader.ok());
  ExampleBatch b;
  ASSERT_TRUE((*reader)->Next(10, &b).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const ReaderStats st = (*reader)->stats();
  EXPECT_FALSE(st.finished);
  // Queue (2 x 64) + window (100) + one block of examples held: a few hundred lines, plus the
  // 1 MiB read buffer.
  EXPECT_LT(st.lines, 1000u);
  EXPECT_LE(st.bytes_read, 2u << 20);
  EXPECT_GT(text.size(), 8u << 20);
}

}  // namespace
}  // namespace pscluster::data
