#include "scheduler/job_table.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/clock.h"
#include "common/testing/status_matchers.h"
#include "scheduler/store.h"
#include "scheduler/testing/failing_store.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A table over a real SQLite file, wrapped so that its writes can fail on demand.
class JobTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::string(std::getenv("TEST_TMPDIR")) + "/" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".db";
    std::remove(path_.c_str());
    auto real = Store::Open(StoreOptions{path_, false});
    ASSERT_THAT(real, IsOk());
    store_ = std::make_unique<testing::FailingStore>(std::move(*real));
    table_ = std::make_unique<JobTable>(store_.get(), &clock_, [this](const absl::Status& cause) {
      failures_.push_back(std::string(cause.message()));
    });
  }

  static JobRecord NewJob(const std::string& id, const std::string& token = "",
                          const std::string& owner = "") {
    JobRecord rec;
    rec.job.set_job_id(id);
    rec.job.set_state(v1::JOB_QUEUED);
    rec.job.mutable_spec()->set_name(id + "-name");
    rec.client_token = token;
    rec.owner = owner;
    return rec;
  }

  std::vector<std::string> Ids() {
    std::vector<std::string> ids;
    for (JobRecord& rec : *table_) ids.push_back(rec.job.job_id());
    return ids;
  }

  std::vector<StoredJob> Stored() {
    auto stored = store_->LoadJobs();
    EXPECT_THAT(stored, IsOk());
    return stored.ok() ? std::move(*stored) : std::vector<StoredJob>{};
  }

  std::string path_;
  FakeClock clock_;
  std::unique_ptr<testing::FailingStore> store_;
  std::unique_ptr<JobTable> table_;
  std::vector<std::string> failures_;
};

TEST_F(JobTableTest, AddWritesTheJobBeforeItIsFoundByIdOrToken) {
  clock_.Advance(absl::Seconds(5));
  auto added = table_->Add(NewJob("job-1", "token-a", "alice"));
  ASSERT_THAT(added, IsOk());
  EXPECT_EQ((*added)->last_persist, clock_.Now());

  EXPECT_EQ(table_->Find("job-1"), *added);
  EXPECT_EQ(table_->FindByToken("token-a"), *added);
  EXPECT_EQ(table_->FindByToken(""), nullptr);
  EXPECT_EQ(table_->FindByToken("token-b"), nullptr);
  EXPECT_EQ(table_->size(), 1u);

  std::vector<StoredJob> stored = Stored();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].job.job_id(), "job-1");
  EXPECT_EQ(stored[0].client_token, "token-a");
  EXPECT_EQ(stored[0].owner, "alice");
}

TEST_F(JobTableTest, AnUnknownJobIsNotFoundNamingTheField) {
  ASSERT_THAT(table_->Add(NewJob("job-1")), IsOk());
  EXPECT_EQ(table_->Find("job-2"), nullptr);
  EXPECT_THAT(table_->FindOrError("job-2"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job_id: no job 'job-2'")));
  EXPECT_THAT(table_->FindOrError("job-1"), IsOk());
}

TEST_F(JobTableTest, IteratesOldestFirstOrNewestFirst) {
  for (const char* id : {"job-1", "job-2", "job-3"}) ASSERT_THAT(table_->Add(NewJob(id)), IsOk());
  EXPECT_THAT(Ids(), ElementsAre("job-1", "job-2", "job-3"));
  std::vector<std::string> newest;
  for (const JobRecord& rec : table_->NewestFirst()) newest.push_back(rec.job.job_id());
  EXPECT_THAT(newest, ElementsAre("job-3", "job-2", "job-1"));
  // Changes through the iteration are the table's records.
  for (JobRecord& rec : *table_) rec.job.set_reason("seen");
  EXPECT_EQ(table_->Find("job-2")->job.reason(), "seen");
  const JobTable& view = *table_;
  int n = 0;
  for (const JobRecord& rec : view) n += rec.job.reason() == "seen";
  EXPECT_EQ(n, 3);
}

TEST_F(JobTableTest, PersistWritesTheJobAndItsMapAndMarksItClean) {
  auto added = table_->Add(NewJob("job-1"));
  ASSERT_THAT(added, IsOk());
  JobRecord& rec = **added;
  rec.job.set_state(v1::JOB_RUNNING);
  rec.progress_dirty = true;
  v1::ShardMap map;
  map.set_epoch(3);
  map.add_assignments()->set_primary("server-1");
  clock_.Advance(absl::Seconds(7));
  ASSERT_THAT(table_->Persist(rec, &map), IsOk());
  EXPECT_FALSE(rec.progress_dirty);
  EXPECT_EQ(rec.last_persist, clock_.Now());

  std::vector<StoredJob> stored = Stored();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].job.state(), v1::JOB_RUNNING);
  EXPECT_EQ(stored[0].shard_map.epoch(), 3u);
  EXPECT_EQ(stored[0].shard_map.assignments(0).primary(), "server-1");
}

