// Unit tier: tables, consistency, exactly-once pushes, aggregation, checkpoints, export and
// status, driven through PsHandler with a fake clock (no gRPC).
#include "server/ps_handler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <random>

#include "common/atomic_file.h"
#include "common/checkpoint_file.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "common/sharding.h"
#include "server/optimizer.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::string KeyBytes(const std::vector<uint64_t>& k) {
  return std::string(reinterpret_cast<const char*>(k.data()), k.size() * 8);
}

class HandlerTest : public ::testing::Test {
 protected:
  void SetUp() override { Make(PsHandlerOptions{}); }

  void Make(PsHandlerOptions o) {
    if (o.checkpoint_dir.empty()) {
      o.checkpoint_dir = TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    }
    h_ = std::make_unique<PsHandler>(o, &clock_, [](std::function<void()> f) { f(); });
  }

  void Create(const v1::CreateTablesRequest& r) {
    v1::CreateTablesResponse resp;
    ASSERT_TRUE(h_->CreateTables(r, &resp).ok()) << h_->CreateTables(r, &resp);
  }

  v1::PushChunk Chunk(const std::string& job, uint32_t worker, int64_t step, uint64_t seq) {
    v1::PushChunk c;
    c.mutable_tag()->set_job_id(job);
    c.mutable_tag()->set_worker(worker);
    c.mutable_tag()->set_step(step);
    c.mutable_tag()->set_seq(seq);
    c.set_epoch(epoch_);
    c.set_dtype(v1::DT_FLOAT32);
    return c;
  }

  absl::StatusOr<PushResult> PushDense(const std::string& job, uint32_t worker, int64_t step,
                                       uint64_t seq, const std::string& table, uint64_t block,
                                       const std::vector<float>& g, bool eos) {
    v1::PushChunk c = Chunk(job, worker, step, seq);
    c.mutable_slice()->set_table(table);
    c.mutable_slice()->set_block(block);
    c.set_end_of_step(eos);
    c.set_last(true);
    return h_->Push(c, Payload::FromString(Bytes(g)));
  }

  absl::StatusOr<PushResult> PushSparse(const std::string& job, uint32_t worker, int64_t step,
                                        uint64_t seq, const std::string& table,
                                        const std::vector<uint64_t>& keys,
                                        const std::vector<float>& g, bool eos) {
    v1::PushChunk c = Chunk(job, worker, step, seq);
    c.mutable_slice()->set_table(table);
    c.mutable_slice()->set_keys(KeyBytes(keys));
    c.set_end_of_step(eos);
    return h_->Push(c, Payload::FromString(Bytes(g)));
  }

  absl::StatusOr<PushResult> EndStep(const std::string& job, uint32_t worker, int64_t step) {
    v1::PushChunk c = Chunk(job, worker, step, 99);
    c.set_end_of_step(true);
    return h_->Push(c, Payload());
  }

  // Reads the slices at once; FAILED_PRECONDITION-free. `parked` tells whether the read had to
  // wait (then nothing is read and the wait is cancelled).
  absl::StatusOr<std::vector<float>> Pull(const std::string& job, uint32_t worker, int64_t clock,
                                          const std::vector<v1::Slice>& slices,
                                          bool* parked = nullptr,
                                          v1::DataType dtype = v1::DT_FLOAT32) {
    v1::PullRequest req;
    req.set_job_id(job);
    req.set_worker(worker);
    req.set_clock(clock);
    req.set_epoch(epoch_);
    req.set_dtype(dtype);
    for (const auto& s : slices) *req.add_slices() = s;
    auto plan = h_->PlanPull(req);
    if (!plan.ok()) return plan.status();
    uint64_t id = 0;
    bool ready = plan->job->WhenReadable(clock, [](absl::Status) {}, &id);
    if (parked) *parked = !ready;
    if (!ready) {
      plan->job->CancelWait(id);
      return std::vector<float>();
    }
    std::vector<float> out;
    for (const auto& s : plan->slices) {
      std::string buf(s.elems * DTypeSize(plan->dtype), '\0');
      absl::Status st = plan->job->Read(s, epoch_, 0, s.elems, plan->dtype, buf.data());
      if (!st.ok()) return st;
      size_t at = out.size();
      out.resize(at + s.elems);
      DecodeFloats(buf.data(), s.elems, plan->dtype, out.data() + at);
    }
    plan->job->RecordServedPull(clock);
    return out;
  }

  static v1::Slice Block(const std::string& table, uint64_t b) {
    v1::Slice s;
    s.set_table(table);
    s.set_block(b);
    return s;
  }
  static v1::Slice Rows(const std::string& table, const std::vector<uint64_t>& keys) {
    v1::Slice s;
    s.set_table(table);
    s.set_keys(KeyBytes(keys));
    return s;
  }

  v1::ServerStatus Status(const std::string& job = "") {
    v1::ServerStatusRequest req;
    req.set_job_id(job);
    v1::ServerStatus s;
    EXPECT_TRUE(h_->Status(req, &s).ok());
    return s;
  }

  FakeClock clock_;
  std::unique_ptr<PsHandler> h_;
  uint64_t epoch_ = 0;
};

const v1::OptimizerSpec kSgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);
const v1::OptimizerSpec kAdam = Optimizer(v1::OptimizerSpec::ADAM, 0.01f);

