#include "worker/data/fashion_mnist.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>

#include "common/atomic_file.h"

namespace pscluster::data {
namespace {

std::string TmpDir(const char* name) {
  std::string d = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

void WriteGz(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, data.data(), data.size()), static_cast<int>(data.size()));
  gzclose(f);
}

std::string IdxHeader(std::initializer_list<uint32_t> dims) {
  std::string h = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) h.push_back(static_cast<char>((d >> s) & 0xff));
  }
  return h;
}

TEST(FashionMnistTest, LoadsTheInstalledDataSet) {
  auto ds = LoadFashionMnist("");
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(ds->train.n, 60000);
  EXPECT_EQ(ds->test.n, 10000);
  EXPECT_EQ(ds->train.dim, 784);
  EXPECT_EQ(ds->train.x.size(), 60000u * 784);
  // Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class.
  std::vector<int> train_counts(10), test_counts(10);
  for (int32_t y : ds->train.y) ++train_counts.at(y);
  for (int32_t y : ds->test.y) ++test_counts.at(y);
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(train_counts[c], 6000) << c;
    EXPECT_EQ(test_counts[c], 1000) << c;
  }
  // Standardised with the training set's statistics.
  double sum = 0, sq = 0;
  for (float v : ds->train.x) {
    sum += v;
    sq += double{v} * v;
  }
  double mean = sum / ds->train.x.size();
  EXPECT_NEAR(mean, 0.0, 1e-4);
  EXPECT_NEAR(std::sqrt(sq / ds->train.x.size() - mean * mean), 1.0, 1e-3);
}

TEST(FashionMnistTest, MissingDirectoryNamesTheFileAndPackage) {
  auto ds = LoadFashionMnist("/nonexistent/fashion");
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(ds.status().message().find("/nonexistent/fashion/train-images-idx3-ubyte.gz"),
            std::string::npos);
  EXPECT_NE(ds.status().message().find("dataset-fashion-mnist"), std::string::npos);
}

TEST(FashionMnistTest, TruncatedFileIsDataLoss) {
  std::string dir = TmpDir("truncated");
  std::string data = IdxHeader({10, 28, 28}) + std::string(28 * 28 * 9, '\x01');  // One short.
  WriteGz(dir + "/x.gz", data);
  auto idx = ReadIdx(dir + "/x.gz");
  EXPECT_EQ(idx.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(idx.status().message().find("truncated"), std::string::npos) << idx.status();
}

TEST(FashionMnistTest, BadMagicAndBadTypeAreRefused) {
  std::string dir = TmpDir("bad");
  WriteGz(dir + "/magic.gz", "PK\x03\x04 this is a zip file");
  EXPECT_EQ(ReadIdx(dir + "/magic.gz").status().code(), absl::StatusCode::kDataLoss);
  std::string wrong_type = IdxHeader({2});
  wrong_type[2] = 0x0d;  // float32 elements
  WriteGz(dir + "/type.gz", wrong_type + "12345678");
  auto s = ReadIdx(dir + "/type.gz").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("unsigned byte"), std::string::npos);
}

TEST(FashionMnistTest, LabelOutOfRangeIsNamed) {
  std::string dir = TmpDir("labels");
  WriteGz(dir + "/train-images-idx3-ubyte.gz", IdxHeader({2, 2, 2}) + std::string(8, '\0'));
  WriteGz(dir + "/train-labels-idx1-ubyte.gz", IdxHeader({2}) + std::string("\x03\x0b", 2));
  auto ds = LoadFashionMnist(dir);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ds.status().message().find("label 11 of example 1"), std::string::npos) << ds.status();
}

TEST(FashionMnistTest, CountMismatchIsNamed) {
  std::string dir = TmpDir("mismatch");
  WriteGz(dir + "/train-images-idx3-ubyte.gz", IdxHeader({3, 2, 2}) + std::string(12, '\0'));
  WriteGz(dir + "/train-labels-idx1-ubyte.gz", IdxHeader({2}) + std::string(2, '\0'));
  auto ds = LoadFashionMnist(dir);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ds.status().message().find("has 3 images but"), std::string::npos) << ds.status();
}

}  // namespace
}  // namespace pscluster::data
