// FindRecoveryPoint over real checkpoint files in the test's directory.
#include "scheduler/recovery.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/testing/status_matchers.h"
#include "common/checkpoint_file.h"
#include "common/testing/fault_injection_fs.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr uint32_t kShards = 8;

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    dir_ = root_ + "/job-1";
    ASSERT_THAT(MakeDirs(dir_), IsOk());
  }

  // Writes a checkpoint of `job` at `step` holding shards [first, last] as a server would.
  std::string Write(const std::string& server, int64_t step, uint32_t first, uint32_t last,
                    uint64_t epoch = 1, const std::string& job = "job-1",
                    uint32_t shards = kShards, FileSystem* fs = FileSystem::Default()) {
    v1::CheckpointHeader h;
    h.set_job_id(job);
    h.set_step(step);
    h.set_epoch(epoch);
    h.set_num_virtual_shards(shards);
    for (uint32_t s = first; s <= last; ++s) h.add_shards(s);
    std::string data(64, static_cast<char>(step));
    h.set_data_bytes(data.size());
    std::string f;
    AppendCheckpointHead(h, &f);
    f += data;
    AppendCheckpointTrailer(&f);
    std::string path = absl::StrCat(dir_, "/", server, "-step", step, ".ckpt");
    absl::Status written = WriteFileAtomically(fs, path, f);
    if (fs == FileSystem::Default()) {
      EXPECT_THAT(written, IsOk());
    }
    return path;
  }
  absl::StatusOr<RecoveryPoint> Find() { return FindRecoveryPoint(root_, "job-1", kShards, rollbacks_); }
  static std::vector<std::string> Paths(const RecoveryPoint& p) {
    std::vector<std::string> out;
    for (const auto& f : p.files) out.push_back(f.path());
    return out;
  }

  std::string root_, dir_;
  google::protobuf::RepeatedPtrField<v1::Rollback> rollbacks_;
};

TEST_F(RecoveryTest, NoCheckpointsMeansStartingAgainFromScratch) {
  auto p = FindRecoveryPoint(root_ + "/none", "job-1", kShards, rollbacks_);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 0);
  EXPECT_THAT(p->files, IsEmpty());
  p = FindRecoveryPoint("", "job-1", kShards, rollbacks_);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 0);
  p = Find();  // The job's directory exists but is empty.
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 0);
}

// With a root, the directory must lie in it, and a checkpoint file that is a symlink out of it
// is skipped (never read), naming the root.
TEST_F(RecoveryTest, ACheckpointRootConfinesWhatIsRead) {
  std::string a10 = Write("server-1", 10, 0, 3);
  std::string b10 = Write("server-2", 10, 4, 7);
  Write("server-1", 20, 0, 3);
  // server-2's step 20 "file" leads out of the root.
  const std::string outside = root_ + "-outside";
  ASSERT_THAT(MakeDirs(outside), IsOk());
  std::string real = Write("server-2", 20, 4, 7);
  ASSERT_EQ(std::rename(real.c_str(), (outside + "/b20.ckpt").c_str()), 0);
  ASSERT_EQ(symlink((outside + "/b20.ckpt").c_str(), real.c_str()), 0);

  auto unconfined = Find();
  ASSERT_THAT(unconfined, IsOk());
  EXPECT_EQ(unconfined->step, 20);  // Without a root the symlink is followed.

  auto p = FindRecoveryPoint(root_, "job-1", kShards, rollbacks_, root_);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 10);
  EXPECT_THAT(Paths(*p), UnorderedElementsAre(a10, b10));
  ASSERT_THAT(p->skipped, ElementsAre(HasSubstr(real)));
  EXPECT_THAT(p->skipped[0], HasSubstr(root_));

  EXPECT_THAT(FindRecoveryPoint(root_, "job-1", kShards, rollbacks_, outside),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr(outside)));
}

TEST_F(RecoveryTest, TheNewestStepThatCoversEveryShardWins) {
  std::string a10 = Write("server-1", 10, 0, 3);
  std::string b10 = Write("server-2", 10, 4, 7);
  Write("server-1", 20, 0, 3);  // server-2 died before writing step 20.
  auto p = Find();
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 10);
  EXPECT_THAT(Paths(*p), UnorderedElementsAre(a10, b10));
  EXPECT_THAT(p->skipped, IsEmpty());
  std::string b20 = Write("server-2", 20, 4, 7);
  p = Find();
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 20);
  EXPECT_THAT(Paths(*p), UnorderedElementsAre(dir_ + "/server-1-step20.ckpt", b20));
}