TEST_F(HandlerTest, DenseTablesAreCutIntoBlocksWithDeterministicInitialValues) {
  // 150000 elements in blocks of 65536: 3 blocks, the last one short.
  Create(CreateRequest("j", {DenseSpec("w", {300, 500}, kSgd)}, v1::ConsistencySpec::ASP, 1));
  auto b2 = Pull("j", 0, 0, {Block("w", 2)});
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(b2->size(), 150000u - 2 * 65536u);
  auto b0 = Pull("j", 0, 0, {Block("w", 0)});
  for (float v : *b0) ASSERT_TRUE(v >= -0.5f && v < 0.5f) << v;
  // Another server (a fresh handler) computes the same values.
  auto other = std::make_unique<PsHandler>(PsHandlerOptions{}, &clock_, [](auto f) { f(); });
  std::swap(other, h_);
  Create(CreateRequest("j", {DenseSpec("w", {300, 500}, kSgd)}, v1::ConsistencySpec::ASP, 1));
  EXPECT_EQ(*Pull("j", 0, 0, {Block("w", 0)}), *b0);
  // Idempotent CreateTables; a different spec is ALREADY_EXISTS naming the table.
  v1::CreateTablesResponse resp;
  ASSERT_TRUE(h_->CreateTables(CreateRequest("j", {DenseSpec("w", {300, 500}, kSgd)},
                                             v1::ConsistencySpec::ASP, 1),
                               &resp)
                  .ok());
  EXPECT_EQ(resp.created(), 0u);
  absl::Status s = h_->CreateTables(
      CreateRequest("j", {DenseSpec("w", {300, 501}, kSgd)}, v1::ConsistencySpec::ASP, 1), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s;
}

TEST_F(HandlerTest, SparseRowsAreCreatedOnFirstPushWithTheInitializerAndNeverByPulls) {
  Create(CreateRequest("j", {SparseSpec("emb", 8, 1000, kSgd)}, v1::ConsistencySpec::ASP, 1));
  EXPECT_EQ(Status("j").jobs(0).tables(0).rows(), 0u);
  auto rows = Pull("j", 0, 0, {Rows("emb", {5, 999, 5})});
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 24u);
  EXPECT_TRUE(std::equal(rows->begin(), rows->begin() + 8, rows->begin() + 16))
      << "a repeated key returns the same row";
  EXPECT_FALSE(std::equal(rows->begin(), rows->begin() + 8, rows->begin() + 8));
  auto st = Status("j").jobs(0).tables(0);
  EXPECT_EQ(st.rows(), 0u) << "pulls of fresh keys create no rows";
  EXPECT_EQ(st.elements(), 0u);
  EXPECT_EQ(st.reads_without_row(), 3u);
  EXPECT_EQ(h_->budget()->used(), 0u);
  // A push to a fresh row starts from the same initial values: SGD lr 0.5, g = 2 -> w - 1.
  std::vector<float> g(8, 2.f);
  ASSERT_TRUE(PushSparse("j", 0, 0, 0, "emb", {7}, g, false).ok());
  auto after = Pull("j", 0, 0, {Rows("emb", {7})});
  std::vector<float> init(8);
  TableInfo info(SparseSpec("emb", 8, 1000, kSgd), OptimizerParams(), 16);
  info.init.FillRow(7, 8, init.data());
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ((*after)[i], init[i] - 1.f);
}

TEST_F(HandlerTest, DuplicateKeysInOnePushAddTheirGradients) {
  Create(CreateRequest("j", {SparseSpec("emb", 2, 0, kSgd)}, v1::ConsistencySpec::ASP, 1));
  auto before = *Pull("j", 0, 0, {Rows("emb", {1, 2})});
  ASSERT_TRUE(PushSparse("j", 0, 0, 0, "emb", {1, 2, 1}, {1, 1, 2, 2, 3, 3}, false).ok());
  auto after = *Pull("j", 0, 0, {Rows("emb", {1, 2})});
  EXPECT_FLOAT_EQ(after[0], before[0] - 0.5f * 4);  // 1 + 3
  EXPECT_FLOAT_EQ(after[2], before[2] - 0.5f * 2);
}

TEST_F(HandlerTest, AppliesEachTagExactlyOnceWhenPushesAreReplayed) {
  Create(CreateRequest("j", {DenseSpec("w", {1000}, kSgd), SparseSpec("e", 4, 0, kSgd)},
                       v1::ConsistencySpec::ASP, 2));
  auto w0 = *Pull("j", 0, 0, {Block("w", 0)});
  std::vector<float> g(1000, 1.f);
  std::vector<float> ge(8, 1.f);
  auto e0 = *Pull("j", 0, 0, {Rows("e", {3, 4})});
  for (int replay = 0; replay < 5; ++replay) {
    auto r = PushDense("j", 0, 0, 0, "w", 0, g, false);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->duplicate, replay > 0);
    auto rs = PushSparse("j", 0, 0, 1, "e", {3, 4}, ge, false);
    ASSERT_TRUE(rs.ok());
    EXPECT_EQ(rs->duplicate, replay > 0);
  }
  auto w1 = *Pull("j", 0, 0, {Block("w", 0)});
  for (int i = 0; i < 1000; ++i) ASSERT_FLOAT_EQ(w1[i], w0[i] - 0.5f);
  auto e1 = *Pull("j", 0, 0, {Rows("e", {3, 4})});
  for (int i = 0; i < 8; ++i) ASSERT_FLOAT_EQ(e1[i], e0[i] - 0.5f);
  // Same step, another seq: a new push. Another worker with the same seq: a new push.
  EXPECT_FALSE(PushDense("j", 0, 0, 2, "w", 0, g, false)->duplicate);
  EXPECT_FALSE(PushDense("j", 1, 0, 0, "w", 0, g, false)->duplicate);
  // End the step; replays of anything in it (also after the clock moved) are duplicates.
  auto end = PushDense("j", 0, 0, 3, "w", 0, g, true);
  EXPECT_EQ(end->clock, 1);
  for (uint64_t seq : {0, 2, 3}) {
    auto r = PushDense("j", 0, 0, seq, "w", 0, g, true);
    EXPECT_TRUE(r->duplicate) << seq;
    EXPECT_EQ(r->clock, 1);
  }
  auto w2 = *Pull("j", 0, 0, {Block("w", 0)});
  for (int i = 0; i < 1000; ++i) ASSERT_FLOAT_EQ(w2[i], w0[i] - 4 * 0.5f);
  auto st = Status();
  EXPECT_EQ(st.duplicates_total(), 8u + 3u);
  EXPECT_EQ(st.pushes_total(), 2u + 3u);  // First dense + sparse, seq 2, worker 1, seq 3.
}

