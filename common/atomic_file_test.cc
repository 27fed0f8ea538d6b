#include "common/atomic_file.h"

#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

namespace pscluster {
namespace {

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  std::string base = t ? t : "/tmp";
  char tmpl[4096];
  snprintf(tmpl, sizeof(tmpl), "%s/atomicXXXXXX", base.c_str());
  return mkdtemp(tmpl);
}

int CountEntries(const std::string& dir) {
  int n = 0;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

TEST(AtomicFileTest, WritesReplacesAndLeavesNoTempFiles) {
  std::string dir = TempDir();
  std::string path = dir + "/f.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  EXPECT_EQ(*ReadFile(path), "first");
  std::string big(3 << 20, 'x');
  big[12345] = '\0';
  ASSERT_TRUE(WriteFileAtomically(path, big).ok());
  EXPECT_EQ(*ReadFile(path), big);
  EXPECT_EQ(CountEntries(dir), 1);
}

TEST(AtomicFileTest, ErrorsNameThePath) {
  absl::Status s = WriteFileAtomically("/nonexistent-dir/x/y", "data");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/nonexistent-dir/x/y"), std::string::npos) << s;
  auto r = ReadFile("/nonexistent-dir/z");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent-dir/z"), std::string::npos);
}

TEST(AtomicFileTest, MakeDirsCreatesParents) {
  std::string dir = TempDir() + "/a/b/c";
  ASSERT_TRUE(MakeDirs(dir).ok());
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_TRUE(MakeDirs(dir).ok());  // Idempotent.
  std::string file = dir + "/file";
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  EXPECT_EQ(MakeDirs(file).code(), absl::StatusCode::kFailedPrecondition);
}

// A path the caller got wrong is the caller's error (INVALID_ARGUMENT), not the server's
// (INTERNAL): a directory under a file, a file path that is a directory, a name too long.
TEST(AtomicFileTest, UnusablePathsAreInvalidArguments) {
  std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/file", "x").ok());
  EXPECT_EQ(MakeDirs(dir + "/file/sub").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteFileAtomically(dir + "/file/x", "y").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadFile(dir).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadFile(dir + "/" + std::string(300, 'n')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pscluster