TEST_F(RecoveryTest, ADamagedFileIsSkippedAndAnOlderCompleteStepUsed) {
  std::string a10 = Write("server-1", 10, 0, 3);
  std::string b10 = Write("server-2", 10, 4, 7);
  Write("server-1", 20, 0, 3);
  std::string b20 = Write("server-2", 20, 4, 7);
  auto bytes = ReadFile(b20);
  ASSERT_THAT(bytes, IsOk());
  (*bytes)[bytes->size() / 2] ^= 0x40;  // A torn or rotten write the header does not show.
  ASSERT_THAT(WriteFileAtomically(b20, *bytes), IsOk());
  ASSERT_THAT(WriteFileAtomically(dir_ + "/server-3-step30.ckpt", "not a checkpoint"), IsOk());
  ASSERT_THAT(WriteFileAtomically(dir_ + "/notes.txt", "ignored"), IsOk());
  auto p = Find();
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 10);
  EXPECT_THAT(Paths(*p), UnorderedElementsAre(a10, b10));
  ASSERT_EQ(p->skipped.size(), 2u);
  EXPECT_THAT(p->skipped, UnorderedElementsAre(
                              AllOf(HasSubstr(b20), HasSubstr("checksum mismatch")),
                              AllOf(HasSubstr("server-3-step30.ckpt"),
                                    HasSubstr("not a pscluster checkpoint"))));
}

TEST_F(RecoveryTest, FilesOfAnotherJobOrLayoutAreSkipped) {
  Write("server-1", 10, 0, 3);
  Write("server-2", 10, 4, 7, 1, "job-2");           // Copied in from another job.
  Write("server-3", 10, 4, 7, 1, "job-1", kShards * 2);  // Another shard count.
  auto p = Find();
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 0);  // Shards 4-7 are covered by no usable file.
  EXPECT_THAT(p->skipped, UnorderedElementsAre(HasSubstr("belongs to job 'job-2'"),
                                               HasSubstr("has 16 virtual shards")));
}

TEST_F(RecoveryTest, CheckpointsOfAnAbandonedRunAreNeverRestored) {
  // Epoch 1 ran to step 30; a recovery rolled back to step 10 and placed the job at epoch 2.
  std::string a10 = Write("server-1", 10, 0, 3, 1);
  std::string b10 = Write("server-2", 10, 4, 7, 1);
  Write("server-1", 30, 0, 3, 1);
  Write("server-2", 30, 4, 7, 1);
  v1::Rollback* rb = rollbacks_.Add();
  rb->set_epoch(2);
  rb->set_step(10);
  auto p = Find();
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 10);
  EXPECT_THAT(Paths(*p), UnorderedElementsAre(a10, b10));
  EXPECT_THAT(p->skipped, UnorderedElementsAre(HasSubstr("abandoned"), HasSubstr("abandoned")));
  // The new run (epoch 2, on other servers) reaches step 20: that is newer and valid.
  std::string c20 = Write("server-3", 20, 0, 7, 2);
  p = Find();
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 20);
  EXPECT_THAT(Paths(*p), ElementsAre(c20));
}

TEST_F(RecoveryTest, ADirectoryThatCannotBeListedIsAnErrorNamingIt) {
  ASSERT_THAT(WriteFileAtomically(root_ + "/file", "x"), IsOk());
  EXPECT_THAT(FindRecoveryPoint(root_ + "/file", "job-1", kShards, rollbacks_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(root_ + "/file/job-1")));
}

