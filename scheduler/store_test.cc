#include "scheduler/store.h"

#include <sqlite3.h>

#include <fstream>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".db";
    std::remove(path_.c_str());
  }
  std::unique_ptr<Store> Open() {
    auto s = Store::Open(StoreOptions{path_, true});
    EXPECT_THAT(s, IsOk());
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string path_;
};

v1::Job MakeJob(const std::string& id, int64_t submitted, v1::JobState state) {
  v1::Job j;
  j.set_job_id(id);
  j.set_submitted_unix_ms(submitted);
  j.set_state(state);
  j.mutable_spec()->set_name("n");
  return j;
}

TEST_F(StoreTest, JobsNodesMapsAndCountersSurviveReopening) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(*store->NextId("job"), 1u);
    EXPECT_EQ(*store->NextId("job"), 2u);
    EXPECT_EQ(*store->NextId("server"), 1u);
    ASSERT_THAT(store->PutJob(MakeJob("job-2", 200, v1::JOB_QUEUED), "tok"), IsOk());
    v1::ShardMap map;
    map.set_job_id("job-1");
    map.set_epoch(1);
    ASSERT_THAT(store->PutJob(MakeJob("job-1", 100, v1::JOB_PLACING), "", &map), IsOk());
    map.set_epoch(2);
    ASSERT_THAT(store->PutJob(MakeJob("job-1", 100, v1::JOB_RUNNING), "", &map), IsOk());
    v1::NodeStatus n;
    n.mutable_info()->set_node_id("server-1");
    n.mutable_info()->set_address("h:1");
    n.set_state(v1::NODE_ALIVE);
    ASSERT_THAT(store->PutNode(n), IsOk());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->NextId("job"), 3u);
  auto jobs = store->LoadJobs();
  ASSERT_THAT(jobs, IsOk());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job.job_id(), "job-1");  // Oldest first.
  EXPECT_EQ((*jobs)[0].job.state(), v1::JOB_RUNNING);
  EXPECT_EQ((*jobs)[0].shard_map.epoch(), 2u);  // The latest map.
  EXPECT_EQ((*jobs)[1].client_token, "tok");
  EXPECT_EQ((*jobs)[1].shard_map.epoch(), 0u);  // Never placed.
  auto nodes = store->LoadNodes();
  ASSERT_THAT(nodes, IsOk());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].info().address(), "h:1");
}

// Jobs submitted in the same millisecond come back in submission order, however often each was
// updated since (psctl jobs lists newest first, before and after a scheduler restart).
TEST_F(StoreTest, JobsOfTheSameMillisecondKeepTheirOrder) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    for (const char* id : {"job-9", "job-10", "job-11"}) {
      ASSERT_THAT(store->PutJob(MakeJob(id, 500, v1::JOB_QUEUED), ""), IsOk());
    }
    // The oldest two change state afterwards.
    ASSERT_THAT(store->PutJob(MakeJob("job-10", 500, v1::JOB_RUNNING), ""), IsOk());
    ASSERT_THAT(store->PutJob(MakeJob("job-9", 500, v1::JOB_CANCELLED), ""), IsOk());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto jobs = store->LoadJobs();
  ASSERT_THAT(jobs, IsOk());
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ((*jobs)[0].job.job_id(), "job-9");
  EXPECT_EQ((*jobs)[0].job.state(), v1::JOB_CANCELLED);
  EXPECT_EQ((*jobs)[1].job.job_id(), "job-10");
  EXPECT_EQ((*jobs)[2].job.job_id(), "job-11");
}

TEST_F(StoreTest, ASecondOpenerIsRefused) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  auto second = Store::Open(StoreOptions{path_, true});
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kFailedPrecondition,
                               HasSubstr("locked by another process")));
  first.reset();
  EXPECT_NE(Open(), nullptr);  // Free again once the first is gone.
}

TEST_F(StoreTest, ANonDatabaseFileIsDataLossNamingIt) {
  std::ofstream(path_) << "this is not a database, just some text that is long enough......"
                       << std::string(4096, 'x');
  EXPECT_THAT(Store::Open(StoreOptions{path_, true}),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(path_)));
}

TEST_F(StoreTest, AMissingDirectoryIsNamed) {
  EXPECT_THAT(Store::Open(StoreOptions{"/nonexistent-dir/s.db", true}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("/nonexistent-dir/s.db")));
  EXPECT_THAT(Store::Open(StoreOptions{"", true}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--db")));
}

TEST_F(StoreTest, AJobKeepsTheOwnerOfItsFirstWrite) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
    ASSERT_THAT(store->PutJob(MakeJob("job-1", 100, v1::JOB_QUEUED), "", nullptr, "alice"), IsOk());
    // Later writes (the scheduler's own, without an owner) leave it.
    ASSERT_THAT(store->PutJob(MakeJob("job-1", 100, v1::JOB_RUNNING), ""), IsOk());
    ASSERT_THAT(store->PutJob(MakeJob("job-2", 200, v1::JOB_QUEUED), ""), IsOk());
  }
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto jobs = store->LoadJobs();
  ASSERT_THAT(jobs, IsOk());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].owner, "alice");
  EXPECT_EQ((*jobs)[0].job.state(), v1::JOB_RUNNING);
  EXPECT_EQ((*jobs)[1].owner, "");
}

TEST_F(StoreTest, ADatabaseOfSchemaOneGainsOwners) {
  {
    // What a build of schema version 1 wrote: jobs without an owner column.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    const std::string record = MakeJob("job-1", 100, v1::JOB_RUNNING).SerializeAsString();
    const std::string sql =
        "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, submitted_ms INTEGER NOT NULL, "
        "client_token TEXT NOT NULL DEFAULT '', record BLOB NOT NULL); "
        "PRAGMA user_version=1;";
    ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_stmt* st = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db, "INSERT INTO jobs VALUES('job-1', 100, 'tok', ?1)", -1, &st,
                                 nullptr),
              SQLITE_OK);
    sqlite3_bind_blob(st, 1, record.data(), static_cast<int>(record.size()), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
  }
  for (int reopen = 0; reopen < 2; ++reopen) {  // The second open finds schema 2.
    auto store = Open();
    ASSERT_NE(store, nullptr);
    auto jobs = store->LoadJobs();
    ASSERT_THAT(jobs, IsOk());
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ((*jobs)[0].job.job_id(), "job-1");
    EXPECT_EQ((*jobs)[0].client_token, "tok");
    EXPECT_EQ((*jobs)[0].owner, "");
  }
}

TEST_F(StoreTest, ANewerSchemaIsRefused) {
  {
    auto store = Open();
    ASSERT_NE(store, nullptr);
  }
  // Bump the schema version as a newer build would (the header field, written directly).
  std::fstream f(path_, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good());
  f.seekp(60);  // user_version lives at offset 60 of the database header, big-endian.
  const char v[4] = {0, 0, 0, 9};
  f.write(v, 4);
  f.close();
  EXPECT_THAT(Store::Open(StoreOptions{path_, true}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("schema version 9")));
}

}  // namespace
}  // namespace pscluster::scheduler
