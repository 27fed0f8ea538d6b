// A parser of one text format: a line in, an example (or nothing, or an error with its column)
// out. Implementations are stateless after construction, so one parser serves every reader.
#ifndef PSCLUSTER_WORKER_DATA_LINE_PARSER_H_
#define PSCLUSTER_WORKER_DATA_LINE_PARSER_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "worker/data/example.h"

namespace pscluster::data {

// Where a line is malformed: `column` (1-based, in bytes) and what was expected there
// ("expected ':' after the feature index, found '='"). The reader prefixes "file:line:".
struct ParseError {
  size_t column = 0;
  std::string expected;
};

enum class ParseOutcome {
  kExample,  // *out holds the line's example.
  kNoData,   // A blank line or a comment.
  kError,    // *error says where and what.
};

class LineParser {
 public:
  virtual ~LineParser() = default;

  virtual const Schema& schema() const = 0;

  // Whether the first line of each file is a header (CheckHeader, never Parse, reads it).
  virtual bool has_header() const { return false; }
  // Checks that a file's header names the columns the first file's did.
  virtual bool CheckHeader(absl::string_view line, ParseError* error) const {
    (void)line;
    (void)error;
    return true;
  }

  // Parses a line (without its '\n' and '\r'). Thread-safe.
  virtual ParseOutcome Parse(absl::string_view line, Example* out, ParseError* error) const = 0;

  // Whether the line holds an example or an error (not blank, not a comment); cheaper than Parse.
  virtual bool HasData(absl::string_view line) const = 0;
};

// Labels: integers in [base, base + num_classes) become classes 0..num_classes-1; with two
// classes and base 0, -1 is class 0 too.
class LabelRule {
 public:
  LabelRule(uint32_t num_classes, int64_t base) : num_classes_(num_classes), base_(base) {}

  bool Apply(float value, int32_t* label) const {
    const double v = value;
    if (num_classes_ == 2 && base_ == 0 && v == -1) {
      *label = 0;
      return true;
    }
    const double c = v - static_cast<double>(base_);
    if (!(c >= 0 && c < num_classes_) || c != static_cast<double>(static_cast<int64_t>(c))) {
      return false;
    }
    *label = static_cast<int32_t>(c);
    return true;
  }

  // "a label in {-1, 0, 1}" or "an integer label in [1, 10]".
  std::string Describe() const;

 private:
  uint32_t num_classes_;
  int64_t base_;
};

}  // namespace pscluster::data

#endif  // PSCLUSTER_WORKER_DATA_LINE_PARSER_H_