TEST_F(RecoveryTest, EachServerGetsTheFilesOfTheShardsItHolds) {
  google::protobuf::RepeatedPtrField<v1::RestoreFile> files;
  auto add = [&](const std::string& path, std::vector<uint32_t> shards) {
    v1::RestoreFile* f = files.Add();
    f->set_path(path);
    for (uint32_t s : shards) f->add_shards(s);
  };
  add("a", {0, 1});
  add("b", {2, 3});
  v1::ShardMap map;
  map.set_num_virtual_shards(4);
  for (uint32_t s = 0; s < 4; ++s) {
    auto* a = map.add_assignments();
    a->set_shard(s);
    a->set_primary(s == 1 || s == 2 ? "server-9" : "server-8");
  }
  EXPECT_THAT(RestoreFilesFor(files, map, "server-9"), ElementsAre("a", "b"));
  EXPECT_THAT(RestoreFilesFor(files, map, "server-8"), ElementsAre("a", "b"));
  map.mutable_assignments(2)->set_primary("server-8");
  EXPECT_THAT(RestoreFilesFor(files, map, "server-9"), ElementsAre("a"));
  EXPECT_THAT(RestoreFilesFor(files, map, "server-7"), IsEmpty());
  // A backup restores its copies from the same files.
  map.mutable_assignments(2)->add_backups("server-7");
  EXPECT_THAT(RestoreFilesFor(files, map, "server-7"), ElementsAre("b"));
}

TEST(PromoteBackupsTest, BackupsOfTheLostServerBecomePrimariesAndNothingIsAdded) {
  v1::ShardMap map;
  map.set_job_id("j");
  map.set_epoch(4);
  map.set_num_virtual_shards(4);
  for (uint32_t s = 0; s < 4; ++s) {
    auto* a = map.add_assignments();
    a->set_shard(s);
    a->set_primary(absl::StrCat("s", s % 3));
    a->add_backups(absl::StrCat("s", (s + 1) % 3));
  }
  for (int i = 0; i < 3; ++i) {
    auto* e = map.add_servers();
    e->set_node_id(absl::StrCat("s", i));
    e->set_address(absl::StrCat("10.0.0.", i, ":7100"));
  }
  auto next = PromoteBackups(map, "s1", {"s0", "s2"});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->epoch(), 5u);
  // Shard 1 (s1, backup s2) goes to s2; s1 leaves the backups of shards 0 and 3.
  EXPECT_EQ(next->assignments(1).primary(), "s2");
  EXPECT_THAT(next->assignments(1).backups(), IsEmpty());
  EXPECT_EQ(next->assignments(0).primary(), "s0");
  EXPECT_THAT(next->assignments(0).backups(), IsEmpty());
  EXPECT_EQ(next->assignments(2).primary(), "s2");
  EXPECT_THAT(next->assignments(2).backups(), ElementsAre("s0"));
  EXPECT_EQ(next->assignments(3).primary(), "s0");
  EXPECT_THAT(next->assignments(3).backups(), IsEmpty());
  ASSERT_EQ(next->servers_size(), 2);
  EXPECT_EQ(next->servers(0).node_id(), "s0");
  EXPECT_EQ(next->servers(1).node_id(), "s2");
  // A lost primary whose backup is not alive either: no promotion.
  auto none = PromoteBackups(map, "s1", {"s0"});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(none.status().message()), ::testing::HasSubstr("shard 1"));
}

TEST(HeldBeforeTest, ABackupHoldsTheCopyOfAShardWhosePrimaryMovedAndNoOther) {
  // Shards 0-3: primary s{s % 3}, backup s{(s + 1) % 3}; s3 is spare.
  v1::ShardMap before;
  before.set_num_virtual_shards(4);
  for (uint32_t s = 0; s < 4; ++s) {
    auto* a = before.add_assignments();
    a->set_shard(s);
    a->set_primary(absl::StrCat("s", s % 3));
    a->add_backups(absl::StrCat("s", (s + 1) % 3));
  }
  // Shard 0 (s0, backup s1) moves to s3: s1 keeps backing it, now under s3.
  v1::ShardMap after = before;
  after.mutable_assignments(0)->set_primary("s3");
  EXPECT_EQ(HeldBefore(before, after, "s1", "s3"), "s0");
  EXPECT_THAT(NewlyBacked(before, after, "s1"), ElementsAre("s3"));
  // Nothing new to s1 under its other primaries, and s2 backs nothing of s3.
  EXPECT_EQ(HeldBefore(before, after, "s1", "s0"), "");
  EXPECT_EQ(HeldBefore(before, after, "s2", "s3"), "");
  // A shard it did not back before (shard 2, s2's, also backed by s1 under s3): no copy held.
  v1::ShardMap more = after;
  more.mutable_assignments(2)->set_primary("s3");
  more.mutable_assignments(2)->clear_backups();
  more.mutable_assignments(2)->add_backups("s1");
  EXPECT_EQ(HeldBefore(before, more, "s1", "s3"), "");
  // Two shards from two previous primaries (s1 backed shard 2 of s2 too): not one copy to take
  // them from.
  before.mutable_assignments(2)->clear_backups();
  before.mutable_assignments(2)->add_backups("s1");
  EXPECT_EQ(HeldBefore(before, more, "s1", "s3"), "");
}

