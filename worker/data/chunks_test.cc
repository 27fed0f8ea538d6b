#include "worker/data/chunks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/data/line_reader.h"
#include "worker/data/test_files.h"

namespace pscluster::data {
namespace {

using testing::NewTempDir;

// A directory of `files` random files (each line unique), some gzip when `gzip`.
struct RandomSet {
  DataLayout layout;
  std::vector<std::string> lines;  // Every line of the set, sorted.
};

RandomSet MakeSet(FileSystem* fs, std::mt19937_64& rng, int files, bool gzip) {
  const std::string dir = NewTempDir("set");
  RandomSet set;
  for (int f = 0; f < files; ++f) {
    std::string text;
    const int n = static_cast<int>(rng() % 400);  // Some files may be empty.
    for (int i = 0; i < n; ++i) {
      std::string line = absl::StrCat("f", f, "_", i, " ");
      line.append(rng() % 120, 'x');
      set.lines.push_back(line);
      text += line + "\n";
    }
    const std::string path = absl::StrCat(dir, "/part-", f < 10 ? "0" : "", f);
    if (gzip && rng() % 3 == 0) {
      testing::WriteGzip(path, text);
    } else {
      testing::WriteText(path, text);
    }
  }
  std::sort(set.lines.begin(), set.lines.end());
  auto layout = ListDataFiles(fs, "train", dir);
  EXPECT_TRUE(layout.ok()) << layout.status();
  set.layout = std::move(*layout);
  return set;
}

// Whether part `a` holds any byte of a non-empty plain file, or a gzip file's first byte.
bool PartHasData(const DataLayout& layout, PartitionSpec spec, uint32_t a, SplitMode split) {
  if (split == SplitMode::kFiles) {
    auto [lo, hi] = PartBounds(layout.files.size(), spec, a);
    for (uint64_t i = lo; i < hi; ++i) {
      if (layout.files[i].size > 0) return true;
    }
    return false;
  }
  auto [lo, hi] = PartBounds(layout.total_bytes, spec, a);
  uint64_t g = 0;
  for (const DataFile& f : layout.files) {
    if (f.size > 0) {
      if (f.gzip ? (g >= lo && g < hi) : std::max(lo, g) < std::min(hi, g + f.size)) return true;
    }
    g += f.size;
  }
  return false;
}

void ReadChunks(FileSystem* fs, const DataLayout& layout, const std::vector<Chunk>& chunks,
                std::vector<std::string>* out) {
  for (const Chunk& c : chunks) {
    const DataFile& info = layout.files[c.file];
    auto file = fs->Open(info.path);
    ASSERT_TRUE(file.ok());
    LineReader lines(file->get(), info, c.begin, c.end, LineReaderOptions{});
    absl::string_view line;
    while (lines.Next(&line)) out->emplace_back(line);
    ASSERT_TRUE(lines.status().ok()) << lines.status();
  }
}

// Every line of the set exactly once over all parts, for many rank counts, random files (plain
// and gzip, some empty), each split mode, equal parts and random shares.
TEST(ChunksTest, AllPartsReadEveryLineExactlyOnce) {
  auto fs = NewPosixFileSystem();
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 24; ++trial) {
    RandomSet set = MakeSet(fs.get(), rng, 1 + static_cast<int>(rng() % 7), trial % 2 == 1);
    const uint64_t chunk_bytes = 64 + rng() % 4000;
    for (uint32_t n = 1; n <= 9; ++n) {
      for (SplitMode mode : {SplitMode::kAuto, SplitMode::kFiles, SplitMode::kBytes}) {
        PartitionSpec spec;
        spec.count = n;
        if (rng() % 2 == 0) {
          for (uint32_t i = 0; i < n; ++i) spec.shares.push_back(1 + rng() % 2000);
        }
        std::vector<std::string> got;
        bool refused = false;
        for (uint32_t a = 0; a < n; ++a) {
          spec.index = a;
          auto chunks = PartChunks(set.layout, spec, mode, chunk_bytes);
          if (!chunks.ok()) {
            // Only when some part cannot get any data: more parts than files or than bytes,
            // or too few gzip files.
            EXPECT_EQ(chunks.status().code(), absl::StatusCode::kInvalidArgument);
            refused = true;
            break;
          }
          for (const Chunk& c : *chunks) {
            EXPECT_EQ(c.part, a);
            EXPECT_LE(c.end - c.begin, set.layout.files[c.file].gzip ? c.end : chunk_bytes);
          }
          ReadChunks(fs.get(), set.layout, *chunks, &got);
        }
        // Refused exactly when some part would get no data at all.
        const SplitMode resolved = ResolveSplit(set.layout, spec, mode);
        bool all_have_data = true;
        for (uint32_t a = 0; a < n; ++a) {
          all_have_data &= PartHasData(set.layout, spec, a, resolved);
        }
        ASSERT_EQ(refused, !all_have_data) << "trial " << trial << " n " << n;
        if (refused) continue;
        std::sort(got.begin(), got.end());
        ASSERT_EQ(got, set.lines) << "trial " << trial << " n " << n << " mode "
                                  << static_cast<int>(mode);
      }
    }
  }
}

// Ranks leave and their parts are read by others (`also`): still every line once.
TEST(ChunksTest, PartsOfRanksThatLeftAreReadOnceByOthers) {
  auto fs = NewPosixFileSystem();
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 20; ++trial) {
    RandomSet set = MakeSet(fs.get(), rng, 1 + static_cast<int>(rng() % 3), false);
    const uint32_t n = 2 + static_cast<uint32_t>(rng() % 6);
    std::vector<PartitionSpec> specs(n);
    std::vector<bool> left(n, false);
    for (uint32_t a = 0; a < n; ++a) {
      specs[a].index = a;
      specs[a].count = n;
    }
    std::vector<uint32_t> order(n);
    for (uint32_t a = 0; a < n; ++a) order[a] = a;
    std::shuffle(order.begin(), order.end(), rng);
    const uint32_t leaving = 1 + static_cast<uint32_t>(rng() % (n - 1));
    for (uint32_t i = 0; i < leaving; ++i) left[order[i]] = true;
    for (uint32_t i = 0; i < leaving; ++i) {
      uint32_t to = order[leaving + rng() % (n - leaving)];
      specs[to].also.push_back(order[i]);
    }
    std::vector<std::string> got;
    for (uint32_t a = 0; a < n; ++a) {
      if (left[a]) continue;
      auto chunks = PartChunks(set.layout, specs[a], SplitMode::kBytes, 500);
      ASSERT_TRUE(chunks.ok()) << chunks.status();
      ReadChunks(fs.get(), set.layout, *chunks, &got);
    }
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got, set.lines) << "trial " << trial;
  }
}

