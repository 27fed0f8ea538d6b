// Crash-safe writes against a file system that models what a crash keeps
// (testing/fault_injection_fs.h), and the POSIX file system on a real directory.
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/file_system.h"
#include "common/testing/fault_injection_fs.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::pscluster::testing::FaultInjectionFileSystem;
using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::AnyOf;
using ::testing::ElementsAre;
using ::testing::Eq;
using ::testing::HasSubstr;

// A StatusOr that is OK and whose value matches `m`.
MATCHER_P(IsOkAndHolds, m, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(m, *arg, result_listener);
}

constexpr char kPath[] = "/ckpt/job/server-1-step20.ckpt";

// A file system holding kPath with `old` durably.
void Prepare(FaultInjectionFileSystem& fs, const std::string& old) {
  ASSERT_THAT(fs.MakeDirs("/ckpt/job"), IsOk());
  ASSERT_THAT(WriteFileAtomically(&fs, kPath, old), IsOk());
  fs.Crash();  // Nothing but what is durable.
  ASSERT_THAT(fs.ReadFile(kPath), IsOkAndHolds(old));
}

// A crash after each step of the write (create, append, sync, close, rename, directory sync):
// the file then holds the old contents or the new ones, never a mix and never nothing; once the
// write returned OK, the new ones.
TEST(WriteFileAtomicallyTest, ACrashAfterAnyStepLeavesTheOldOrTheNewContents) {
  const std::string old_data(1000, 'o'), new_data(3000, 'n');
  int steps = 0;
  {
    FaultInjectionFileSystem fs;
    Prepare(fs, old_data);
    const int before = fs.ops();
    ASSERT_THAT(WriteFileAtomically(&fs, kPath, new_data), IsOk());
    steps = fs.ops() - before;
  }
  ASSERT_EQ(steps, 6);
  for (int k = 0; k <= steps; ++k) {
    SCOPED_TRACE(::testing::Message() << "crash after " << k << " of " << steps << " steps");
    FaultInjectionFileSystem fs;
    Prepare(fs, old_data);
    fs.CrashAfter(k);
    absl::Status s = WriteFileAtomically(&fs, kPath, new_data);
    EXPECT_EQ(s.ok(), k == steps) << s;
    fs.Crash();
    auto after = fs.ReadFile(kPath);
    ASSERT_THAT(after, IsOk());
    if (k == steps) {
      EXPECT_EQ(*after, new_data);
    } else {
      EXPECT_THAT(*after, AnyOf(Eq(old_data), Eq(new_data)));
    }
  }
}

// The model is strict enough to catch a write that skips a step: renamed but the directory not
// synced, the new contents are gone after a crash; not synced before the rename, the file is
// empty. (This is why WriteFileAtomically does both.)
TEST(WriteFileAtomicallyTest, TheModelLosesWhatWasNotMadeDurable) {
  FaultInjectionFileSystem fs;
  Prepare(fs, "old");
  {
    auto f = fs.NewWritableFile("/ckpt/job/tmp1");
    ASSERT_THAT(f, IsOk());
    ASSERT_THAT((*f)->Append("new"), IsOk());
    ASSERT_THAT((*f)->Sync(), IsOk());
    ASSERT_THAT(fs.Rename("/ckpt/job/tmp1", kPath), IsOk());
  }
  fs.Crash();
  EXPECT_THAT(fs.ReadFile(kPath), IsOkAndHolds("old"));
  {
    auto f = fs.NewWritableFile("/ckpt/job/tmp2");
    ASSERT_THAT(f, IsOk());
    ASSERT_THAT((*f)->Append("new"), IsOk());
    ASSERT_THAT(fs.Rename("/ckpt/job/tmp2", kPath), IsOk());
    ASSERT_THAT(fs.SyncDir("/ckpt/job"), IsOk());
  }
  fs.Crash();
  EXPECT_THAT(fs.ReadFile(kPath), IsOkAndHolds(""));
}

// A step that fails (disk full on write, an I/O error on fsync or rename) is reported naming the
// file, leaves the target as it was and removes the temporary file.
TEST(WriteFileAtomicallyTest, AFailedStepChangesNothingAndLeavesNoTemporaryFile) {
  using Op = FaultInjectionFileSystem::Op;
  for (Op op : {Op::kAppend, Op::kSync, Op::kRename}) {
    SCOPED_TRACE(static_cast<int>(op));
    FaultInjectionFileSystem fs;
    Prepare(fs, "old");
    fs.FailNext(op, absl::ResourceExhaustedError("no space left on device"));
    absl::Status s = WriteFileAtomically(&fs, kPath, "new contents");
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted,
                            HasSubstr("no space left on device")));
    EXPECT_THAT(s.message(), HasSubstr("/ckpt/job/server-1-step20.ckpt"));
    EXPECT_THAT(fs.ReadFile(kPath), IsOkAndHolds("old"));
    EXPECT_THAT(fs.Files(), ElementsAre(kPath));
  }
}

TEST(PosixFileSystemTest, WritesListsReadsAndRemoves) {
  FileSystem* fs = FileSystem::Default();
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/fs/a/b";
  ASSERT_THAT(fs->MakeDirs(dir), IsOk());
  ASSERT_THAT(WriteFileAtomically(fs, dir + "/x", "one"), IsOk());
  ASSERT_THAT(WriteFileAtomically(fs, dir + "/x", "two"), IsOk());
  EXPECT_THAT(fs->ReadFile(dir + "/x"), IsOkAndHolds("two"));
  EXPECT_THAT(fs->ReadFileRange(dir + "/x", 1, 1), IsOkAndHolds("w"));
  EXPECT_THAT(fs->ReadFileRange(dir + "/x", 1, 10), IsOkAndHolds("wo"));  // Cut at the end.
  EXPECT_THAT(fs->ReadFileRange(dir + "/x", 7, 2), IsOkAndHolds(""));
  EXPECT_THAT(fs->ListDir(dir), IsOkAndHolds(ElementsAre("x")));
  EXPECT_THAT(fs->MakeDirs(dir + "/x"), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(fs->Remove(dir + "/x"), IsOk());
  EXPECT_THAT(fs->ReadFile(dir + "/x"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir + "/x")));
  EXPECT_THAT(fs->ListDir(dir + "/none"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(fs->ReadFileRange(dir + "/x", 0, 4),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir + "/x")));
}

}  // namespace
}  // namespace pscluster
