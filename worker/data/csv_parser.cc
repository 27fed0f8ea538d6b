#include "worker/data/csv_parser.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/data/feature_map.h"
#include "worker/data/text_scan.h"

namespace pscluster::data {
namespace {

// Reads the cell at *p, up to the delimiter or the end of the line, and leaves *p there. The
// cell's text is trimmed of spaces (and tabs, when they do not delimit); a quoted cell is
// unquoted into *scratch. False (with the error) for a quote that does not close.
bool NextCell(const char** pp, const char* begin, const char* end, char delim,
              absl::string_view* cell, std::string* scratch, ParseError* error) {
  auto blank = [delim](char c) { return c == ' ' || (c == '\t' && delim != '\t'); };
  const char* p = *pp;
  while (p < end && blank(*p)) ++p;
  if (p < end && *p == '"') {
    const char* open = p++;
    scratch->clear();
    while (true) {
      const char* q = static_cast<const char*>(std::memchr(p, '"', static_cast<size_t>(end - p)));
      if (q == nullptr) {
        error->column = static_cast<size_t>(open - begin) + 1;
        error->expected = "expected a closing quote before the end of the line";
        return false;
      }
      scratch->append(p, static_cast<size_t>(q - p));
      p = q + 1;
      if (p < end && *p == '"') {  // "" stands for a quote.
        scratch->push_back('"');
        ++p;
        continue;
      }
      break;
    }
    while (p < end && blank(*p)) ++p;
    if (p < end && *p != delim) {
      error->column = static_cast<size_t>(p - begin) + 1;
      error->expected =
          absl::StrCat("expected '", delim == '\t' ? "\\t" : std::string(1, delim),
                       "' after the closing quote, found '", TokenAt(p, end, delim), "'");
      return false;
    }
    *cell = *scratch;
    *pp = p;
    return true;
  }
  const char* q = static_cast<const char*>(std::memchr(p, delim, static_cast<size_t>(end - p)));
  if (q == nullptr) q = end;
  const char* e = q;
  while (e > p && blank(e[-1])) --e;
  *cell = absl::string_view(p, static_cast<size_t>(e - p));
  *pp = q;
  return true;
}

// The cells of a whole line (the header), with the 1-based column where each starts.
bool SplitLine(absl::string_view line, char delim, std::vector<std::string>* cells,
               std::vector<size_t>* starts, ParseError* error) {
  const char* begin = line.data();
  const char* end = begin + line.size();
  const char* p = begin;
  std::string scratch;
  while (true) {
    absl::string_view cell;
    starts->push_back(static_cast<size_t>(p - begin) + 1);
    if (!NextCell(&p, begin, end, delim, &cell, &scratch, error)) return false;
    cells->emplace_back(cell);
    if (p == end) return true;
    ++p;
  }
}

}  // namespace

CsvParser::CsvParser(const DatasetOptions& options, const std::string& header_path)
    : delimiter_(options.format == DataFormat::kTsv ? '\t' : ','),
      header_path_(header_path),
      na_values_(options.na_values),
      labels_(options.num_classes, options.label_base),
      log1p_(options.dense_transform == DenseTransform::kLog1p) {
  schema_.num_classes = options.num_classes;
}

absl::StatusOr<std::unique_ptr<CsvParser>> CsvParser::Create(const DatasetOptions& options,
                                                             absl::string_view header,
                                                             const std::string& header_path) {
  std::unique_ptr<CsvParser> parser(new CsvParser(options, header_path));
  std::vector<std::string> names;
  std::vector<size_t> starts;
  ParseError error;
  if (!SplitLine(header, parser->delimiter_, &names, &starts, &error)) {
    return absl::DataLossError(
        absl::StrCat(header_path, ":1:", error.column, ": ", error.expected));
  }
  std::map<std::string, size_t> declared;
  for (size_t i = 0; i < options.columns.size(); ++i) declared[options.columns[i].name] = i;
  std::map<std::string, size_t> seen;
  bool has_label = false;
  for (size_t c = 0; c < names.size(); ++c) {
    const std::string& name = names[c];
    if (!seen.emplace(name, c).second) {
      return absl::DataLossError(absl::StrCat(header_path, ":1:", starts[c],
                                              ": expected a column name not used before, found '",
                                              name, "' again"));
    }
    Column col;
    col.name = name;
    ColumnKind kind = options.other_columns;
    float default_value = options.missing_value;
    uint64_t buckets = options.hash_buckets;
    if (name == options.label_column) {
      col.role = Role::kLabel;
      has_label = true;
      parser->columns_.push_back(std::move(col));
      continue;
    }
    if (auto it = declared.find(name); it != declared.end()) {
      const ColumnOptions& co = options.columns[it->second];
      kind = co.kind;
      if (!std::isnan(co.default_value)) default_value = co.default_value;
      if (co.buckets != 0) buckets = co.buckets;
    }
    Schema& s = parser->schema_;
    switch (kind) {
      case ColumnKind::kDense:
        col.role = Role::kDense;
        col.slot = static_cast<uint32_t>(s.dense.size());
        col.default_value = default_value;
        s.dense.push_back(name);
        break;
      case ColumnKind::kCategorical:
        col.role = Role::kCategorical;
        col.slot = static_cast<uint32_t>(s.fields.size());
        s.fields.push_back({name, s.key_space, buckets});
        s.key_space += buckets;
        break;
      case ColumnKind::kIgnore:
        col.role = Role::kIgnore;
        break;
    }
    parser->columns_.push_back(std::move(col));
  }
  if (!has_label) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_column: '", options.label_column, "' is not a column of ", header_path,
                     " (its header: ", absl::StrJoin(names, ", "), ")"));
  }
  for (size_t i = 0; i < options.columns.size(); ++i) {
    if (seen.count(options.columns[i].name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("columns[", i, "].name: '", options.columns[i].name, "' is not a column of ",
                       header_path, " (its header: ", absl::StrJoin(names, ", "), ")"));
    }
  }
  return parser;
}