TEST_F(HandlerTest, SynchronousAggregationSumsAllWorkersThenAppliesOnce) {
  Create(CreateRequest("j", {DenseSpec("w", {10}, kAdam), SparseSpec("e", 2, 0, kAdam)},
                       v1::ConsistencySpec::BSP, 3, 0, true));
  auto w0 = *Pull("j", 0, 0, {Block("w", 0)});
  auto e0 = *Pull("j", 0, 0, {Rows("e", {9})});
  for (uint32_t w = 0; w < 3; ++w) {
    std::vector<float> g(10, static_cast<float>(w + 1));
    ASSERT_TRUE(PushDense("j", w, 0, 0, "w", 0, g, false).ok());
    ASSERT_TRUE(PushDense("j", w, 0, 0, "w", 0, g, false)->duplicate);  // Not added twice.
    ASSERT_TRUE(PushSparse("j", w, 0, 1, "e", {9}, {1.f * (w + 1), -1.f}, false).ok());
    if (w < 2) {
      ASSERT_TRUE(EndStep("j", w, 0).ok());
    }
    // Nothing applied before every worker finished the step.
    EXPECT_EQ(*Pull("j", w, 0, {Block("w", 0)}), w0);
  }
  bool parked = false;
  ASSERT_TRUE(Pull("j", 0, 1, {Block("w", 0)}, &parked).ok());
  EXPECT_TRUE(parked) << "BSP read of step 1 must wait for worker 2";
  ASSERT_TRUE(EndStep("j", 2, 0).ok());
  auto w1 = *Pull("j", 0, 1, {Block("w", 0)}, &parked);
  EXPECT_FALSE(parked);
  // One Adam step on the sum 1 + 2 + 3 = 6.
  auto p = *ResolveOptimizer(kAdam, "o");
  std::vector<float> expect = w0, m(10, 0.f), v(10, 0.f), sum(10, 6.f);
  ApplyUpdate(p, 1, 10, sum.data(), expect.data(), m.data(), v.data());
  for (int i = 0; i < 10; ++i) EXPECT_FLOAT_EQ(w1[i], expect[i]);
  auto e1 = *Pull("j", 0, 1, {Rows("e", {9})});
  std::vector<float> ee = e0, em(2, 0.f), ev(2, 0.f), es = {6.f, -3.f};
  ApplyUpdate(p, 1, 2, es.data(), ee.data(), em.data(), ev.data());
  EXPECT_FLOAT_EQ(e1[0], ee[0]);
  EXPECT_FLOAT_EQ(e1[1], ee[1]);
}

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

TEST_F(HandlerTest, TransportsFloat16AndBFloat16) {
  Create(CreateRequest("j", {DenseSpec("w", {64}, kSgd)}, v1::ConsistencySpec::ASP, 1));
  auto exact = *Pull("j", 0, 0, {Block("w", 0)});
  for (auto dt : {v1::DT_FLOAT16, v1::DT_BFLOAT16}) {
    auto r = Pull("j", 0, 0, {Block("w", 0)}, nullptr, dt);
    ASSERT_TRUE(r.ok());
    for (int i = 0; i < 64; ++i) EXPECT_NEAR((*r)[i], exact[i], 4e-3) << i;
  }
  // A bf16 gradient of 1.0 is exactly 1.0 after widening.
  v1::PushChunk c = Chunk("j", 0, 0, 0);
  c.mutable_slice()->set_table("w");
  c.set_dtype(v1::DT_BFLOAT16);
  std::string g(64 * 2, '\0');
  for (int i = 0; i < 64; ++i) {
    uint16_t one = FloatToBFloat16(1.f);
    std::memcpy(&g[2 * i], &one, 2);
  }
  ASSERT_TRUE(h_->Push(c, Payload::FromString(g)).ok());
  auto after = *Pull("j", 0, 0, {Block("w", 0)});
  for (int i = 0; i < 64; ++i) EXPECT_FLOAT_EQ(after[i], exact[i] - 0.5f);
}


TEST_F(HandlerTest, TopKPushesScatterIntoTheBlock) {
  Create(CreateRequest("j", {DenseSpec("w", {100}, kSgd)}, v1::ConsistencySpec::ASP, 1));
  auto w0 = *Pull("j", 0, 0, {Block("w", 0)});
  v1::PushChunk c = Chunk("j", 0, 0, 0);
  c.mutable_slice()->set_table("w");
  std::vector<uint32_t> idx = {3, 97, 3};
  c.set_indices(std::string(reinterpret_cast<char*>(idx.data()), 12));
  ASSERT_TRUE(h_->Push(c, Payload::FromString(Bytes({1.f, 2.f, 4.f}))).ok());
  auto w1 = *Pull("j", 0, 0, {Block("w", 0)});
  for (int i = 0; i < 100; ++i) {
    float g = i == 3 ? 5.f : i == 97 ? 2.f : 0.f;
    EXPECT_FLOAT_EQ(w1[i], w0[i] - 0.5f * g) << i;
  }
  idx[1] = 100;  // Outside the block.
  c.set_indices(std::string(reinterpret_cast<char*>(idx.data()), 12));
  c.mutable_tag()->set_seq(1);
  absl::Status st = h_->Push(c, Payload::FromString(Bytes({1.f, 2.f, 4.f}))).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("indices"), std::string::npos) << st;
  EXPECT_EQ(*Pull("j", 0, 0, {Block("w", 0)}), w1);
}

