// Criteo-style click logs: tab-separated `label, I1..I13, C1..C26` (40 cells): a 0/1 label, 13
// integer features (an empty cell is missing: options.missing_value) and 26 categorical strings
// (usually 8 hex digits; an empty cell is missing), each field C<i> hashed into its own
// hash_buckets keys. No header.
#ifndef PSCLUSTER_WORKER_DATA_CRITEO_PARSER_H_
#define PSCLUSTER_WORKER_DATA_CRITEO_PARSER_H_

#include "worker/data/dataset_options.h"
#include "worker/data/line_parser.h"

namespace pscluster::data {

inline constexpr int kCriteoDense = 13;
inline constexpr int kCriteoCategorical = 26;

class CriteoParser final : public LineParser {
 public:
  // REQUIRES: Validate(options) is OK.
  explicit CriteoParser(const DatasetOptions& options);

  const Schema& schema() const override { return schema_; }
  ParseOutcome Parse(absl::string_view line, Example* out, ParseError* error) const override;
  bool HasData(absl::string_view line) const override;

 private:
  Schema schema_;
  LabelRule labels_;
  float missing_value_;
  bool log1p_;
};

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_CRITEO_PARSER_H_
