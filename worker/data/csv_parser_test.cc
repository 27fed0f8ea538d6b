#include "worker/data/csv_parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace pscluster::data {
namespace {

DatasetOptions CsvOptions() {
  DatasetOptions o;
  o.format = DataFormat::kCsv;
  o.label_column = "clicked";
  o.hash_buckets = 1000;
  o.missing_value = -1;
  ColumnOptions city;
  city.name = "city";
  city.kind = ColumnKind::kCategorical;
  ColumnOptions device;
  device.name = "device";
  device.kind = ColumnKind::kCategorical;
  device.buckets = 10;
  ColumnOptions id;
  id.name = "id";
  id.kind = ColumnKind::kIgnore;
  ColumnOptions age;
  age.name = "age";
  age.default_value = 30;
  o.columns = {city, device, id, age};
  return o;
}

constexpr char kHeader[] = "id,age,city,clicked,price,device";

TEST(CsvParserTest, HeaderGivesTheSchema) {
  auto p = CsvParser::Create(CsvOptions(), kHeader, "/data/a.csv");
  ASSERT_TRUE(p.ok()) << p.status();
  const Schema& s = (*p)->schema();
  EXPECT_EQ(s.dense, (std::vector<std::string>{"age", "price"}));  // Undeclared: dense.
  ASSERT_EQ(s.fields.size(), 2u);
  EXPECT_EQ(s.fields[0].name, "city");
  EXPECT_EQ(s.fields[0].base, 0u);
  EXPECT_EQ(s.fields[0].size, 1000u);
  EXPECT_EQ(s.fields[1].name, "device");
  EXPECT_EQ(s.fields[1].base, 1000u);
  EXPECT_EQ(s.fields[1].size, 10u);
  EXPECT_EQ(s.key_space, 1010u);
}

TEST(CsvParserTest, RowsWithDenseCategoricalAndMissingCells) {
  auto p = CsvParser::Create(CsvOptions(), kHeader, "/data/a.csv");
  ASSERT_TRUE(p.ok());
  Example a, b, c;
  ParseError err;
  ASSERT_EQ((*p)->Parse("17, 41 ,Paris,1,9.5,phone", &a, &err), ParseOutcome::kExample)
      << err.expected;
  EXPECT_EQ(a.label, 1);
  EXPECT_EQ(a.dense, (std::vector<float>{41, 9.5f}));
  ASSERT_EQ(a.keys.size(), 2u);
  EXPECT_GE(a.keys[0], 1u);  // Key 0 of the field is for a missing value.
  EXPECT_LT(a.keys[0], 1000u);
  EXPECT_GE(a.keys[1], 1001u);
  EXPECT_LT(a.keys[1], 1010u);
  EXPECT_EQ(a.values, (std::vector<float>{1, 1}));
  // Missing cells: the column's default (age), the set's missing_value (price), the field's
  // first key; "NA" is missing too.
  ASSERT_EQ((*p)->Parse("18,,NA,0,,", &b, &err), ParseOutcome::kExample) << err.expected;
  EXPECT_EQ(b.label, 0);
  EXPECT_EQ(b.dense, (std::vector<float>{30, -1}));
  EXPECT_EQ(b.keys, (std::vector<uint64_t>{0, 1000}));
  // The same value, the same key, in any row.
  ASSERT_EQ((*p)->Parse("19,1,\"Paris\",0,1,phone", &c, &err), ParseOutcome::kExample);
  EXPECT_EQ(c.keys, a.keys);
}

TEST(CsvParserTest, QuotedCellsAndTsv) {
  DatasetOptions o;
  o.format = DataFormat::kTsv;
  ColumnOptions name;
  name.name = "name";
  name.kind = ColumnKind::kCategorical;
  o.columns = {name};
  auto p = CsvParser::Create(o, "label\tname\tx", "/d.tsv");
  ASSERT_TRUE(p.ok()) << p.status();
  Example e, f;
  ParseError err;
  ASSERT_EQ((*p)->Parse("1\t\"a \"\"quoted\"\"\tname\"\t 2.5", &e, &err), ParseOutcome::kExample)
      << err.expected;
  ASSERT_EQ((*p)->Parse("1\ta \"quoted\"\tname\t2.5", &f, &err), ParseOutcome::kError);
  // A tab splits the unquoted cell: "name" falls in the dense column.
  EXPECT_EQ(err.expected, "expected a number in column 'x', found 'name'");
  EXPECT_EQ(e.dense, (std::vector<float>{2.5f}));
  Example g;
  ASSERT_EQ((*p)->Parse("1\ta \"quoted\"\t2.5", &g, &err), ParseOutcome::kExample);
  EXPECT_NE(e.keys[0], g.keys[0]);  // "a \"quoted\"\tname" differs from "a \"quoted\"".
  // Commas are data in TSV.
  ASSERT_EQ((*p)->Parse("0\tx,y\t1", &g, &err), ParseOutcome::kExample);
}

TEST(CsvParserTest, MalformedRowsNameTheColumnAndWhatWasExpected) {
  auto p = CsvParser::Create(CsvOptions(), kHeader, "/data/a.csv");
  ASSERT_TRUE(p.ok());
  struct Case {
    std::string line;
    size_t column;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"1,2,x,1,abc,y", 9, "expected a number in column 'price', found 'abc'"},
           {"1,2,x,1,3", 10, "expected 6 columns (as in the header), found 5"},
           {"1,2,x,1,3,y,z", 13, "expected 6 columns (as in the header), found more"},
           {"1,2,x,,3,y", 7, "expected a label in {-1, 0, 1} in column 'clicked', found ''"},
           {"1,2,x,yes,3,y", 7, "expected a label in {-1, 0, 1} in column 'clicked', found 'yes'"},
           {"1,2,\"x,1,3,y", 5, "expected a closing quote before the end of the line"},
           {"1,2,\"x\"z,1,3,y", 8, "expected ',' after the closing quote, found 'z'"},
       }) {
    Example e;
    ParseError err;
    ASSERT_EQ((*p)->Parse(c.line, &e, &err), ParseOutcome::kError) << c.line;
    EXPECT_EQ(err.column, c.column) << c.line;
    EXPECT_EQ(err.expected, c.expected) << c.line;
  }
  Example e;
  ParseError err;
  EXPECT_EQ((*p)->Parse("   ", &e, &err), ParseOutcome::kNoData);
}