// The scan reads through the scheduler's file system. A server that crashes anywhere while it
// writes a step's checkpoint (before or after the write, the fsync, the rename or the directory
// sync of either server's file) leaves a recovery point that is whole: the step before, or the
// new step once both of its files are durable, never a file cut short or a temporary one.
TEST_F(RecoveryTest, ACrashAnywhereInWritingAStepLeavesAWholeRecoveryPoint) {
  auto write_step = [&](FileSystem* fs, int64_t step) {
    Write("server-a", step, 0, 3, 1, "job-1", kShards, fs);
    Write("server-b", step, 4, 7, 1, "job-1", kShards, fs);
  };
  int ops_per_step = 0;
  {
    ::pscluster::testing::FaultInjectionFileSystem fs;
    ASSERT_THAT(fs.MakeDirs(dir_), IsOk());
    write_step(&fs, 100);
    const int before = fs.ops();
    write_step(&fs, 200);
    ops_per_step = fs.ops() - before;
  }
  ASSERT_GE(ops_per_step, 12);  // Per file: create, append, sync, close, rename, sync the dir.
  for (int k = 0; k <= ops_per_step; ++k) {
    ::pscluster::testing::FaultInjectionFileSystem fs;
    ASSERT_THAT(fs.MakeDirs(dir_), IsOk());
    write_step(&fs, 100);
    fs.CrashAfter(k);
    write_step(&fs, 200);
    fs.Crash();
    auto p = FindRecoveryPoint(root_, "job-1", kShards, rollbacks_, "", &fs);
    ASSERT_THAT(p, IsOk()) << "crash after " << k;
    if (k == ops_per_step) {
      EXPECT_EQ(p->step, 200) << "everything was durable";
    } else {
      EXPECT_TRUE(p->step == 100 || p->step == 200) << "crash after " << k << ": " << p->step;
    }
    ASSERT_EQ(p->files.size(), 2u) << "crash after " << k;
    for (const auto& f : p->files) {
      auto bytes = fs.ReadFile(f.path());
      ASSERT_THAT(bytes, IsOk());
      auto parsed = ParseCheckpoint(*bytes, f.path());
      ASSERT_THAT(parsed, IsOk()) << "crash after " << k;
      EXPECT_EQ(parsed->header.step(), p->step);
    }
    // Nothing of the real disk was read: the directory there holds no checkpoint.
    EXPECT_EQ(Find()->step, 0);
  }
}

TEST_F(RecoveryTest, AFileTheFileSystemCannotReadIsSkippedNamingIt) {
  ::pscluster::testing::FaultInjectionFileSystem fs;
  ASSERT_THAT(fs.MakeDirs(dir_), IsOk());
  Write("server-a", 100, 0, 7, 1, "job-1", kShards, &fs);
  const std::string bad = Write("server-a", 200, 0, 7, 1, "job-1", kShards, &fs);
  // Step 200's file lost its data (not synced) in a crash while its name survived.
  auto f = fs.NewWritableFile(bad);
  ASSERT_THAT(f, IsOk());
  ASSERT_THAT((*f)->Close(), IsOk());
  auto p = FindRecoveryPoint(root_, "job-1", kShards, rollbacks_, "", &fs);
  ASSERT_THAT(p, IsOk());
  EXPECT_EQ(p->step, 100);
  ASSERT_EQ(p->skipped.size(), 1u);
  EXPECT_THAT(p->skipped[0], AllOf(HasSubstr(bad), HasSubstr("not a pscluster checkpoint")));
}

}  // namespace
}  // namespace pscluster::scheduler
