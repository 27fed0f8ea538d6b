#include "worker/data/criteo_parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pscluster::data {
namespace {

// label, I1..I13, C1..C26.
std::string Line(const std::string& label, std::vector<std::string> ints,
                 std::vector<std::string> cats) {
  ints.resize(13);
  cats.resize(26);
  return absl::StrCat(label, "\t", absl::StrJoin(ints, "\t"), "\t", absl::StrJoin(cats, "\t"));
}

TEST(CriteoParserTest, LabelIntegersAndHashedCategories) {
  DatasetOptions o;
  o.format = DataFormat::kCriteo;
  o.hash_buckets = 1 << 16;
  o.missing_value = -7;
  CriteoParser p(o);
  const Schema& s = p.schema();
  ASSERT_EQ(s.dense.size(), 13u);
  EXPECT_EQ(s.dense[12], "I13");
  ASSERT_EQ(s.fields.size(), 26u);
  EXPECT_EQ(s.fields[25].name, "C26");
  EXPECT_EQ(s.fields[25].base, 25u << 16);
  EXPECT_EQ(s.key_space, 26u << 16);

  std::vector<std::string> ints = {"1", "", "-2", "100"};
  std::vector<std::string> cats = {"68fd1e64", "80e26c9b", "", "68fd1e64"};
  for (int i = 4; i < 26; ++i) cats.push_back(absl::StrCat("c", i));
  Example e;
  ParseError err;
  ASSERT_EQ(p.Parse(Line("1", ints, cats), &e, &err), ParseOutcome::kExample) << err.expected;
  EXPECT_EQ(e.label, 1);
  ASSERT_EQ(e.dense.size(), 13u);
  EXPECT_EQ(e.dense[0], 1);
  EXPECT_EQ(e.dense[1], -7);  // Missing.
  EXPECT_EQ(e.dense[2], -2);
  EXPECT_EQ(e.dense[3], 100);
  EXPECT_EQ(e.dense[12], -7);
  ASSERT_EQ(e.keys.size(), 26u);
  for (int f = 0; f < 26; ++f) {
    EXPECT_GE(e.keys[f], s.fields[f].base) << f;
    EXPECT_LT(e.keys[f], s.fields[f].base + s.fields[f].size) << f;
  }
  EXPECT_EQ(e.keys[2], s.fields[2].base);  // Missing: the field's first key.
  EXPECT_NE(e.keys[0], s.fields[0].base);
  EXPECT_EQ(e.keys[3] - s.fields[3].base, e.keys[0] - s.fields[0].base);  // Same hash, own range.
  EXPECT_EQ(e.values, std::vector<float>(26, 1.0f));
}

TEST(CriteoParserTest, Log1pOfCounts) {
  DatasetOptions o;
  o.format = DataFormat::kCriteo;
  o.dense_transform = DenseTransform::kLog1p;
  CriteoParser p(o);
  Example e;
  ParseError err;
  ASSERT_EQ(p.Parse(Line("0", {"0", "9", "-1"}, {}), &e, &err), ParseOutcome::kExample);
  EXPECT_EQ(e.dense[0], 0);
  EXPECT_FLOAT_EQ(e.dense[1], std::log(10.0f));
  EXPECT_FLOAT_EQ(e.dense[2], -std::log(2.0f));
  EXPECT_EQ(e.dense[3], 0);  // Missing (0), not transformed.
}

TEST(CriteoParserTest, MalformedLinesNameTheColumnAndWhatWasExpected) {
  DatasetOptions o;
  o.format = DataFormat::kCriteo;
  CriteoParser p(o);
  std::string good = Line("1", {"5"}, {"aa"});
  struct Case {
    std::string line;
    size_t column;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {Line("1", {"5", "x7"}, {}), 5, "expected an integer (I2) or nothing, found 'x7'"},
           {Line("1", {"5", "2.5"}, {}), 5, "expected an integer (I2) or nothing, found '2.5'"},
           {Line("2", {}, {}), 1, "expected a label in {-1, 0, 1}, found '2'"},
           {Line("", {}, {}), 1, "expected a label in {-1, 0, 1}, found ''"},
           {good + "\textra", good.size() + 1,
            "expected 40 tab-separated cells (label, I1-I13, C1-C26), found more"},
           {good.substr(0, good.rfind('\t')), good.rfind('\t') + 1,
            "expected 40 tab-separated cells (label, I1-I13, C1-C26), found 39"},
       }) {
    Example e;
    ParseError err;
    ASSERT_EQ(p.Parse(c.line, &e, &err), ParseOutcome::kError) << c.line;
    EXPECT_EQ(err.column, c.column) << c.line;
    EXPECT_EQ(err.expected, c.expected) << c.line;
  }
  Example e;
  ParseError err;
  EXPECT_EQ(p.Parse("", &e, &err), ParseOutcome::kNoData);
}

}  // namespace
}  // namespace pscluster::data
