#include "worker/data/libsvm_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pscluster::data {
namespace {

struct Parsed {
  ParseOutcome outcome;
  Example example;
  ParseError error;
};

Parsed Parse(const LibSvmParser& p, const std::string& line) {
  Parsed r;
  r.outcome = p.Parse(line, &r.example, &r.error);
  return r;
}

TEST(LibSvmParserTest, FeaturesInOneBasedIndices) {
  DatasetOptions o;
  LibSvmParser p(o);
  Parsed r = Parse(p, "+1 3:0.5 1:2\t10:-1e-3  ");
  ASSERT_EQ(r.outcome, ParseOutcome::kExample) << r.error.expected;
  EXPECT_EQ(r.example.label, 1);
  EXPECT_EQ(r.example.keys, (std::vector<uint64_t>{2, 0, 9}));
  EXPECT_EQ(r.example.values, (std::vector<float>{0.5f, 2.0f, -1e-3f}));
  EXPECT_TRUE(r.example.dense.empty());
  EXPECT_EQ(p.schema().key_space, 0u);
  EXPECT_TRUE(p.schema().fields.empty());
}

TEST(LibSvmParserTest, BinaryLabelsInBothConventions) {
  DatasetOptions o;
  LibSvmParser p(o);
  for (auto [text, label] : std::vector<std::pair<std::string, int>>{
           {"-1 1:1", 0}, {"0 1:1", 0}, {"1 1:1", 1}, {"+1 1:1", 1}, {"1.0 1:1", 1}}) {
    Parsed r = Parse(p, text);
    ASSERT_EQ(r.outcome, ParseOutcome::kExample) << text;
    EXPECT_EQ(r.example.label, label) << text;
  }
  Parsed r = Parse(p, "2 1:1");
  ASSERT_EQ(r.outcome, ParseOutcome::kError);
  EXPECT_EQ(r.error.column, 1u);
  EXPECT_EQ(r.error.expected, "expected a label in {-1, 0, 1}, found '2'");
  r = Parse(p, "0.5 1:1");
  ASSERT_EQ(r.outcome, ParseOutcome::kError);
  EXPECT_EQ(r.error.expected, "expected a label in {-1, 0, 1}, found '0.5'");
}

TEST(LibSvmParserTest, MultiClassLabelsFromABase) {
  DatasetOptions o;
  o.num_classes = 10;
  o.label_base = 1;
  LibSvmParser p(o);
  EXPECT_EQ(Parse(p, "1 4:1").example.label, 0);
  EXPECT_EQ(Parse(p, "10 4:1").example.label, 9);
  Parsed r = Parse(p, "  11 4:1");
  ASSERT_EQ(r.outcome, ParseOutcome::kError);
  EXPECT_EQ(r.error.column, 3u);
  EXPECT_EQ(r.error.expected, "expected an integer label in [1, 10], found '11'");
  EXPECT_EQ(Parse(p, "-1 4:1").outcome, ParseOutcome::kError);
  EXPECT_EQ(Parse(p, "0 4:1").outcome, ParseOutcome::kError);
}

TEST(LibSvmParserTest, ZeroBasedIndicesAndABoundedKeySpace) {
  DatasetOptions o;
  o.index_base = 0;
  o.num_features = 100;
  LibSvmParser p(o);
  EXPECT_EQ(p.schema().key_space, 100u);
  Parsed r = Parse(p, "1 0:1 99:2");
  ASSERT_EQ(r.outcome, ParseOutcome::kExample);
  EXPECT_EQ(r.example.keys, (std::vector<uint64_t>{0, 99}));
  r = Parse(p, "1 0:1 100:2");
  ASSERT_EQ(r.outcome, ParseOutcome::kError);
  EXPECT_EQ(r.error.column, 7u);
  EXPECT_EQ(r.error.expected, "expected a feature index in [0, 99], found '100:2'");
  // One-based: index 0 is out.
  DatasetOptions one;
  LibSvmParser q(one);
  r = Parse(q, "1 0:1");
  ASSERT_EQ(r.outcome, ParseOutcome::kError);
  EXPECT_EQ(r.error.expected, "expected a feature index >= 1, found '0:1'");
}

TEST(LibSvmParserTest, QidIsIgnoredCommentsAndBlankLinesHoldNothing) {
  DatasetOptions o;
  LibSvmParser p(o);
  Parsed r = Parse(p, "1 qid:17 2:0.5 # a comment 3:4");
  ASSERT_EQ(r.outcome, ParseOutcome::kExample);
  EXPECT_EQ(r.example.keys, (std::vector<uint64_t>{1}));
  r = Parse(p, "0# comment right after the label");
  ASSERT_EQ(r.outcome, ParseOutcome::kExample);
  EXPECT_TRUE(r.example.keys.empty());
  EXPECT_EQ(Parse(p, "").outcome, ParseOutcome::kNoData);
  EXPECT_EQ(Parse(p, " \t ").outcome, ParseOutcome::kNoData);
  EXPECT_EQ(Parse(p, "# 1 2:3").outcome, ParseOutcome::kNoData);
  EXPECT_FALSE(p.HasData("  # x"));
  EXPECT_TRUE(p.HasData(" 1"));
}

TEST(LibSvmParserTest, MalformedFeaturesNameTheColumnAndWhatWasExpected) {
  DatasetOptions o;
  LibSvmParser p(o);
  struct Case {
    std::string line;
    size_t column;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"1 3=0.5", 4, "expected ':' after the feature index, found '=0.5'"},
           {"1 3:abc", 5, "expected a feature value (a number), found 'abc'"},
           {"1 3:", 5, "expected a feature value (a number), found ''"},
           {"1 3:0.5x 4:1", 8,
            "expected a space or the end of the line after the value, found 'x'"},
           {"1 x:1", 3, "expected a feature 'index:value', found 'x:1'"},
           {"1 qid:a 2:1", 7, "expected a query id (an integer) after 'qid:', found 'a'"},
           {"yes 1:1", 1, "expected a label in {-1, 0, 1}, found 'yes'"},
           {"1 2:nan", 5, "expected a feature value (a number), found 'nan'"},
           {"1 99999999999999999999:1", 3,
            "expected a feature 'index:value', found "
            "'99999999999999999999:1'"},
       }) {
    Parsed r = Parse(p, c.line);
    ASSERT_EQ(r.outcome, ParseOutcome::kError) << c.line;
    EXPECT_EQ(r.error.column, c.column) << c.line;
    EXPECT_EQ(r.error.expected, c.expected) << c.line;
  }
}

}  // namespace
}  // namespace pscluster::data