class CheckpointTest : public HandlerTest {
 protected:
  void SetUp() override {
    HandlerTest::SetUp();
    Create(JobRequest());
  }
  static v1::CreateTablesRequest JobRequest() {
    auto momentum = Optimizer(v1::OptimizerSpec::MOMENTUM, 0.1f);
    momentum.set_momentum(0.9f);
    return CreateRequest("j",
                         {DenseSpec("adam", {200, 700}, kAdam), DenseSpec("mom", {33}, momentum),
                          SparseSpec("emb", 16, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f))},
                         v1::ConsistencySpec::SSP, 2, 1);
  }
  // A recovery's map for this server ("s0", every shard), restoring `files` at `step`.
  static v1::UpdateShardMapRequest RecoveryMap(uint64_t epoch, std::vector<std::string> files,
                                               int64_t step) {
    v1::UpdateShardMapRequest req;
    *req.mutable_map() = RoundRobinMap("j", epoch, {"a:1"});
    req.set_self("s0");
    for (auto& f : files) req.add_restore_from(std::move(f));
    req.set_restore_step(step);
    return req;
  }

  void Train(int from, int to) {
    for (int step = from; step < to; ++step) {
      for (uint32_t w = 0; w < 2; ++w) {
        for (uint64_t b = 0; b < 3; ++b) {
          std::vector<float> g(b < 2 ? 65536 : 140000 - 2 * 65536);
          for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(step * 0.7 + i * 0.01 + w);
          if (partial_ && b == 0 && step % 2 == 1) {
            // Only the second half of the block, on odd steps: its elements' step counts differ.
            v1::PushChunk c = Chunk("j", w, step, b);
            c.mutable_slice()->set_table("adam");
            c.mutable_slice()->set_block(b);
            c.set_offset(g.size() / 2);
            c.set_last(true);
            std::vector<float> half(g.begin() + g.size() / 2, g.end());
            ASSERT_TRUE(h_->Push(c, Payload::FromString(Bytes(half))).ok());
            continue;
          }
          ASSERT_TRUE(PushDense("j", w, step, b, "adam", b, g, false).ok());
        }
        ASSERT_TRUE(PushDense("j", w, step, 3, "mom", 0, std::vector<float>(33, 0.3f * step), false).ok());
        std::vector<uint64_t> keys = {static_cast<uint64_t>(step), 1000, 7u + w};
        ASSERT_TRUE(PushSparse("j", w, step, 4, "emb", keys, std::vector<float>(48, 0.5f), true).ok());
      }
    }
  }

  std::vector<float> All() {
    return *Pull("j", 0, 0,
                 {Block("adam", 0), Block("adam", 1), Block("adam", 2), Block("mom", 0),
                  Rows("emb", {0, 1, 2, 3, 4, 5, 1000, 7, 8})});
  }

  std::string Ckpt() {
    v1::CheckpointRequest req;
    req.set_job_id("j");
    v1::CheckpointResponse resp;
    absl::Status s = h_->Checkpoint(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_GT(resp.bytes(), 140000u * 3 * 4);
    return resp.path();
  }

  absl::Status Restore(const std::string& path) {
    v1::RestoreRequest req;
    req.set_job_id("j");
    req.set_path(path);
    v1::RestoreResponse resp;
    return h_->Restore(req, &resp);
  }

  bool partial_ = false;  // Train pushes only part of a block on odd steps.
};

TEST_F(CheckpointTest, RestoreReproducesTablesAndOptimizerStateBitForBit) {
  Train(0, 3);
  std::string path = Ckpt();
  EXPECT_NE(path.find("-step3.ckpt"), std::string::npos) << path;
  const auto at_ckpt = All();
  Train(3, 6);
  const auto trained = All();
  ASSERT_NE(trained, at_ckpt);
  ASSERT_TRUE(Restore(path).ok()) << Restore(path);
  EXPECT_EQ(Status("j").jobs(0).min_clock(), 3);
  const auto restored = All();
  ASSERT_EQ(std::memcmp(restored.data(), at_ckpt.data(), restored.size() * 4), 0);
  // The optimizer slots and step counts came back too: the same pushes give the same result.
  Train(3, 6);
  const auto retrained = All();
  EXPECT_EQ(std::memcmp(retrained.data(), trained.data(), trained.size() * 4), 0);
}