bool CsvParser::CheckHeader(absl::string_view line, ParseError* error) const {
  std::vector<std::string> names;
  std::vector<size_t> starts;
  if (!SplitLine(line, delimiter_, &names, &starts, error)) return false;
  for (size_t c = 0; c < columns_.size(); ++c) {
    if (c >= names.size() || names[c] != columns_[c].name) {
      error->column = c < names.size() ? starts[c] : line.size() + 1;
      error->expected =
          absl::StrCat("expected the header of ", header_path_, ": column ", c + 1, " '",
                       columns_[c].name, "', found '", c < names.size() ? names[c] : "", "'");
      return false;
    }
  }
  if (names.size() > columns_.size()) {
    error->column = starts[columns_.size()];
    error->expected = absl::StrCat("expected the header of ", header_path_, " (", columns_.size(),
                                   " columns), found ", names.size(), " columns");
    return false;
  }
  return true;
}

bool CsvParser::HasData(absl::string_view line) const {
  for (char c : line) {
    if (c != ' ' && c != '\t') return true;
  }
  return false;
}

ParseOutcome CsvParser::Parse(absl::string_view line, Example* out, ParseError* error) const {
  if (!HasData(line)) return ParseOutcome::kNoData;
  const char* const begin = line.data();
  const char* const end = begin + line.size();
  out->Clear();
  out->dense.resize(schema_.dense.size());
  out->keys.resize(schema_.fields.size());
  out->values.assign(schema_.fields.size(), 1.0f);
  std::string scratch;
  const char* p = begin;
  size_t c = 0;
  auto fail = [&](const char* at, auto&&... what) {
    error->column = static_cast<size_t>(at - begin) + 1;
    error->expected = absl::StrCat("expected ", what...);
    return ParseOutcome::kError;
  };
  while (true) {
    const char* at = p;
    absl::string_view cell;
    if (!NextCell(&p, begin, end, delimiter_, &cell, &scratch, error)) return ParseOutcome::kError;
    if (c >= columns_.size()) {
      return fail(at, columns_.size(), " columns (as in the header), found more");
    }
    const Column& col = columns_[c];
    bool missing = cell.empty();
    if (!missing && col.role != Role::kIgnore) {
      const char f = cell[0];
      if (!(f >= '0' && f <= '9') && f != '-' && f != '+' && f != '.') {
        for (const std::string& na : na_values_) missing = missing || cell == na;
      }
    }
    switch (col.role) {
      case Role::kLabel: {
        float v = 0;
        const char* q = cell.data();
        const char* qe = q + cell.size();
        if (missing || !ScanFloat(&q, qe, &v) || q != qe || !labels_.Apply(v, &out->label)) {
          return fail(at, labels_.Describe(), " in column '", col.name, "', found '",
                      cell.substr(0, 24), "'");
        }
        break;
      }
      case Role::kDense: {
        float v = col.default_value;
        if (!missing) {
          const char* q = cell.data();
          const char* qe = q + cell.size();
          if (!ScanFloat(&q, qe, &v) || q != qe) {
            return fail(at, "a number in column '", col.name, "', found '", cell.substr(0, 24),
                        "'");
          }
          if (log1p_) v = Log1pSigned(v);
        }
        out->dense[col.slot] = v;
        break;
      }
      case Role::kCategorical:
        out->keys[col.slot] = CategoricalKey(schema_.fields[col.slot], cell, missing);
        break;
      case Role::kIgnore:
        break;
    }
    ++c;
    if (p == end) break;
    ++p;
  }
  if (c < columns_.size()) {
    return fail(end, columns_.size(), " columns (as in the header), found ", c);
  }
  return ParseOutcome::kExample;
}

}  // namespace pscluster::data
