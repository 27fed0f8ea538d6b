// PsHandler's consistency gate and membership with a fake clock: parked reads, held shards and
// epochs, fences of earlier attempts and placements, ranks leaving (testing/handler_fixture.h).
#include "server/testing/handler_fixture.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

TEST_F(HandlerTest, ParkedReadsAreReleasedWhenTheSlowestWorkerCatchesUp) {
  Create(CreateRequest("bsp", {DenseSpec("w", {4}, kSgd)}, v1::ConsistencySpec::BSP, 2));
  Create(CreateRequest("ssp", {DenseSpec("w", {4}, kSgd)}, v1::ConsistencySpec::SSP, 2, 2));
  Create(CreateRequest("asp", {DenseSpec("w", {4}, kSgd)}, v1::ConsistencySpec::ASP, 2));
  // Worker 0 runs ahead: 3 steps done; worker 1 none.
  for (const char* job : {"bsp", "ssp", "asp"}) {
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(EndStep(job, 0, s).ok());
  }
  bool parked;
  ASSERT_TRUE(Pull("asp", 0, 3, {Block("w", 0)}, &parked).ok());
  EXPECT_FALSE(parked);
  ASSERT_TRUE(Pull("ssp", 0, 2, {Block("w", 0)}, &parked).ok());
  EXPECT_FALSE(parked) << "SSP(2) at clock 2 needs min clock 0";
  ASSERT_TRUE(Pull("ssp", 0, 3, {Block("w", 0)}, &parked).ok());
  EXPECT_TRUE(parked) << "SSP(2) at clock 3 needs min clock 1";
  ASSERT_TRUE(Pull("bsp", 1, 0, {Block("w", 0)}, &parked).ok());
  EXPECT_FALSE(parked);
  ASSERT_TRUE(Pull("bsp", 0, 1, {Block("w", 0)}, &parked).ok());
  EXPECT_TRUE(parked);

  // A parked read's callback runs when the slow worker reaches the bound.
  auto job = *h_->PlanPull([] {
    v1::PullRequest r;
    r.set_job_id("ssp");
    r.set_clock(3);
    *r.add_slices() = Block("w", 0);
    return r;
  }());
  std::atomic<int> released{0};
  uint64_t id;
  ASSERT_FALSE(job.job->WhenReadable(3, [&](absl::Status s) { released += s.ok(); }, &id));
  auto st = Status("ssp").jobs(0);
  EXPECT_EQ(st.waiting_pulls(), 1u);
  ASSERT_EQ(st.waiting_for_size(), 1);
  EXPECT_EQ(st.waiting_for(0), 1u);
  EXPECT_EQ(st.min_clock(), 0);
  EXPECT_EQ(st.max_clock(), 3);
  EXPECT_EQ(released.load(), 0);
  ASSERT_TRUE(EndStep("ssp", 1, 0).ok());
  EXPECT_EQ(released.load(), 1);
  EXPECT_EQ(Status("ssp").jobs(0).waiting_pulls(), 0u);
  // Staleness of the reads served: clock 2 at min 0, then 3 at min 1.
  ASSERT_TRUE(Pull("ssp", 0, 3, {Block("w", 0)}, &parked).ok());
  EXPECT_EQ(Status("ssp").jobs(0).max_staleness(), 2);
  // Dropping a job finishes its parked reads with NOT_FOUND.
  absl::Status dropped_status;
  ASSERT_FALSE(job.job->WhenReadable(9, [&](absl::Status s) { dropped_status = s; }, &id));
  v1::DropJobResponse dr;
  ASSERT_TRUE(h_->DropJob([] { v1::DropJobRequest r; r.set_job_id("ssp"); return r; }(), &dr).ok());
  EXPECT_EQ(dropped_status.code(), absl::StatusCode::kNotFound);
}

