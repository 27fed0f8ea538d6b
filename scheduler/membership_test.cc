#include "scheduler/membership.h"

#include "gtest/gtest.h"

namespace pscluster::scheduler {
namespace {

v1::JobRecovery Recovery() {
  v1::JobRecovery r;
  r.set_recoveries(2);
  r.set_start_step(40);
  return r;
}

TEST(MembershipTest, RankAttemptIsTheRanksOwnElseTheJobsRecoveryCount) {
  v1::JobRecovery r = Recovery();
  EXPECT_EQ(RankAttempt(r, 0), 2u);
  r.add_rank_attempts(2);
  r.add_rank_attempts(5);
  EXPECT_EQ(RankAttempt(r, 1), 5u);
  EXPECT_EQ(RankAttempt(r, 3), 2u);  // No entry of its own.
  EXPECT_EQ(NextAttempt(r, 4), 6u);
  r.add_rank_attempts(9);  // A rank beyond num_workers still counts: attempts never repeat.
  EXPECT_EQ(NextAttempt(r, 2), 10u);
}

TEST(MembershipTest, ANewAttemptIsAboveEveryEarlierOneAndOthersKeepTheirs) {
  v1::JobRecovery r = Recovery();  // 2 recoveries, no per-rank attempts yet.
  EXPECT_EQ(StartNewAttempt(&r, 1, 3), 3u);
  ASSERT_EQ(r.rank_attempts_size(), 3);
  EXPECT_EQ(RankAttempt(r, 0), 2u);
  EXPECT_EQ(RankAttempt(r, 1), 3u);
  EXPECT_EQ(RankAttempt(r, 2), 2u);
  EXPECT_EQ(StartNewAttempt(&r, 0, 3), 4u);
  EXPECT_EQ(RankAttempt(r, 1), 3u);
}

TEST(MembershipTest, LeadRankIsTheLowestRankStillTraining) {
  v1::JobRecovery r = Recovery();
  EXPECT_EQ(LeadRank(r, 3), 0u);
  r.add_left()->set_rank(0);
  EXPECT_EQ(LeadRank(r, 3), 1u);
  r.add_left()->set_rank(1);
  r.add_left()->set_rank(2);
  EXPECT_EQ(LeadRank(r, 3), 0u);  // Everyone left.
}

TEST(MembershipTest, PartitionCarriesSharesAndAdoptedParts) {
  v1::JobRecovery r = Recovery();
  v1::LeftRank* l = r.add_left();
  l->set_rank(2);
  l->set_adopted_by(0);
  v1::DataPartition p = PartitionFor(r, 0, 3);
  EXPECT_EQ(p.index(), 0u);
  EXPECT_EQ(p.count(), 3u);
  ASSERT_EQ(p.also_size(), 1);
  EXPECT_EQ(p.also(0), 2u);
  EXPECT_EQ(p.shares_size(), 0);
  EXPECT_EQ(PartitionFor(r, 1, 3).also_size(), 0);

  // Shares apply only when there is one per rank.
  r.add_data_shares(3);
  r.add_data_shares(1);
  EXPECT_EQ(PartitionFor(r, 1, 3).shares_size(), 0);
  r.add_data_shares(1);
  EXPECT_EQ(PartitionFor(r, 1, 3).shares_size(), 3);

  // A rank that left and adopted itself (no adopter) reads nothing extra.
  v1::LeftRank* self = r.add_left();
  self->set_rank(1);
  self->set_adopted_by(1);
  EXPECT_EQ(PartitionFor(r, 1, 3).also_size(), 0);
}

TEST(MembershipTest, TaskAndUpdateAgreeOnPartitionLeadAndTrainingRanks) {
  v1::JobRecovery r = Recovery();
  v1::LeftRank* l = r.add_left();
  l->set_rank(0);
  l->set_adopted_by(1);
  r.add_rank_attempts(1);
  r.add_rank_attempts(3);
  v1::JobSpec spec;
  spec.set_name("j");
  v1::ShardMap map;
  map.set_epoch(7);
  v1::AssignTaskRequest task = TaskFor("job-1", spec, map, 1, 2, r);
  EXPECT_EQ(task.job_id(), "job-1");
  EXPECT_EQ(task.spec().name(), "j");
  EXPECT_EQ(task.shard_map().epoch(), 7u);
  EXPECT_EQ(task.rank(), 1u);
  EXPECT_EQ(task.num_workers(), 2u);
  EXPECT_EQ(task.start_step(), 40);
  EXPECT_EQ(task.attempt(), 3u);
  EXPECT_EQ(task.lead_rank(), 1u);
  EXPECT_EQ(task.training_ranks(), 1u);
  ASSERT_EQ(task.partition().also_size(), 1);

  v1::UpdatePartitionRequest up = PartitionUpdate("job-1", r, 1, 2);
  EXPECT_EQ(up.job_id(), "job-1");
  EXPECT_EQ(up.attempt(), task.attempt());
  EXPECT_EQ(up.lead_rank(), task.lead_rank());
  EXPECT_EQ(up.training_ranks(), task.training_ranks());
  EXPECT_EQ(up.partition().SerializeAsString(), task.partition().SerializeAsString());
}

}  // namespace
}  // namespace pscluster::scheduler
