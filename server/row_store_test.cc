// The disk tier's key-value store: rows written in one batch are read back one at a time and
// several at once (GetMany), absent keys read as absent, and the directory goes with the store.
// RemoveAbandoned: the disk tiers that killed servers left under --spill_dir are removed (with a
// restore's table file not yet added), those a live process holds are not, and nothing else in
// the directory is touched.
#include "server/row_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "rocksdb/db.h"

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

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// A database left as a killed server leaves it: closed, not destroyed.
void MakeDatabase(const std::string& path) {
  rocksdb::Options o;
  o.create_if_missing = true;
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(o, path, &db).ok()) << path;
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "k", "v").ok());
  delete db;
}

TEST(RowStoreTest, RemoveAbandonedTakesDeadServersTiersAndLeavesLiveOnesAndOtherFiles) {
  const std::string dir = TempDir() + "/abandoned";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  // Named as Job names them: <job>.<pid>.<job object>.<table>, pids of no live process here.
  const std::string dead = dir + "/job.999990.1.emb", held = dir + "/job.999991.1.emb";
  MakeDatabase(dead);
  MakeDatabase(held);
  // A restore killed while it wrote a table file of its own.
  std::ofstream(dead + "/bulk-3.sst") << "partial";
  std::ofstream(dir + "/notes.txt") << "not a database";
  ASSERT_EQ(mkdir((dir + "/empty").c_str(), 0755), 0);

  // Another process holds the second database's lock, as a live server sharing the directory.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int fd = open((held + "/LOCK").c_str(), O_RDWR);
    struct flock f = {};
    f.l_type = F_WRLCK;
    f.l_whence = SEEK_SET;
    const char ok = (fd >= 0 && fcntl(fd, F_SETLK, &f) == 0) ? 'y' : 'n';
    (void)!write(ready[1], &ok, 1);
    pause();
    _exit(0);
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  ASSERT_EQ(ok, 'y');

  auto removed = RowStore::RemoveAbandoned(dir);
  ASSERT_TRUE(removed.ok()) << removed.status();
  ASSERT_EQ(removed->size(), 1u);
  EXPECT_EQ((*removed)[0], dead);
  EXPECT_FALSE(Exists(dead)) << "the table file of the killed restore is gone with it";
  EXPECT_TRUE(Exists(held + "/CURRENT")) << "a live process's database stays";
  EXPECT_TRUE(Exists(dir + "/notes.txt"));
  EXPECT_TRUE(Exists(dir + "/empty"));

  // Once that process is gone, its database goes too.
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  removed = RowStore::RemoveAbandoned(dir);
  ASSERT_TRUE(removed.ok()) << removed.status();
  ASSERT_EQ(removed->size(), 1u);
  EXPECT_EQ((*removed)[0], held);
  EXPECT_FALSE(Exists(held));
  EXPECT_TRUE(Exists(dir + "/notes.txt"));
}

TEST(RowStoreTest, RemoveAbandonedNamesADirectoryItCannotList) {
  auto removed = RowStore::RemoveAbandoned(TempDir() + "/no-such-dir");
  ASSERT_FALSE(removed.ok());
  EXPECT_NE(removed.status().message().find("--spill_dir " + TempDir() + "/no-such-dir"),
            std::string::npos)
      << removed.status();
}

}  // namespace
}  // namespace pscluster
