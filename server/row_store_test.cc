// The disk tier's key-value store: rows written in one batch are read back one at a time and
// several at once (GetMany), absent keys read as absent, and the directory goes with the store.
#include "server/row_store.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace pscluster {
namespace {

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

TEST(RowStoreTest, RowsWrittenTogetherAreReadOneByOneAndSeveralAtOnce) {
  const std::string path = TempDir() + "/row_store";
  {
    auto store = RowStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<std::pair<uint64_t, std::string>> rows;
    for (uint64_t k = 0; k < 1000; k += 2) rows.emplace_back(k * 0x9e3779b9ULL, std::to_string(k));
    ASSERT_TRUE((*store)->PutAll(rows).ok());
    ASSERT_TRUE((*store)->Delete(10 * 0x9e3779b9ULL).ok());
    std::string v;
    EXPECT_TRUE((*store)->Get(4 * 0x9e3779b9ULL, &v));
    EXPECT_EQ(v, "4");
    EXPECT_FALSE((*store)->Get(5 * 0x9e3779b9ULL, &v));
    // Present, absent, deleted, present again and a key twice, in no particular order.
    const std::vector<uint64_t> keys = {998 * 0x9e3779b9ULL, 3 * 0x9e3779b9ULL,
                                        10 * 0x9e3779b9ULL, 0, 998 * 0x9e3779b9ULL, ~0ULL};
    std::vector<std::string> got;
    ASSERT_TRUE((*store)->GetMany(keys, &got).ok());
    EXPECT_EQ(got, (std::vector<std::string>{"998", "", "", "0", "998", ""}));
    ASSERT_TRUE((*store)->GetMany({}, &got).ok());
    EXPECT_TRUE(got.empty());
  }
  struct stat st;
  EXPECT_NE(stat(path.c_str(), &st), 0) << "the directory goes with the store";
}

}  // namespace
}  // namespace pscluster
