// LibSVM / SVMlight lines: `label index:value index:value ... [# comment]`, fields separated by
// spaces or tabs. `qid:N` is read and ignored; a line that is blank or starts with '#' holds no
// example. Indices start at options.index_base (key = index - index_base) and need not be sorted.
#ifndef PSCLUSTER_WORKER_DATA_LIBSVM_PARSER_H_
#define PSCLUSTER_WORKER_DATA_LIBSVM_PARSER_H_

#include "worker/data/dataset_options.h"
#include "worker/data/line_parser.h"

namespace pscluster::data {

class LibSvmParser final : public LineParser {
 public:
  // REQUIRES: Validate(options) is OK.
  explicit LibSvmParser(const DatasetOptions& options);

  const Schema& schema() const override { return schema_; }
  ParseOutcome Parse(absl::string_view line, Example* out, ParseError* error) const override;
  bool HasData(absl::string_view line) const override;

 private:
  Schema schema_;
  LabelRule labels_;
  uint64_t index_base_;
  uint64_t num_features_;  // 0 = any index.
};

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_LIBSVM_PARSER_H_