TEST(ChunksTest, ExplicitRangesInBytesAndFiles) {
  auto fs = NewPosixFileSystem();
  std::mt19937_64 rng(9);
  RandomSet set = MakeSet(fs.get(), rng, 4, false);
  for (SplitMode mode : {SplitMode::kBytes, SplitMode::kFiles}) {
    const uint64_t n = mode == SplitMode::kFiles ? 4 : set.layout.total_bytes;
    std::vector<uint64_t> cuts = {0, n, n / 3, n / 2};
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::string> got;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      PartitionSpec spec;
      spec.count = 3;
      spec.index = static_cast<uint32_t>(i);
      spec.begin = cuts[i];
      spec.end = cuts[i + 1];
      auto chunks = PartChunks(set.layout, spec, mode, 1000);
      ASSERT_TRUE(chunks.ok()) << chunks.status();
      ReadChunks(fs.get(), set.layout, *chunks, &got);
    }
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, set.lines);
  }
  PartitionSpec bad;
  bad.begin = 5;
  bad.end = set.layout.total_bytes + 1;
  auto chunks = PartChunks(set.layout, bad, SplitMode::kBytes, 1000);
  EXPECT_EQ(chunks.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chunks.status().message(),
            absl::StrCat("partition: range [5, ", set.layout.total_bytes + 1, ") does not fit the ",
                         set.layout.total_bytes, " bytes of ", set.layout.source));
}

TEST(ChunksTest, AutoTakesWholeFilesWhenThereAreEnough) {
  DataLayout layout;
  layout.source = "/d";
  for (int i = 0; i < 4; ++i) layout.files.push_back({absl::StrCat("/d/", i), 1000, false});
  layout.total_bytes = 4000;
  PartitionSpec spec{1, 4};
  EXPECT_EQ(ResolveSplit(layout, spec, SplitMode::kAuto), SplitMode::kFiles);
  auto chunks = PartChunks(layout, spec, SplitMode::kAuto, 1 << 20);
  ASSERT_TRUE(chunks.ok());
  EXPECT_EQ(*chunks, (std::vector<Chunk>{{1, 0, 1000, 1}}));
  spec = PartitionSpec{1, 5};
  EXPECT_EQ(ResolveSplit(layout, spec, SplitMode::kAuto), SplitMode::kBytes);
  chunks = PartChunks(layout, spec, SplitMode::kAuto, 1 << 20);
  ASSERT_TRUE(chunks.ok());
  EXPECT_EQ(*chunks, (std::vector<Chunk>{{0, 800, 1000, 1}, {1, 0, 600, 1}}));
  // Whole files asked for, fewer files than parts: part 0 gets none.
  chunks = PartChunks(layout, PartitionSpec{0, 5}, SplitMode::kFiles, 1 << 20);
  EXPECT_EQ(chunks.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(chunks.status().message(),
            "partition: part 0 of 5 holds none of the 4 files (4000 bytes) of /d (split: files)");
}

TEST(ChunksTest, GzipFilesBelongWholeToThePartHoldingTheirFirstByte) {
  DataLayout layout;
  layout.source = "/d/*.gz";
  layout.files = {{"/d/a.gz", 1000, true}, {"/d/b.gz", 10, true}};
  layout.total_bytes = 1010;
  auto a = PartChunks(layout, PartitionSpec{0, 2}, SplitMode::kBytes, 100);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<Chunk>{{0, 0, 1000, 0}}));
  auto b = PartChunks(layout, PartitionSpec{1, 2}, SplitMode::kBytes, 100);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<Chunk>{{1, 0, 10, 1}}));
  auto c = PartChunks(layout, PartitionSpec{1, 3}, SplitMode::kBytes, 100);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "partition: part 1 of 3 holds none of the 2 files (1010 bytes) of /d/*.gz (split: "
            "bytes; 2 gzip files, which cannot be cut: give at least one file per worker)");
}

TEST(ChunksTest, EpochOrderIsAPermutationThatRepeatsPerEpoch) {
  std::vector<Chunk> chunks;
  for (uint32_t i = 0; i < 50; ++i) chunks.push_back({i, 0, 10, 0});
  auto e0 = EpochChunkOrder(chunks, 7, 0);
  auto e1 = EpochChunkOrder(chunks, 7, 1);
  EXPECT_EQ(e0, EpochChunkOrder(chunks, 7, 0));
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, chunks);
  EXPECT_NE(e0, EpochChunkOrder(chunks, 8, 0));
  auto sorted = e1;
  std::sort(sorted.begin(), sorted.end(),
            [](const Chunk& a, const Chunk& b) { return a.file < b.file; });
  EXPECT_EQ(sorted, chunks);
}

}  // namespace
}  // namespace pscluster::data
