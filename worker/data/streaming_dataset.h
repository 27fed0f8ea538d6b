// A user's data set, streamed: the files of its train and test sources, the parser of its
// format, and passes (StreamReader) over a rank's part of either split. Nothing here holds the
// data; each pass reads it from the files.
//
// A rank's part is a PartitionSpec, as for the built-in sets (partition.h): part `index` of
// `count` (sized by `shares`), plus the parts in `also` of ranks that left, or an explicit range
// in files or bytes (chunks.h). All ranks' parts of one spec cover every line once, so an epoch
// reads the set once; each epoch reads its chunks in a new order and shuffles their examples
// through a window, the same for the same (seed, epoch, part).
#ifndef PSCLUSTER_WORKER_DATA_STREAMING_DATASET_H_
#define PSCLUSTER_WORKER_DATA_STREAMING_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/chunks.h"
#include "worker/data/data_files.h"
#include "worker/data/dataset_options.h"
#include "worker/data/file_system.h"
#include "worker/data/line_parser.h"
#include "worker/data/partition.h"
#include "worker/data/stream_reader.h"

namespace pscluster::data {

enum class Split { kTrain, kTest };

struct ReadRequest {
  Split split = Split::kTrain;
  PartitionSpec part;  // {0, 1}: the whole split.
  uint32_t epoch = 0;
  uint64_t skip_examples = 0;  // Resume a pass after this many examples (the same ones again).
  bool shuffle = true;         // False: file order, no window (evaluation).
};

// Thread-safe after Open: passes may run at the same time.
class StreamingDataset {
 public:
  // Checks the options, lists the train and test files, reads the header of a csv/tsv set's
  // first file. Errors name the option: INVALID_ARGUMENT for the options, NOT_FOUND "train:
  // /data/x: no such file or directory", DATA_LOSS for a malformed header.
  // REQUIRES: fs outlives the data set.
  static absl::StatusOr<std::unique_ptr<StreamingDataset>> Open(const DatasetOptions& options,
                                                                FileSystem* fs);

  const Schema& schema() const { return parser_->schema(); }
  const DatasetOptions& options() const { return options_; }
  // Whether there is a test split (a test source, or a held-out fraction).
  bool has_test() const { return !options_.test.empty() || options_.holdout_fraction > 0; }
  // A held-out test split reads the train files.
  const DataLayout& layout(Split split) const;

  // The chunks a request reads, in its epoch's order. INVALID_ARGUMENT when the part does not
  // fit the set (chunks.h) or there is no test split.
  absl::StatusOr<std::vector<Chunk>> Chunks(const ReadRequest& request) const;

  // Starts a pass over the request's part.
  absl::StatusOr<std::unique_ptr<StreamReader>> Read(const ReadRequest& request) const;

  // Adds to a running pass the parts that `next` reads beyond request.part (the parts of ranks
  // that left, handed to this one mid-epoch). FAILED_PRECONDITION when `next` differs otherwise
  // (index, count, range, shares: those apply from the next epoch) or the pass has read its
  // last chunk.
  absl::Status AddParts(StreamReader* reader, const ReadRequest& request,
                        const PartitionSpec& next) const;

  // Lines with data in the request's part, on its side of the held-out split: what a pass
  // offers the parser (malformed lines included). Reads the part without parsing it.
  absl::StatusOr<uint64_t> CountLines(const ReadRequest& request) const;

  // "criteo: 12 files, 4.0 GB at /data/train/*.gz; test held out (20%)".
  std::string Describe() const;

 private:
  StreamingDataset(const DatasetOptions& options, FileSystem* fs) : options_(options), fs_(fs) {}

  StreamConfig ConfigFor(const ReadRequest& request) const;

  const DatasetOptions options_;
  FileSystem* const fs_;
  DataLayout train_, test_;
  std::unique_ptr<LineParser> parser_;
};

// Creates the parser of the options' format; csv/tsv read their header from the layout's
// first file that holds a line.
absl::StatusOr<std::unique_ptr<LineParser>> CreateParser(const DatasetOptions& options,
                                                         const DataLayout& layout, FileSystem* fs);

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_STREAMING_DATASET_H_