// PushChunk.step_final: a pull_after of a slice the reader has just pushed in the round that ends
// its step waits only for the other workers, not for the rest of the reader's own round.
TEST_F(HandlerTest, AReadAfterTheReadersFinalPushWaitsOnlyForTheOtherWorkers) {
  Create(CreateRequest("one", {DenseSpec("w", {4}, kSgd)}, v1::ConsistencySpec::BSP, 1));
  Create(CreateRequest("two", {DenseSpec("w", {4}, kSgd)}, v1::ConsistencySpec::BSP, 2));
  Create(CreateRequest("ssp", {DenseSpec("w", {4}, kSgd)}, v1::ConsistencySpec::SSP, 2, 1));
  Create(CreateRequest("agg", {DenseSpec("w", {4}, kSgd)}, v1::ConsistencySpec::BSP, 1, 0, true));
  auto job = [&](const std::string& id) {
    v1::PullRequest r;
    r.set_job_id(id);
    *r.add_slices() = Block("w", 0);
    return h_->PlanPull(r)->job;
  };
  const std::vector<float> g(4, 1.f);
  int64_t min = -1;

  // One worker: its own push of the block is all a read at clock 1 needs, before the round's
  // end_of_step arrives. The clock-based rule alone would still park the read.
  ASSERT_TRUE(PushDense("one", 0, 0, 0, "w", 0, g, false).ok());
  EXPECT_TRUE(job("one")->ReadableAfterOwnPush(1, 0, 0, &min));
  EXPECT_EQ(min, 1);
  bool parked = false;
  ASSERT_TRUE(Pull("one", 0, 1, {Block("w", 0)}, &parked).ok());
  EXPECT_TRUE(parked);
  // A reader cannot skip its own unfinished earlier steps.
  EXPECT_FALSE(job("one")->ReadableAfterOwnPush(2, 0, 0, &min));

  // Two workers: the other one must have finished the step first.
  ASSERT_TRUE(PushDense("two", 0, 0, 0, "w", 0, g, false).ok());
  EXPECT_FALSE(job("two")->ReadableAfterOwnPush(1, 0, 0, &min));
  ASSERT_TRUE(PushDense("two", 1, 0, 0, "w", 0, g, false).ok());
  ASSERT_TRUE(EndStep("two", 1, 0).ok());
  ASSERT_TRUE(job("two")->ReadableAfterOwnPush(1, 0, 0, &min));
  EXPECT_EQ(min, 1);
  EXPECT_FALSE(job("two")->ReadableAfterOwnPush(1, 7, 0, &min)) << "no such worker";

  // SSP(1): a read at clock 2 needs the other worker at clock 1.
  EXPECT_FALSE(job("ssp")->ReadableAfterOwnPush(2, 0, 1, &min));
  ASSERT_TRUE(EndStep("ssp", 1, 0).ok());
  ASSERT_TRUE(job("ssp")->ReadableAfterOwnPush(2, 0, 1, &min));
  EXPECT_EQ(min, 1);

  // Aggregation applies a step only when every worker finished it: never early.
  ASSERT_TRUE(PushDense("agg", 0, 0, 0, "w", 0, g, false).ok());
  EXPECT_FALSE(job("agg")->ReadableAfterOwnPush(1, 0, 0, &min));
}

