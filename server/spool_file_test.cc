// SpoolFile: an anonymous file (never seen in its directory), written once and read in pieces;
// errors name the directory.
#include "server/spool_file.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

namespace pscluster {
namespace {

int Entries(const std::string& dir) {
  int n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) n += std::string(e->d_name) != "." &&
                                              std::string(e->d_name) != "..";
    closedir(d);
  }
  return n;
}

TEST(SpoolFileTest, IsNeverSeenInItsDirectoryAndReadsBackWhatWasAppended) {
  const std::string dir = ::testing::TempDir() + "/spool";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  auto f = SpoolFile::Create(dir, "test snapshot");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Entries(dir), 0) << "unlinked as soon as it was made";
  std::string all;
  for (int i = 0; i < 100; ++i) {
    const std::string piece(1000 + i * 37, static_cast<char>('a' + i % 26));
    ASSERT_TRUE((*f)->Append(piece).ok());
    all += piece;
  }
  EXPECT_EQ((*f)->size(), all.size());
  std::string scratch;
  for (uint64_t off : {uint64_t{0}, uint64_t{999}, uint64_t{all.size() - 10}}) {
    auto got = (*f)->Read(off, 10, &scratch);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, all.substr(off, 10));
  }
  SpoolCheckpointSource source(*f);
  auto whole = source.Read(0, all.size(), &scratch);
  ASSERT_TRUE(whole.ok());
  EXPECT_TRUE(*whole == all);
  auto past = source.Read(all.size() - 5, 6, &scratch);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(past.status().message().find(dir), std::string::npos) << past.status();
}

TEST(SpoolFileTest, AMissingDirectoryIsRefusedNamingIt) {
  const std::string dir = ::testing::TempDir() + "/no-such-dir";
  auto f = SpoolFile::Create(dir, "seed of job 'j'");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(f.status().message().find(dir), std::string::npos) << f.status();
  EXPECT_NE(f.status().message().find("seed of job 'j'"), std::string::npos) << f.status();
}

}  // namespace
}  // namespace pscluster