TEST_F(CheckpointTest, PartlyPushedBlocksKeepEachElementsStepCountThroughRestore) {
  partial_ = true;
  Train(0, 3);
  std::string path = Ckpt();
  auto h = ReadCheckpointHeader(path);
  ASSERT_TRUE(h.ok()) << h.status();
  const auto& blk = h->tables(0).blocks(0);  // "adam" block 0: 2 steps whole, 1 in half.
  ASSERT_EQ(blk.step_runs_size(), 2) << blk.DebugString();
  EXPECT_EQ(blk.step_runs(0).updates(), 2 * 2);
  EXPECT_EQ(blk.step_runs(1).updates(), 3 * 2);
  EXPECT_EQ(blk.step_runs(1).end(), 65536u);
  const auto at_ckpt = All();
  Train(3, 6);
  const auto trained = All();
  ASSERT_TRUE(Restore(path).ok()) << Restore(path);
  ASSERT_EQ(std::memcmp(All().data(), at_ckpt.data(), at_ckpt.size() * 4), 0);
  Train(3, 6);
  const auto retrained = All();
  EXPECT_EQ(std::memcmp(retrained.data(), trained.data(), trained.size() * 4), 0);
}

TEST_F(CheckpointTest, ARecoveryRestoresIntoTheTablesItsMapPrecedes) {
  Train(0, 3);
  const std::string path = Ckpt();
  const auto at_ckpt = All();
  Train(3, 6);
  const auto trained = All();
  ASSERT_NE(trained, at_ckpt);

  // A replacement server: the scheduler's map (with the files) arrives before the workers'
  // CreateTables, which then finds the checkpoint's state and every clock at its step.
  Make(PsHandlerOptions{});
  v1::UpdateShardMapResponse mresp;
  ASSERT_TRUE(h_->UpdateShardMap(RecoveryMap(2, {path}, 3), &mresp).ok());
  Create(JobRequest());
  epoch_ = 2;
  const auto restored = All();
  ASSERT_EQ(std::memcmp(restored.data(), at_ckpt.data(), restored.size() * 4), 0);
  auto st = Status("j").jobs(0);
  EXPECT_EQ(st.min_clock(), 3);
  EXPECT_EQ(st.epoch(), 2u);
  for (const auto& c : st.clocks()) EXPECT_EQ(c.clock(), 3) << "worker " << c.worker();
  // Workers resuming at step 3 get exactly what the original run got.
  Train(3, 6);
  const auto retrained = All();
  EXPECT_EQ(std::memcmp(retrained.data(), trained.data(), trained.size() * 4), 0);

  // The same map again (a scheduler retrying its placement) is a no-op; a newer one that
  // restores into these live tables is refused and changes nothing.
  ASSERT_TRUE(h_->UpdateShardMap(RecoveryMap(2, {path}, 3), &mresp).ok());
  absl::Status s = h_->UpdateShardMap(RecoveryMap(3, {path}, 3), &mresp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("DropJob first"), std::string::npos) << s;
  EXPECT_EQ(Status("j").jobs(0).epoch(), 2u);
  EXPECT_EQ(All(), retrained);
}

TEST_F(CheckpointTest, ARecoveryFromABadFileCreatesNothingAndNamesTheFile) {
  Train(0, 3);
  const std::string path = Ckpt();
  std::string bytes = *ReadFile(path);
  bytes[bytes.size() / 2] ^= 1;
  const std::string damaged = path + ".damaged.ckpt";
  ASSERT_TRUE(WriteFileAtomically(damaged, bytes).ok());

  Make(PsHandlerOptions{});
  v1::UpdateShardMapResponse mresp;
  v1::CreateTablesResponse cresp;
  struct Case {
    v1::UpdateShardMapRequest map;
    absl::StatusCode code;
    std::string says;
  };
  const Case cases[] = {
      {RecoveryMap(2, {damaged}, 3), absl::StatusCode::kDataLoss, damaged},
      {RecoveryMap(3, {path + ".missing"}, 3), absl::StatusCode::kNotFound, path + ".missing"},
      {RecoveryMap(4, {path}, 5), absl::StatusCode::kFailedPrecondition, "is at step 3"},
  };
  for (const Case& c : cases) {
    ASSERT_TRUE(h_->UpdateShardMap(c.map, &mresp).ok());
    absl::Status s = h_->CreateTables(JobRequest(), &cresp);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_EQ(Status().jobs_size(), 0) << "a job with half-restored tables was published";
  }
  // Bad requests are refused outright.
  EXPECT_EQ(h_->UpdateShardMap(RecoveryMap(5, {""}, 3), &mresp).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h_->UpdateShardMap(RecoveryMap(5, {path}, -1), &mresp).code(),
            absl::StatusCode::kInvalidArgument);
  // The scheduler's next placement names a good file: the job comes up restored.
  ASSERT_TRUE(h_->UpdateShardMap(RecoveryMap(6, {path}, 3), &mresp).ok());
  Create(JobRequest());
  EXPECT_EQ(Status("j").jobs(0).min_clock(), 3);
}