TEST_F(HandlerTest, ServesOnlyHeldShardsAndRefusesStaleEpochs) {
  Create(CreateRequest("j", {DenseSpec("w", {16, 1000}, kSgd, 1000),
                             SparseSpec("e", 4, 0, kSgd)},
                       v1::ConsistencySpec::ASP, 1));
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = RoundRobinMap("j", 5, {"a:1", "b:2"});
  req.set_self("s1");
  v1::UpdateShardMapResponse resp;
  ASSERT_TRUE(h_->UpdateShardMap(req, &resp).ok());
  EXPECT_EQ(resp.epoch(), 5u);
  epoch_ = 5;
  // Find a held and a foreign block.
  const uint64_t th = TableHash("w");
  uint64_t mine = 99, foreign = 99;
  for (uint64_t b = 0; b < 16; ++b) {
    (ShardOfBlock(th, b, 16) % 2 == 1 ? mine : foreign) = b;
  }
  ASSERT_NE(mine, 99u);
  ASSERT_NE(foreign, 99u);
  EXPECT_TRUE(Pull("j", 0, 0, {Block("w", mine)}).ok());
  auto r = Pull("j", 0, 0, {Block("w", foreign)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("slices[0].block"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("epoch 5"), std::string::npos) << r.status();
  std::vector<float> g(1000, 1.f);
  EXPECT_EQ(PushDense("j", 0, 0, 0, "w", foreign, g, false).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Only the held half of the blocks is allocated.
  auto st = Status("j").jobs(0);
  EXPECT_EQ(st.epoch(), 5u);
  EXPECT_EQ(st.shards_size(), 8);
  EXPECT_LT(st.tables(0).rows(), 16u);
  // An older map is ignored; requests with the old epoch are refused with the current one.
  *req.mutable_map() = RoundRobinMap("j", 4, {"a:1", "b:2"});
  ASSERT_TRUE(h_->UpdateShardMap(req, &resp).ok());
  EXPECT_EQ(resp.epoch(), 5u);
  epoch_ = 4;
  r = Pull("j", 0, 0, {Block("w", mine)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("current epoch 5"), std::string::npos) << r.status();
  // A newer map moves every shard here; blocks appear, the epoch follows.
  *req.mutable_map() = RoundRobinMap("j", 6, {"b:2"});
  req.set_self("s0");
  ASSERT_TRUE(h_->UpdateShardMap(req, &resp).ok());
  epoch_ = 6;
  EXPECT_TRUE(Pull("j", 0, 0, {Block("w", foreign)}).ok());
  EXPECT_EQ(Status("j").jobs(0).tables(0).rows(), 16u);
}

TEST_F(HandlerTest, MapsThatArriveBeforeTheTablesAreKept) {
  v1::UpdateShardMapRequest req;
  *req.mutable_map() = RoundRobinMap("j", 3, {"a:1", "b:2"});
  req.set_self("s0");
  v1::UpdateShardMapResponse resp;
  ASSERT_TRUE(h_->UpdateShardMap(req, &resp).ok());
  Create(CreateRequest("j", {DenseSpec("w", {16, 100}, kSgd, 100)}, v1::ConsistencySpec::ASP, 1));
  auto st = Status("j").jobs(0);
  EXPECT_EQ(st.epoch(), 3u);
  EXPECT_EQ(st.shards_size(), 8);
}

// Fencing (Tag.attempt): a rank handed to a newer task refuses the older task's pushes and
// reads, and the new task resumes at the clock the fence returned, each chunk applied once.
TEST_F(HandlerTest, AFencedTaskIsRefusedAndItsReplacementResumesWhereTheFenceLeftIt) {
  Create(CreateRequest("j", {DenseSpec("w", {1000}, kSgd)}, v1::ConsistencySpec::BSP, 2));
  const std::vector<float> w0 = *Pull("j", 0, 0, {Block("w", 0)});
  std::vector<float> g(1000, 1.f);
  auto chunk = [&](uint32_t attempt, bool eos) {
    v1::PushChunk c = Chunk("j", 1, 0, 0);
    c.mutable_tag()->set_attempt(attempt);
    c.mutable_slice()->set_table("w");
    c.mutable_slice()->set_block(0);
    c.set_end_of_step(eos);
    c.set_last(true);
    return c;
  };
  auto fence = [&](const std::string& job, uint32_t worker, uint32_t attempt,
                   v1::FenceWorkerResponse* resp) {
    v1::FenceWorkerRequest req;
    req.set_job_id(job);
    req.set_worker(worker);
    req.set_attempt(attempt);
    return h_->FenceWorker(req, resp);
  };
  // Rank 1's first task (attempt 0) applies its gradient; the step is not complete yet.
  ASSERT_TRUE(h_->Push(chunk(0, false), Payload::FromString(Bytes(g))).ok());
  // The rank goes to attempt 1: its clock (0) is final for attempt 0.
  v1::FenceWorkerResponse fr;
  ASSERT_TRUE(fence("j", 1, 1, &fr).ok());
  EXPECT_EQ(fr.clock(), 0);
  EXPECT_EQ(fr.attempt(), 1u);
  // The old task is refused: its push (the step's end), its reads and its pulled-after reads.
  auto late = h_->Push(chunk(0, true), Payload::FromString(Bytes(g)));
  ASSERT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
  EXPECT_NE(late.status().message().find("tag.attempt: rank 1 of job 'j' was handed to a newer "
                                         "task (attempt 1); this task (attempt 0) was replaced"),
            std::string::npos)
      << late.status();
  v1::PullRequest pr;
  pr.set_job_id("j");
  pr.set_worker(1);
  pr.set_attempt(0);
  *pr.add_slices() = Block("w", 0);
  EXPECT_EQ(h_->PlanPull(pr).status().code(), absl::StatusCode::kAborted);
  v1::PushChunk after = chunk(0, false);
  after.set_pull_after(true);
  after.set_pull_clock(1);
  EXPECT_EQ(h_->PlanPullAfter(after).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(Status("j").jobs(0).clocks(1).clock(), 0);
  // The new task pushes the same step: the chunk the old one applied is a duplicate, the step
  // completes, and the gradient was applied exactly once.
  auto dup = h_->Push(chunk(1, true), Payload::FromString(Bytes(g)));
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_TRUE(dup->duplicate);
  EXPECT_EQ(dup->clock, 1);
  pr.set_attempt(1);
  EXPECT_TRUE(h_->PlanPull(pr).ok());
  const std::vector<float> w1 = *Pull("j", 0, 0, {Block("w", 0)});
  for (int i = 0; i < 1000; ++i) ASSERT_FLOAT_EQ(w1[i], w0[i] - 0.5f);
  // A fence is never lowered; rank 0 is not affected by rank 1's.
  ASSERT_TRUE(fence("j", 1, 0, &fr).ok());
  EXPECT_EQ(fr.attempt(), 1u);
  EXPECT_EQ(fr.clock(), 1);
  EXPECT_TRUE(EndStep("j", 0, 0).ok());
  // Bad requests name the field and change nothing.
  absl::Status bad = fence("j", 2, 5, &fr);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("worker: rank 2 is outside job 'j' (2 workers)"), std::string::npos)
      << bad;
  EXPECT_EQ(fence("nope", 0, 5, &fr).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fence("", 0, 5, &fr).code(), absl::StatusCode::kInvalidArgument);
}

// FenceWorkerRequest.leave: a rank whose worker was lost with no other to take it leaves the
// job; the barrier stops waiting for it, reads parked only for it are released at once, every
// attempt of it is refused, and the last rank cannot leave.
TEST_F(HandlerTest, ARankThatLeavesTheJobNoLongerHoldsTheOthersBack) {
  for (bool aggregate : {false, true}) {
    SCOPED_TRACE(aggregate ? "aggregate" : "per-push updates");
    const std::string job = aggregate ? "agg" : "bsp";
    v1::CreateTablesRequest cr =
        CreateRequest(job, {DenseSpec("w", {100}, kSgd)}, v1::ConsistencySpec::BSP, 3);
    cr.mutable_consistency()->set_aggregate(aggregate);
    Create(cr);
    const std::vector<float> w0 = *Pull(job, 0, 0, {Block("w", 0)});
    std::vector<float> g(100, 1.f);
    // Ranks 0 and 1 finish step 0; rank 2 never does (its worker died).
    ASSERT_TRUE(PushDense(job, 0, 0, 0, "w", 0, g, true).ok());
    ASSERT_TRUE(PushDense(job, 1, 0, 0, "w", 0, g, true).ok());
    std::atomic<int> released{0};
    auto plan = h_->PlanPull([&] {
      v1::PullRequest r;
      r.set_job_id(job);
      r.set_worker(0);
      r.set_clock(1);
      *r.add_slices() = Block("w", 0);
      return r;
    }());
    ASSERT_TRUE(plan.ok()) << plan.status();
    uint64_t id = 0;
    ASSERT_FALSE(plan->job->WhenReadable(1, [&](absl::Status st) {
      if (st.ok()) ++released;
    }, &id));
    v1::JobOnServer js = Status(job).jobs(0);
    ASSERT_EQ(js.waiting_for_size(), 1);
    EXPECT_EQ(js.waiting_for(0), 2u);
    EXPECT_EQ(js.min_clock(), 0);

    v1::FenceWorkerRequest fr;
    fr.set_job_id(job);
    fr.set_worker(2);
    fr.set_attempt(1);
    fr.set_leave(true);
    v1::FenceWorkerResponse resp;
    ASSERT_TRUE(h_->FenceWorker(fr, &resp).ok());
    EXPECT_EQ(resp.clock(), 0) << "the clock it left at";
    EXPECT_EQ(released.load(), 1) << "the parked read waited only for the rank that left";
    js = Status(job).jobs(0);
    EXPECT_EQ(js.min_clock(), 1);
    EXPECT_EQ(js.waiting_for_size(), 0);
    ASSERT_EQ(js.left_workers_size(), 1);
    EXPECT_EQ(js.left_workers(0), 2u);
    // Step 0 holds the two remaining ranks' gradients (aggregate: summed, applied once).
    const std::vector<float> w1 = *Pull(job, 0, 1, {Block("w", 0)});
    for (int i = 0; i < 100; ++i) ASSERT_FLOAT_EQ(w1[i], w0[i] - 1.0f) << i;
    // Any attempt of the rank that left is refused, a newer one too.
    for (uint32_t attempt : {0u, 1u, 7u}) {
      v1::PushChunk c = Chunk(job, 2, 0, 1);
      c.mutable_tag()->set_attempt(attempt);
      c.set_end_of_step(true);
      auto late = h_->Push(c, Payload());
      ASSERT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
      EXPECT_NE(late.status().message().find("rank 2 has left job '" + job + "'"),
                std::string::npos)
          << late.status();
    }
    // The barrier goes on with ranks 0 and 1 alone.
    ASSERT_TRUE(PushDense(job, 0, 1, 0, "w", 0, g, true).ok());
    bool parked = false;
    ASSERT_TRUE(Pull(job, 0, 2, {Block("w", 0)}, &parked).ok());
    EXPECT_TRUE(parked) << "rank 1 has not finished step 1";
    ASSERT_TRUE(PushDense(job, 1, 1, 0, "w", 0, g, true).ok());
    ASSERT_TRUE(Pull(job, 0, 2, {Block("w", 0)}, &parked).ok());
    EXPECT_FALSE(parked);
    // Leaving twice is harmless; the last rank cannot leave; a bad rank names the field.
    ASSERT_TRUE(h_->FenceWorker(fr, &resp).ok());
    fr.set_worker(1);
    ASSERT_TRUE(h_->FenceWorker(fr, &resp).ok());
    fr.set_worker(0);
    absl::Status last = h_->FenceWorker(fr, &resp);
    EXPECT_EQ(last.code(), absl::StatusCode::kFailedPrecondition) << last;
    EXPECT_NE(last.message().find("rank 0 is the last rank of job '" + job + "'"),
              std::string::npos)
        << last;
    fr.set_worker(3);
    EXPECT_EQ(h_->FenceWorker(fr, &resp).code(), absl::StatusCode::kInvalidArgument);
    auto next = PushDense(job, 0, 2, 0, "w", 0, g, true);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(Status(job).jobs(0).min_clock(), 3);

    // Rank 2 rejoins (a worker came back) at the slowest clock of the ranks training, with a
    // new attempt; older attempts stay refused, and the barrier waits for it again.
    v1::FenceWorkerRequest rj;
    rj.set_job_id(job);
    rj.set_worker(2);
    rj.set_attempt(5);
    rj.set_rejoin(true);
    ASSERT_TRUE(h_->FenceWorker(rj, &resp).ok());
    EXPECT_EQ(resp.clock(), 3);
    js = Status(job).jobs(0);
    ASSERT_EQ(js.left_workers_size(), 1);
    EXPECT_EQ(js.left_workers(0), 1u);
    EXPECT_EQ(js.clocks(2).clock(), 3);
    v1::PushChunk old_attempt = Chunk(job, 2, 3, 0);
    old_attempt.mutable_tag()->set_attempt(4);
    old_attempt.set_end_of_step(true);
    EXPECT_EQ(h_->Push(old_attempt, Payload()).status().code(), absl::StatusCode::kAborted);
    ASSERT_TRUE(PushDense(job, 0, 3, 0, "w", 0, g, true).ok());
    ASSERT_TRUE(Pull(job, 0, 4, {Block("w", 0)}, &parked).ok());
    EXPECT_TRUE(parked) << "rank 2 is waited for again";
    v1::PushChunk back = Chunk(job, 2, 3, 0);
    back.mutable_tag()->set_attempt(5);
    back.set_end_of_step(true);
    ASSERT_TRUE(h_->Push(back, Payload()).ok());
    ASSERT_TRUE(Pull(job, 0, 4, {Block("w", 0)}, &parked).ok());
    EXPECT_FALSE(parked);
    // A rank in the job cannot rejoin it; leaving and rejoining at once is refused.
    absl::Status in = h_->FenceWorker(rj, &resp);
    EXPECT_EQ(in.code(), absl::StatusCode::kFailedPrecondition) << in;
    EXPECT_NE(in.message().find("rank 2 of job '" + job + "' has not left it"), std::string::npos)
        << in;
    rj.set_leave(true);
    EXPECT_EQ(h_->FenceWorker(rj, &resp).code(), absl::StatusCode::kInvalidArgument);
    // A plain fence of a rank that left (a scheduler that stopped half-way through its return
    // hands it over) lets it back in as well.
    v1::FenceWorkerRequest plain;
    plain.set_job_id(job);
    plain.set_worker(1);
    plain.set_attempt(9);
    ASSERT_TRUE(h_->FenceWorker(plain, &resp).ok());
    EXPECT_EQ(resp.attempt(), 9u);
    EXPECT_EQ(Status(job).jobs(0).left_workers_size(), 0);
  }
}

// UpdateShardMapRequest.min_attempt: a placement's map fences every rank of the job, also when
// the map arrives before the tables.
TEST_F(HandlerTest, AShardMapFencesTheTasksOfEarlierPlacements) {
  for (bool map_first : {true, false}) {
    const std::string job = map_first ? "early" : "late";
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = RoundRobinMap(job, 3, {"a:1"});
    req.set_self("s0");
    req.set_min_attempt(2);
    v1::UpdateShardMapResponse resp;
    if (map_first) {
      ASSERT_TRUE(h_->UpdateShardMap(req, &resp).ok());
    }
    Create(CreateRequest(job, {DenseSpec("w", {10}, kSgd)}, v1::ConsistencySpec::ASP, 2));
    if (!map_first) {
      ASSERT_TRUE(h_->UpdateShardMap(req, &resp).ok());
    }
    epoch_ = 3;
    std::vector<float> g(10, 1.f);
    for (uint32_t worker : {0u, 1u}) {
      for (uint32_t attempt : {0u, 1u, 2u, 3u}) {
        v1::PushChunk c = Chunk(job, worker, 0, attempt);
        c.mutable_tag()->set_attempt(attempt);
        c.mutable_slice()->set_table("w");
        c.mutable_slice()->set_block(0);
        auto r = h_->Push(c, Payload::FromString(Bytes(g)));
        EXPECT_EQ(r.status().code(),
                  attempt < 2 ? absl::StatusCode::kAborted : absl::StatusCode::kOk)
            << job << " worker " << worker << " attempt " << attempt << ": " << r.status();
      }
    }
    // A later map with a lower min_attempt does not lower the fence.
    *req.mutable_map() = RoundRobinMap(job, 4, {"a:1"});
    req.set_min_attempt(0);
    ASSERT_TRUE(h_->UpdateShardMap(req, &resp).ok());
    epoch_ = 4;
    v1::PushChunk c = Chunk(job, 0, 1, 0);
    c.mutable_tag()->set_attempt(1);
    EXPECT_EQ(h_->Push(c, Payload()).status().code(), absl::StatusCode::kAborted) << job;
    epoch_ = 0;
  }
}

}  // namespace
}  // namespace pscluster
