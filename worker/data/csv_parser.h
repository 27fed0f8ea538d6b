// CSV and TSV lines with a header: the label column by name, dense numeric columns, categorical
// columns hashed into each column's own key range (a missing cell takes the range's first key),
// ignored columns. Cells may be quoted ("a, b" with "" for a quote) but not span lines; spaces
// around a cell are trimmed. A blank line holds no example.
#ifndef PSCLUSTER_WORKER_DATA_CSV_PARSER_H_
#define PSCLUSTER_WORKER_DATA_CSV_PARSER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/dataset_options.h"
#include "worker/data/line_parser.h"

namespace pscluster::data {

class CsvParser final : public LineParser {
 public:
  // Reads the column names from `header` (the first line of `header_path`, the set's first
  // file). INVALID_ARGUMENT when a declared column or the label column is not there, DATA_LOSS
  // ("path:1:column: expected ...") when the header is malformed.
  // REQUIRES: Validate(options) is OK and options.format is csv or tsv.
  static absl::StatusOr<std::unique_ptr<CsvParser>> Create(const DatasetOptions& options,
                                                           absl::string_view header,
                                                           const std::string& header_path);

  const Schema& schema() const override { return schema_; }
  bool has_header() const override { return true; }
  bool CheckHeader(absl::string_view line, ParseError* error) const override;
  ParseOutcome Parse(absl::string_view line, Example* out, ParseError* error) const override;
  bool HasData(absl::string_view line) const override;

 private:
  enum class Role { kLabel, kDense, kCategorical, kIgnore };
  struct Column {
    std::string name;
    Role role = Role::kIgnore;
    uint32_t slot = 0;  // Dense: index in Example::dense; categorical: field index.
    float default_value = 0;
  };

  CsvParser(const DatasetOptions& options, const std::string& header_path);

  Schema schema_;
  char delimiter_;
  std::string header_path_;
  std::vector<Column> columns_;  // In header order.
  std::vector<std::string> na_values_;
  LabelRule labels_;
  bool log1p_;
};

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_CSV_PARSER_H_