TEST(CsvParserTest, HeadersOfOtherFilesMustMatch) {
  auto p = CsvParser::Create(CsvOptions(), kHeader, "/data/a.csv");
  ASSERT_TRUE(p.ok());
  ParseError err;
  EXPECT_TRUE((*p)->CheckHeader(kHeader, &err));
  EXPECT_TRUE((*p)->has_header());
  ASSERT_FALSE((*p)->CheckHeader("id,age,town,clicked,price,device", &err));
  EXPECT_EQ(err.column, 8u);
  EXPECT_EQ(err.expected, "expected the header of /data/a.csv: column 3 'city', found 'town'");
  ASSERT_FALSE((*p)->CheckHeader("id,age,city,clicked,price,device,extra", &err));
  EXPECT_EQ(err.column, 34u);
  EXPECT_EQ(err.expected, "expected the header of /data/a.csv (6 columns), found 7 columns");
}

TEST(CsvParserTest, OptionsThatDoNotFitTheHeaderAreInvalidArguments) {
  DatasetOptions o = CsvOptions();
  o.label_column = "label";
  auto p = CsvParser::Create(o, kHeader, "/data/a.csv");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "label_column: 'label' is not a column of /data/a.csv (its header: id, age, city, "
            "clicked, price, device)");
  o = CsvOptions();
  o.columns[1].name = "browser";
  p = CsvParser::Create(o, kHeader, "/data/a.csv");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message().substr(0, 54),
            "columns[1].name: 'browser' is not a column of /data/a.");
  p = CsvParser::Create(CsvOptions(), "id,age,city,clicked,age,device", "/data/b.csv");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(p.status().message(),
            "/data/b.csv:1:21: expected a column name not used before, found 'age' again");
}

TEST(CsvParserTest, Log1pTransformOfDenseValues) {
  DatasetOptions o;
  o.format = DataFormat::kCsv;
  o.dense_transform = DenseTransform::kLog1p;
  auto p = CsvParser::Create(o, "label,a,b", "/x.csv");
  ASSERT_TRUE(p.ok());
  Example e;
  ParseError err;
  ASSERT_EQ((*p)->Parse("1,3,-3", &e, &err), ParseOutcome::kExample);
  EXPECT_FLOAT_EQ(e.dense[0], std::log(4.0f));
  EXPECT_FLOAT_EQ(e.dense[1], -std::log(4.0f));
}

}  // namespace
}  // namespace pscluster::data