TEST_F(JobTableTest, AFailedWriteIsStickyNamesTheStoreAndIsHeardOnce) {
  auto added = table_->Add(NewJob("job-1"));
  ASSERT_THAT(added, IsOk());
  JobRecord& rec = **added;
  rec.job.set_state(v1::JOB_RUNNING);
  rec.progress_dirty = true;
  store_->FailWrites(true);
  absl::Status s = table_->Persist(rec);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr(path_)));
  EXPECT_THAT(s.message(), HasSubstr("makes no change until its store works again"));
  EXPECT_TRUE(rec.progress_dirty);  // Not written.
  EXPECT_EQ(table_->error(), s);
  ASSERT_EQ(failures_.size(), 1u);
  EXPECT_THAT(failures_[0], HasSubstr("disk I/O error"));

  // The store works again, but the table refuses until its owner reloads it: nothing reaches
  // the store meanwhile, and a new job is not added.
  store_->FailWrites(false);
  EXPECT_THAT(table_->Persist(rec), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(table_->Add(NewJob("job-2")), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(table_->Find("job-2"), nullptr);
  EXPECT_EQ(store_->refused(), 1);
  table_->Fail(absl::UnavailableError("another write"));  // Already failed: heard once.
  EXPECT_EQ(failures_.size(), 1u);
  std::vector<StoredJob> stored = Stored();
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored[0].job.state(), v1::JOB_QUEUED);

  // The owner's reload: the table as the store holds it (the unwritten RUNNING is dropped).
  table_->Clear();
  EXPECT_EQ(table_->size(), 0u);
  for (StoredJob& sj : Stored()) {
    JobRecord loaded;
    loaded.job = std::move(sj.job);
    loaded.client_token = std::move(sj.client_token);
    table_->Load(std::move(loaded));
  }
  table_->ClearError();
  EXPECT_THAT(table_->error(), IsOk());
  EXPECT_EQ(table_->Find("job-1")->job.state(), v1::JOB_QUEUED);
  EXPECT_THAT(table_->Add(NewJob("job-2")), IsOk());
  EXPECT_THAT(Ids(), ElementsAre("job-1", "job-2"));
}

TEST_F(JobTableTest, AFailedAddAddsNothing) {
  store_->FailWrites(true);
  EXPECT_THAT(table_->Add(NewJob("job-1", "token-a")),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr(path_)));
  EXPECT_EQ(table_->size(), 0u);
  EXPECT_EQ(table_->FindByToken("token-a"), nullptr);
  EXPECT_TRUE(Stored().empty());
  EXPECT_EQ(failures_.size(), 1u);
}

TEST_F(JobTableTest, ClearForgetsTokensToo) {
  ASSERT_THAT(table_->Add(NewJob("job-1", "token-a")), IsOk());
  table_->Clear();
  EXPECT_EQ(table_->FindByToken("token-a"), nullptr);
  EXPECT_EQ(table_->Find("job-1"), nullptr);
  EXPECT_TRUE(Ids().empty());
}

}  // namespace
}  // namespace pscluster::scheduler
