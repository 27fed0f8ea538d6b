// Unit tier: tables, exactly-once pushes, aggregation, transports, memory limits and status,
// driven through PsHandler with a fake clock (no gRPC; testing/handler_fixture.h).
#include <limits>

#include "server/testing/handler_fixture.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

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

TEST_F(HandlerTest, Int8PushesAreWidenedWithTheirGroupScales) {
  Create(CreateRequest("j", {DenseSpec("w", {6}, kSgd)}, v1::ConsistencySpec::ASP, 1));
  auto w0 = *Pull("j", 0, 0, {Block("w", 0)});
  v1::PushChunk c = Chunk("j", 0, 0, 0);
  c.mutable_slice()->set_table("w");
  c.set_dtype(v1::DT_INT8);
  c.set_scale_group(4);
  std::vector<float> scales = {0.5f, 2.f};  // Values 0-3, then 4-5.
  c.set_scales(std::string(reinterpret_cast<char*>(scales.data()), 8));
  const std::string q = {1, -2, 0, 127, 3, -1};
  ASSERT_TRUE(h_->Push(c, Payload::FromString(q)).ok());
  auto w1 = *Pull("j", 0, 0, {Block("w", 0)});
  const float g[] = {0.5f, -1.f, 0.f, 63.5f, 6.f, -2.f};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(w1[i], w0[i] - 0.5f * g[i]) << i;
  // Scales that do not cover the values, or are not finite: refused, nothing applied.
  c.mutable_tag()->set_seq(1);
  c.set_scales(std::string(reinterpret_cast<char*>(scales.data()), 4));
  absl::Status st = h_->Push(c, Payload::FromString(q)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("scales:"), std::string::npos) << st;
  scales[1] = std::numeric_limits<float>::infinity();
  c.set_scales(std::string(reinterpret_cast<char*>(scales.data()), 8));
  st = h_->Push(c, Payload::FromString(q)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not a finite number"), std::string::npos) << st;
  c.set_scale_group(0);
  st = h_->Push(c, Payload::FromString(q)).status();
  EXPECT_NE(st.message().find("scale_group"), std::string::npos) << st;
  EXPECT_EQ(*Pull("j", 0, 0, {Block("w", 0)}), w1);
}

TEST_F(HandlerTest, TopKAndInt8AreRefusedOnSparseTables) {
  auto spec = SparseSpec("e", 4, 0, kSgd);
  spec.mutable_compression()->set_quantize(v1::CompressionSpec::QUANTIZE_INT8);
  v1::CreateTablesResponse resp;
  absl::Status s =
      h_->CreateTables(CreateRequest("j", {spec}, v1::ConsistencySpec::ASP, 1), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("compression.quantize: applies to dense tables only"),
            std::string::npos) << s;
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