TEST_F(CheckpointTest, CorruptOrTruncatedCheckpointsAreRefusedAndChangeNothing) {
  Train(0, 2);
  std::string path = Ckpt();
  std::string good = *ReadFile(path);
  Train(2, 3);
  const auto before = All();
  struct Case {
    std::string name;
    std::string bytes;
    std::string needle;
  };
  std::string flipped = good;
  flipped[good.size() / 2] ^= 0x40;
  std::vector<Case> cases = {
      {"flipped", flipped, "checksum mismatch"},
      {"truncated", good.substr(0, good.size() - 1000), "truncated"},
      {"cut_trailer", good.substr(0, good.size() - 5), "truncated"},
      {"empty", "", "not a pscluster checkpoint"},
      {"padded", good + "xxxxxxxxxxxxxxxxxxxxxxxx", "truncated"},
  };
  for (const auto& c : cases) {
    std::string p = TempDir("bad-" + c.name + ".ckpt");
    ASSERT_TRUE(WriteFileAtomically(p, c.bytes).ok());
    absl::Status s = Restore(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.name << ": " << s;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << c.name << ": " << s;
    EXPECT_NE(s.message().find(p), std::string::npos) << "names the file: " << s;
  }
  EXPECT_EQ(All(), before);
  EXPECT_EQ(Status("j").jobs(0).min_clock(), 3);
  EXPECT_EQ(Restore(TempDir("missing.ckpt")).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Restore(path).ok());
}

// Damage of every kind, at random places: bit flips (header, body, trailer), truncation at any
// length, bytes inserted or a range repeated. Every file is refused as DATA_LOSS naming it, and
// the job's state stays exactly as it was.
TEST_F(CheckpointTest, RandomlyDamagedCheckpointsAreRefusedAndChangeNothing) {
  Train(0, 2);
  const std::string good = *ReadFile(Ckpt());
  Train(2, 3);
  const auto before = All();
  std::mt19937_64 rng(20261130);
  auto at = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const std::string p = TempDir("damaged.ckpt");
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    std::string bytes = good;
    switch (i % 5) {
      case 0:  // Bits flipped anywhere.
        for (int f = 0, n = 1 + static_cast<int>(rng() % 4); f < n; ++f) {
          bytes[at(bytes.size())] ^= static_cast<char>(1u << (rng() % 8));
        }
        break;
      case 1:  // Bits flipped in the first or last 64 bytes (header, trailer).
        for (int f = 0, n = 1 + static_cast<int>(rng() % 4); f < n; ++f) {
          const size_t k = at(64);
          bytes[rng() % 2 ? k : bytes.size() - 1 - k] ^= static_cast<char>(1u << (rng() % 8));
        }
        break;
      case 2:  // Cut anywhere.
        bytes.resize(at(bytes.size()));
        break;
      case 3:  // Bytes inserted.
        bytes.insert(at(bytes.size()), std::string(1 + at(16), static_cast<char>(rng())));
        break;
      default: {  // A range repeated.
        const size_t from = at(bytes.size()), len = 1 + at(std::min<size_t>(4096, good.size() - from));
        bytes.insert(at(bytes.size()), good.substr(from, len));
        break;
      }
    }
    if (bytes == good) continue;
    ASSERT_TRUE(WriteFileAtomically(p, bytes).ok());
    absl::Status s = Restore(p);
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "damage " << i << ": " << s;
    ASSERT_NE(s.message().find(p), std::string::npos) << "names the file: " << s;
    ++refused;
  }
  EXPECT_GE(refused, 290);
  EXPECT_EQ(All(), before);
  EXPECT_EQ(Status("j").jobs(0).min_clock(), 3);
}

