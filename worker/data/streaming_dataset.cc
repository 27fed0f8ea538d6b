#include "worker/data/streaming_dataset.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/sharding.h"
#include "worker/data/criteo_parser.h"
#include "worker/data/csv_parser.h"
#include "worker/data/libsvm_parser.h"
#include "worker/data/line_reader.h"
#include "worker/data/text_scan.h"

namespace pscluster::data {
namespace {

// The seeds of a pass, from the data set's seed: the held-out split's is the same for every
// epoch and rank; the shuffle's differs per (epoch, part).
uint64_t HoldoutSeed(uint64_t seed) { return Mix64(seed ^ 0x686f6c646f7574ULL); }
uint64_t ShuffleSeed(uint64_t seed, uint32_t epoch, uint32_t part) {
  return Mix64(seed ^ Mix64(uint64_t{epoch} + 1) ^ Mix64(uint64_t{part} << 32));
}

std::string Bytes(uint64_t n) {
  if (n >= (uint64_t{1} << 30)) return absl::StrFormat("%.1f GB", n / 1073741824.0);
  if (n >= (uint64_t{1} << 20)) return absl::StrFormat("%.1f MB", n / 1048576.0);
  return absl::StrCat(n, " bytes");
}

}  // namespace

absl::StatusOr<std::unique_ptr<LineParser>> CreateParser(const DatasetOptions& options,
                                                         const DataLayout& layout, FileSystem* fs) {
  switch (options.format) {
    case DataFormat::kLibSvm:
      return std::unique_ptr<LineParser>(new LibSvmParser(options));
    case DataFormat::kCriteo:
      return std::unique_ptr<LineParser>(new CriteoParser(options));
    case DataFormat::kCsv:
    case DataFormat::kTsv:
      break;
  }
  LineReaderOptions lo;
  lo.max_line_bytes = options.max_line_bytes;
  lo.block_bytes = 64 << 10;
  for (const DataFile& f : layout.files) {
    if (f.size == 0) continue;
    auto file = fs->Open(f.path);
    if (!file.ok()) return file.status();
    LineReader lines(file->get(), f, 0, f.size, lo);
    absl::string_view header;
    if (!lines.Next(&header)) {
      if (!lines.status().ok()) return lines.status();
      continue;
    }
    if (lines.line_too_long()) {
      return absl::DataLossError(absl::StrCat(f.path, ":1:1: expected a header line of at most ",
                                              options.max_line_bytes, " bytes (max_line_bytes)"));
    }
    auto csv = CsvParser::Create(options, header, f.path);
    if (!csv.ok()) return csv.status();
    return std::unique_ptr<LineParser>(std::move(*csv));
  }
  return absl::DataLossError(
      absl::StrCat(layout.source, ": no line to read the header from (the files are empty)"));
}

absl::StatusOr<std::unique_ptr<StreamingDataset>> StreamingDataset::Open(
    const DatasetOptions& options, FileSystem* fs) {
  absl::Status s = Validate(options);
  if (!s.ok()) return s;
  std::unique_ptr<StreamingDataset> ds(new StreamingDataset(options, fs));
  auto train = ListDataFiles(fs, "train", options.train);
  if (!train.ok()) return train.status();
  ds->train_ = std::move(*train);
  if (!options.test.empty()) {
    auto test = ListDataFiles(fs, "test", options.test);
    if (!test.ok()) return test.status();
    ds->test_ = std::move(*test);
  }
  auto parser = CreateParser(options, ds->train_, fs);
  if (!parser.ok()) {
    return absl::Status(parser.status().code(), absl::StrCat("train: ", parser.status().message()));
  }
  ds->parser_ = std::move(*parser);
  return ds;
}

const DataLayout& StreamingDataset::layout(Split split) const {
  return split == Split::kTest && !options_.test.empty() ? test_ : train_;
}

absl::StatusOr<std::vector<Chunk>> StreamingDataset::Chunks(const ReadRequest& request) const {
  if (request.split == Split::kTest && !has_test()) {
    return absl::InvalidArgumentError(
        "test: the data set has no test split (set test or "
        "holdout_fraction)");
  }
  auto chunks =
      PartChunks(layout(request.split), request.part, options_.split, options_.chunk_bytes);
  if (!chunks.ok()) return chunks.status();
  if (!request.shuffle || options_.shuffle_window <= 1) return chunks;
  return EpochChunkOrder(std::move(*chunks),
                         ShuffleSeed(options_.seed, request.epoch, request.part.index),
                         request.epoch);
}

StreamConfig StreamingDataset::ConfigFor(const ReadRequest& request) const {
  StreamConfig c;
  const bool test = request.split == Split::kTest;
  c.key = test ? "test" : "train";
  c.layout = &layout(request.split);
  c.parser = parser_.get();
  c.fs = fs_;
  if (options_.test.empty() && options_.holdout_fraction > 0) {
    c.holdout_fraction = options_.holdout_fraction;
    c.holdout_seed = HoldoutSeed(options_.seed);
    c.keep_held_out = test;
  }
  if (request.shuffle) {
    c.shuffle_window = options_.shuffle_window;
    c.shuffle_seed = ShuffleSeed(options_.seed, request.epoch, request.part.index);
  }
  c.skip_examples = request.skip_examples;
  c.on_error = options_.on_error;
  c.max_error_fraction = options_.max_error_fraction;
  c.batch_examples = options_.batch_examples;
  c.prefetch_batches = options_.prefetch_batches;
  c.line_options.max_line_bytes = options_.max_line_bytes;
  return c;
}

absl::StatusOr<std::unique_ptr<StreamReader>> StreamingDataset::Read(
    const ReadRequest& request) const {
  auto chunks = Chunks(request);
  if (!chunks.ok()) return chunks.status();
  StreamConfig c = ConfigFor(request);
  c.chunks = std::move(*chunks);
  return std::make_unique<StreamReader>(std::move(c));
}

absl::Status StreamingDataset::AddParts(StreamReader* reader, const ReadRequest& request,
                                        const PartitionSpec& next) const {
  const PartitionSpec& now = request.part;
  if (next.index != now.index || next.count != now.count || next.begin != now.begin ||
      next.end != now.end || next.shares != now.shares) {
    return absl::FailedPreconditionError(
        "partition: only parts added to `also` apply within a pass; the rest from the next "
        "epoch");
  }
  absl::Status s = CheckPartition(next);
  if (!s.ok()) return s;
  std::set<uint32_t> have(now.also.begin(), now.also.end());
  const DataLayout& l = layout(request.split);
  std::vector<Chunk> added;
  for (uint32_t a : next.also) {
    if (have.count(a) > 0) continue;
    std::vector<Chunk> c = ChunksOfPart(l, next, a, options_.split, options_.chunk_bytes);
    added.insert(added.end(), c.begin(), c.end());
  }
  if (added.empty()) return absl::OkStatus();
  if (request.shuffle && options_.shuffle_window > 1) {
    added = EpochChunkOrder(
        std::move(added),
        ShuffleSeed(options_.seed, request.epoch, request.part.index) ^ Mix64(added.front().part),
        request.epoch);
  }
  return reader->AddChunks(added);
}

absl::StatusOr<uint64_t> StreamingDataset::CountLines(const ReadRequest& request) const {
  ReadRequest in_order = request;
  in_order.shuffle = false;
  auto chunks = Chunks(in_order);
  if (!chunks.ok()) return chunks.status();
  const StreamConfig c = ConfigFor(in_order);
  const uint64_t threshold = HoldoutThreshold(c.holdout_fraction);
  uint64_t count = 0;
  uint32_t open_file = UINT32_MAX;
  std::unique_ptr<RandomAccessFile> file;
  for (const Chunk& chunk : *chunks) {
    const DataFile& info = c.layout->files[chunk.file];
    if (chunk.file != open_file) {
      auto f = fs_->Open(info.path);
      if (!f.ok())
        return absl::Status(f.status().code(), absl::StrCat(c.key, ": ", f.status().message()));
      file = std::move(*f);
      open_file = chunk.file;
    }
    LineReader lines(file.get(), info, chunk.begin, chunk.end, c.line_options);
    const bool header = parser_->has_header() && chunk.begin == 0;
    absl::string_view line;
    while (lines.Next(&line)) {
      if (header && lines.lines() == 1) continue;
      if (c.holdout_fraction > 0 &&
          (HashBytes(line, c.holdout_seed) < threshold) != c.keep_held_out) {
        continue;
      }
      if (lines.line_too_long() || parser_->HasData(line)) ++count;
    }
    if (!lines.status().ok()) {
      return absl::Status(lines.status().code(),
                          absl::StrCat(c.key, ": ", lines.status().message()));
    }
  }
  return count;
}

std::string StreamingDataset::Describe() const {
  auto where = [](const DataLayout& l) {
    return absl::StrCat(l.files.size(), " files, ", Bytes(l.total_bytes), " at ", l.source);
  };
  std::string out = absl::StrCat(DataFormatName(options_.format), ": ", where(train_));
  if (!options_.test.empty()) {
    absl::StrAppend(&out, "; test: ", where(test_));
  } else if (options_.holdout_fraction > 0) {
    absl::StrAppend(&out, "; test held out (", options_.holdout_fraction * 100, "%)");
  }
  return out;
}

}  // namespace pscluster::data