TEST_F(CheckpointTest, ExportsDenseTablesAsSafetensors) {
  Train(0, 2);
  const auto values = All();
  v1::ExportRequest req;
  req.set_job_id("j");
  req.set_path(TempDir("export/model.safetensors"));
  v1::ExportResponse resp;
  ASSERT_TRUE(h_->Export(req, &resp).ok());
  EXPECT_EQ(resp.tensors(), 2u);
  auto f = SafetensorsFile::Read(req.path());
  ASSERT_TRUE(f.ok()) << f.status();
  const auto* adam = f->Find("adam");
  ASSERT_NE(adam, nullptr);
  EXPECT_EQ(adam->shape, (std::vector<uint64_t>{200, 700}));
  EXPECT_EQ(adam->dtype, v1::DT_FLOAT32);
  EXPECT_EQ(std::memcmp(f->Data(*adam).data(), values.data(), 140000 * 4), 0);
  EXPECT_EQ(f->Find("mom")->shape, (std::vector<uint64_t>{33}));
  EXPECT_EQ(f->metadata().at("pscluster.step"), "2");
  // A sparse table named explicitly exports its materialised rows.
  req.add_tables("emb");
  ASSERT_TRUE(h_->Export(req, &resp).ok());
  f = SafetensorsFile::Read(req.path());
  EXPECT_EQ(f->Find("emb:values")->shape[1], 16u);
  req.add_tables("nope");
  absl::Status s = h_->Export(req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tables[1]"), std::string::npos);
}

TEST_F(HandlerTest, WritesPeriodicCheckpointsAndKeepsTheNewest) {
  PsHandlerOptions o;
  o.keep_checkpoints = 2;
  o.checkpoint_dir = TempDir("periodic");
  Make(o);
  auto r = CreateRequest("j", {DenseSpec("w", {10}, kSgd)}, v1::ConsistencySpec::BSP, 2);
  r.set_checkpoint_every_steps(2);
  Create(r);
  for (int step = 0; step < 8; ++step) {
    for (uint32_t w = 0; w < 2; ++w) {
      ASSERT_TRUE(PushDense("j", w, step, 0, "w", 0, std::vector<float>(10, 1.f), true).ok());
    }
  }
  std::vector<std::string> files;
  DIR* d = opendir((o.checkpoint_dir + "/j").c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') files.push_back(e->d_name);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"server-step6.ckpt", "server-step8.ckpt"}));
  auto st = Status("j").jobs(0);
  EXPECT_NE(st.last_checkpoint().find("server-step8.ckpt"), std::string::npos);
  EXPECT_GE(st.checkpoint_age_sec(), 0.0);
}

// The snapshot of a periodic checkpoint is taken before the reads that the step released are
// served: a worker that pushes its next step the moment its read is released (here, from the
// read's own callback) does not get that step into the checkpoint. A recovery restoring it then
// replays that step once, not twice.
TEST_F(HandlerTest, APeriodicCheckpointHoldsExactlyTheStepsUpToItsClock) {
  PsHandlerOptions o;
  o.checkpoint_dir = TempDir("exact");
  Make(o);
  auto r = CreateRequest("j", {DenseSpec("w", {10}, kSgd)}, v1::ConsistencySpec::BSP, 2);
  r.set_checkpoint_every_steps(2);
  Create(r);
  auto w0 = Pull("j", 0, 0, {Block("w", 0)});
  ASSERT_TRUE(w0.ok());
  const std::vector<float> g(10, 1.f);
  ASSERT_TRUE(PushDense("j", 0, 0, 0, "w", 0, g, true).ok());
  ASSERT_TRUE(PushDense("j", 1, 0, 0, "w", 0, g, true).ok());
  ASSERT_TRUE(PushDense("j", 0, 1, 0, "w", 0, g, true).ok());
  // Worker 0 waits to read at clock 2 and pushes step 2 as soon as it may.
  v1::PullRequest pull;
  pull.set_job_id("j");
  pull.set_worker(0);
  pull.set_clock(2);
  *pull.add_slices() = Block("w", 0);
  auto plan = h_->PlanPull(pull);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::atomic<bool> pushed{false};
  uint64_t wait = 0;
  ASSERT_FALSE(plan->job->WhenReadable(2, [&](absl::Status) {
    pushed = PushDense("j", 0, 2, 0, "w", 0, g, true).ok();
  }, &wait));
  // Worker 1's push completes step 1: the checkpoint at step 2 falls due.
  ASSERT_TRUE(PushDense("j", 1, 1, 0, "w", 0, g, true).ok());
  ASSERT_TRUE(pushed.load());
  const std::string path = o.checkpoint_dir + "/j/server-step2.ckpt";
  auto h = ReadCheckpointHeader(path);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->step(), 2);
  ASSERT_EQ(h->tables_size(), 1);
  ASSERT_EQ(h->tables(0).blocks_size(), 1);
  EXPECT_EQ(h->tables(0).blocks(0).updates(), 4) << "two workers x two steps, nothing of step 2";
  // The early push of step 2 did land, after the snapshot.
  auto now = Pull("j", 0, 2, {Block("w", 0)});
  ASSERT_TRUE(now.ok());
  EXPECT_FLOAT_EQ((*now)[0], (*w0)[0] - 0.5f * 5);
}

TEST_F(HandlerTest, MemoryLimitRefusesTablesThatDoNotFit) {
  PsHandlerOptions o;
  o.memory_bytes = 1 << 20;
  Make(o);
  Create(CreateRequest("j", {DenseSpec("small", {1000}, kAdam)}, v1::ConsistencySpec::ASP, 1));
  v1::CreateTablesResponse resp;
  absl::Status s = h_->CreateTables(
      CreateRequest("j", {DenseSpec("big", {1 << 20}, kSgd)}, v1::ConsistencySpec::ASP, 1), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("memory_bytes"), std::string::npos) << s;
  EXPECT_EQ(Status("j").jobs(0).tables_size(), 1);
  EXPECT_EQ(h_->budget()->used(), 1000u * 3 * 4);
}

// A sparse push whose new rows do not fit changes nothing, and keeps exactly-once: its retry,
// once memory is free, applies every row exactly once.
TEST_F(HandlerTest, ASparsePushRefusedForMemoryChangesNothing) {
  const auto spec = SparseSpec("e", 4, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f));
  const uint64_t row_bytes = 4 * 2 * 4;  // Width 4, Adagrad: weights + one slot.
  std::vector<uint64_t> old_keys, keys;
  for (uint64_t k = 0; k < 10; ++k) old_keys.push_back(k);
  keys = old_keys;  // The old rows first, then 15 new ones.
  for (uint64_t k = 100; k < 115; ++k) keys.push_back(k);
  const std::vector<float> g(keys.size() * 4, 0.5f);
  // What the pushes give with memory to spare.
  Create(CreateRequest("j", {spec}, v1::ConsistencySpec::ASP, 1));
  ASSERT_TRUE(PushSparse("j", 0, 0, 0, "e", old_keys, std::vector<float>(40, 1.f), true).ok());
  ASSERT_TRUE(PushSparse("j", 0, 1, 0, "e", keys, g, true).ok());
  const std::vector<float> expect = *Pull("j", 0, 2, {Rows("e", keys)});

  PsHandlerOptions o;
  o.memory_bytes = 30 * row_bytes;
  Make(o);
  Create(CreateRequest("k", {spec}, v1::ConsistencySpec::ASP, 1));
  ASSERT_TRUE(PushSparse("k", 0, 0, 0, "e", old_keys, std::vector<float>(40, 1.f), true).ok());
  Create(CreateRequest("j", {spec}, v1::ConsistencySpec::ASP, 1));
  ASSERT_TRUE(PushSparse("j", 0, 0, 0, "e", old_keys, std::vector<float>(40, 1.f), true).ok());
  const std::vector<float> before = *Pull("j", 0, 1, {Rows("e", old_keys)});
  const uint64_t used = h_->budget()->used();
  ASSERT_EQ(used, 20 * row_bytes);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto r = PushSparse("j", 0, 1, 0, "e", keys, g, true);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
    EXPECT_NE(r.status().message().find("table 'e'"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("--memory_bytes"), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("15 new rows"), std::string::npos) << r.status();
    EXPECT_EQ(h_->budget()->used(), used);
    EXPECT_EQ(Status("j").jobs(0).tables(0).rows(), 10u);
    EXPECT_EQ(Status("j").jobs(0).clocks(0).clock(), 1) << "the step did not complete";
    EXPECT_EQ(*Pull("j", 0, 1, {Rows("e", old_keys)}), before) << "attempt " << attempt;
  }
  // The other job's rows go; the retry applies, each row once, and a further copy of it is a
  // duplicate.
  v1::DropJobRequest drop;
  drop.set_job_id("k");
  v1::DropJobResponse dropped;
  ASSERT_TRUE(h_->DropJob(drop, &dropped).ok());
  auto r = PushSparse("j", 0, 1, 0, "e", keys, g, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->applied);
  EXPECT_EQ(*Pull("j", 0, 2, {Rows("e", keys)}), expect);
  r = PushSparse("j", 0, 1, 0, "e", keys, g, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->duplicate);
  EXPECT_EQ(*Pull("j", 0, 2, {Rows("e", keys)}), expect);
}

// With aggregation, a sparse push's new rows are made (all or nothing) when it is aggregated: a
// push whose rows do not fit is refused then, and a step that was aggregated always applies.
TEST_F(HandlerTest, AnAggregatedSparsePushThatDoesNotFitIsRefusedWhenItArrives) {
  PsHandlerOptions o;
  const uint64_t row_bytes = 4 * 2 * 4;  // Width 4, Adagrad.
  o.memory_bytes = 10 * row_bytes;
  Make(o);
  Create(CreateRequest("j", {SparseSpec("e", 4, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f))},
                       v1::ConsistencySpec::BSP, 2, 0, /*aggregate=*/true));
  std::vector<uint64_t> few = {1, 2, 3}, many;
  for (uint64_t k = 100; k < 120; ++k) many.push_back(k);
  auto r = PushSparse("j", 0, 0, 0, "e", many, std::vector<float>(many.size() * 4, 1.f), true);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_EQ(h_->budget()->used(), 0u);
  EXPECT_EQ(Status("j").jobs(0).clocks(0).clock(), 0);
  ASSERT_TRUE(PushSparse("j", 0, 0, 0, "e", few, std::vector<float>(12, 1.f), true).ok());
  ASSERT_TRUE(PushSparse("j", 1, 0, 0, "e", few, std::vector<float>(12, 1.f), true).ok());
  EXPECT_EQ(h_->budget()->used(), 3 * row_bytes);
  EXPECT_EQ(Status("j").jobs(0).min_clock(), 1);
}

// A push more than one step ahead of its worker's clock is refused in every mode, and the
// worker's real push of its current step is then applied, not taken for a duplicate.
TEST_F(HandlerTest, APushFarAheadOfTheWorkersClockIsRefused) {
  for (auto mode : {v1::ConsistencySpec::BSP, v1::ConsistencySpec::SSP,
                    v1::ConsistencySpec::ASP}) {
    SCOPED_TRACE(v1::ConsistencySpec::Mode_Name(mode));
    const std::string job = "j" + std::to_string(static_cast<int>(mode));
    Create(CreateRequest(job, {DenseSpec("w", {10}, kSgd)}, mode, 1, 1));
    const std::vector<float> g(10, 1.f);
    ASSERT_TRUE(PushDense(job, 0, 0, 0, "w", 0, g, true).ok());
    const std::vector<float> at1 = *Pull(job, 0, 1, {Block("w", 0)});
    for (int64_t ahead : {int64_t{3}, int64_t{1000}}) {
      auto r = PushDense(job, 0, ahead, 0, "w", 0, g, true);
      ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
      EXPECT_NE(r.status().message().find(absl::StrCat("step ", ahead)), std::string::npos)
          << r.status();
      EXPECT_NE(r.status().message().find("clock 1"), std::string::npos) << r.status();
      EXPECT_NE(r.status().message().find("tag.step"), std::string::npos) << r.status();
      EXPECT_EQ(Status(job).jobs(0).clocks(0).clock(), 1);
      EXPECT_EQ(*Pull(job, 0, 1, {Block("w", 0)}), at1);
    }
    // One step ahead is still taken (a worker may start its next step's push early).
    auto next = PushDense(job, 0, 2, 5, "w", 0, g, false);
    ASSERT_TRUE(next.ok()) << next.status();
    auto r = PushDense(job, 0, 1, 0, "w", 0, g, true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->applied);
    EXPECT_FALSE(r->duplicate);
    EXPECT_EQ(r->clock, 2);
  }
}

TEST_F(HandlerTest, StatusReportsRatesAndTotals) {
  Create(CreateRequest("j", {DenseSpec("w", {1000}, kSgd)}, v1::ConsistencySpec::ASP, 1));
  Status();  // First rate sample.
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(PushDense("j", 0, i, 0, "w", 0, std::vector<float>(1000, 0.1f), true).ok());
  }
  clock_.Advance(absl::Seconds(2));
  v1::Load load;
  std::vector<v1::ShardLoad> shards;
  h_->Tick(&load, &shards);
  auto st = Status();
  EXPECT_EQ(st.pushes_total(), 10u);
  EXPECT_EQ(st.bytes_in_total(), 40000u);
  EXPECT_DOUBLE_EQ(st.push_per_sec(), 5.0);
  EXPECT_DOUBLE_EQ(st.bytes_in_per_sec(), 20000.0);
  ASSERT_EQ(shards.size(), 1u);
  EXPECT_DOUBLE_EQ(shards[0].load().bytes_per_sec(), 20000.0);
  EXPECT_EQ(load.memory_used_bytes(), 4000u);
  EXPECT_EQ(st.shard_loads_size(), 1);
  EXPECT_EQ(st.jobs(0).clocks(0).clock(), 10);
  EXPECT_GT(st.uptime_sec(), 1.9);
}

}  // namespace
}  // namespace pscluster
