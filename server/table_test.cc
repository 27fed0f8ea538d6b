// Table storage: copy-on-write weights lent to pulls, optimizer step counts per element,
// sparse rows and the memory budget.
#include "server/table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/sharding.h"
#include "server/payload.h"
#include "server/testing/reference_optimizer.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

OptimizerParams Params(const v1::OptimizerSpec& spec) { return *ResolveOptimizer(spec, "o"); }

TEST(DenseTableTest, LentWeightsStayUnchangedWhileAPushCopiesOnWrite) {
  auto spec = DenseSpec("w", {1000}, Optimizer(v1::OptimizerSpec::SGD, 1.f), 500);
  TableInfo info(spec, Params(spec.optimizer()), 4);
  DenseTable t(&info);
  MemoryBudget budget(0);
  ASSERT_TRUE(t.SetHeldShards({true, true, true, true}, &budget).ok());
  DenseBlock* b = t.block(1);
  const uint64_t process_copies = DenseCopiesOnWrite();
  LentBytes lent = t.Lend(b, 0, 500);
  std::vector<float> before(500);
  std::memcpy(before.data(), lent.data, 2000);
  std::vector<float> g(500, 1.f);
  auto grad = [&](size_t f, size_t k, float* out) { std::memcpy(out, g.data() + f, k * 4); };
  t.Apply(b, 0, 500, grad);
  EXPECT_EQ(std::memcmp(lent.data, before.data(), 2000), 0) << "lent bytes changed";
  std::vector<float> now(500);
  t.Read(b, 0, 500, v1::DT_FLOAT32, reinterpret_cast<char*>(now.data()));
  for (int i = 0; i < 500; ++i) ASSERT_FLOAT_EQ(now[i], before[i] - 1.f);
  {
    absl::MutexLock l(&b->mu);
    EXPECT_EQ(b->copies_on_write, 1u);
  }
  // Once the loan is returned, updates happen in place again.
  lent = LentBytes();
  t.Apply(b, 0, 500, grad);
  absl::MutexLock l(&b->mu);
  EXPECT_EQ(b->copies_on_write, 1u);
  EXPECT_EQ(b->steps.max(), 2);
  EXPECT_EQ(DenseCopiesOnWrite(), process_copies + 1);  // What the server's Status reports.
}

// Pushes a block's gradients for `steps` steps in the pieces `pieces(step)` gives (offset,
// length), in that order, through ApplyPayload as the job does, and checks every element against
// the float64 reference stepped once for each push that covered it.
void CheckPiecesAgainstReference(
    const v1::OptimizerSpec& opt, const char* what,
    const std::function<std::vector<std::pair<uint64_t, uint64_t>>(int)>& pieces) {
  SCOPED_TRACE(what);
  const uint64_t n = 1000;
  const int steps = 20;
  auto spec = DenseSpec("w", {n}, opt, n);
  TableInfo info(spec, Params(spec.optimizer()), 1);
  DenseTable t(&info);
  MemoryBudget budget(0);
  ASSERT_TRUE(t.SetHeldShards({true}, &budget).ok());
  std::vector<float> w(n);
  t.Read(t.block(0), 0, n, v1::DT_FLOAT32, reinterpret_cast<char*>(w.data()));
  std::vector<Ref> ref(n);
  std::vector<int64_t> seen(n, 0);
  for (uint64_t i = 0; i < n; ++i) ref[i].w = w[i];
  std::mt19937 rng(5);
  std::normal_distribution<float> noise(0.f, 1.f);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g(n);
    for (float& x : g) x = noise(rng);
    for (auto [off, len] : pieces(s)) {
      std::string bytes(reinterpret_cast<const char*>(g.data() + off), len * sizeof(float));
      t.ApplyPayload(t.block(0), off, len, Payload::FromString(std::move(bytes)), v1::DT_FLOAT32,
                     s);
      for (uint64_t i = off; i < off + len; ++i) RefStep(info.optimizer, ++seen[i], g[i], &ref[i]);
    }
  }
  t.Read(t.block(0), 0, n, v1::DT_FLOAT32, reinterpret_cast<char*>(w.data()));
  double max_err = 0;
  for (uint64_t i = 0; i < n; ++i) {
    max_err = std::max(max_err, std::fabs(w[i] - ref[i].w) / std::max(1e-2, std::fabs(ref[i].w)));
  }
  EXPECT_LT(max_err, 1e-5);
}

TEST(DenseTableTest, EveryElementSeesOneAdamStepPerPushWhateverTheSplit) {
  using Pieces = std::vector<std::pair<uint64_t, uint64_t>>;
  v1::OptimizerSpec adam = Optimizer(v1::OptimizerSpec::ADAM, 0.01f);
  v1::OptimizerSpec adamw = adam;
  adamw.set_weight_decay(0.1f);
  adamw.set_decoupled_weight_decay(true);
  for (const auto& opt : {adam, adamw}) {
    CheckPiecesAgainstReference(opt, "whole", [](int) { return Pieces{{0, 1000}}; });
    CheckPiecesAgainstReference(opt, "split in order",
                                [](int) { return Pieces{{0, 400}, {400, 600}}; });
    CheckPiecesAgainstReference(opt, "split reversed",
                                [](int) { return Pieces{{400, 600}, {0, 400}}; });
    CheckPiecesAgainstReference(opt, "second half only", [](int) { return Pieces{{500, 500}}; });
    CheckPiecesAgainstReference(opt, "moving partial slices", [](int s) {
      const uint64_t off = (s * 137) % 900;
      return Pieces{{off, 100}, {(off + 450) % 900, 50}};
    });
  }
}

TEST(DenseTableTest, AChunkAdvancesTheStepCountOfItsOwnElementsOnly) {
  auto spec = DenseSpec("w", {100}, Optimizer(v1::OptimizerSpec::ADAM, 0.1f));
  TableInfo info(spec, Params(spec.optimizer()), 1);
  DenseTable t(&info);
  MemoryBudget budget(0);
  ASSERT_TRUE(t.SetHeldShards({true}, &budget).ok());
  auto one = [](size_t, size_t k, float* out) { std::fill(out, out + k, 1.f); };
  t.Apply(t.block(0), 50, 50, one);
  {
    absl::MutexLock l(&t.block(0)->mu);
    EXPECT_EQ(t.block(0)->steps.Runs(), (std::vector<StepCounts::Run>{{50, 0}, {100, 1}}));
  }
  t.Apply(t.block(0), 0, 50, one);
  absl::MutexLock l(&t.block(0)->mu);
  EXPECT_TRUE(t.block(0)->steps.uniform());
  EXPECT_EQ(t.block(0)->steps.max(), 1);
}

TEST(DenseTableTest, HoldsOnlyTheBlocksOfItsShards) {
  auto spec = DenseSpec("w", {64, 100}, Optimizer(v1::OptimizerSpec::MOMENTUM, 0.1f), 100);
  TableInfo info(spec, Params(spec.optimizer()), 8);
  DenseTable t(&info);
  MemoryBudget budget(0);
  std::vector<bool> held(8, false);
  held[3] = true;
  ASSERT_TRUE(t.SetHeldShards(held, &budget).ok());
  uint64_t expect = 0;
  for (uint64_t b = 0; b < 64; ++b) {
    bool mine = ShardOfBlock(TableHash("w"), b, 8) == 3;
    expect += mine;
    EXPECT_EQ(t.block(b) != nullptr, mine) << b;
  }
  EXPECT_EQ(t.blocks_held(), expect);
  EXPECT_EQ(budget.used(), expect * 100 * 2 * 4);
  t.Clear(&budget);
  EXPECT_EQ(budget.used(), 0u);
}

TEST(SparseTableTest, BudgetLimitsNewRowsAndDropsFreeThem) {
  auto spec = SparseSpec("e", 4, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f));
  TableInfo info(spec, Params(spec.optimizer()), 4);
  SparseTable t(&info);
  const size_t row_bytes = 4 * 2 * 4;
  MemoryBudget budget(row_bytes * 10);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 10; ++k) keys.push_back(k * 977);
  auto grad = [](size_t, size_t k, float* out) { std::fill(out, out + k, 0.5f); };
  ASSERT_TRUE(t.Apply(keys, grad, &budget).ok());
  EXPECT_EQ(t.rows(), 10u);
  const uint64_t more[] = {123456};
  absl::Status st = t.Apply(more, grad, &budget);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("memory_bytes"), std::string::npos) << st;
  // Existing rows are still updated, and any key is still read (a missing one needs no memory).
  EXPECT_TRUE(t.Apply(keys, grad, &budget).ok());
  std::vector<char> out((keys.size() + 1) * 16);
  keys.push_back(123456);
  t.Read(keys, v1::DT_FLOAT32, out.data());
  keys.pop_back();
  EXPECT_EQ(t.rows(), 10u);
  std::vector<bool> held(4, true);
  held[t.ShardOf(keys[0])] = false;
  t.DropUnheld(held, &budget);
  EXPECT_LT(t.rows(), 10u);
  EXPECT_EQ(budget.used(), t.rows() * row_bytes);
  uint64_t last = 0;
  int n = 0;
  t.ForEachRowSorted([&](uint64_t key, int64_t, const float*) {
    EXPECT_TRUE(n == 0 || key > last);
    last = key;
    ++n;
  });
  EXPECT_EQ(static_cast<uint64_t>(n), t.rows());
}

// Pushes tagged with later steps get the scheduled (smaller) learning rate, dense and sparse.
TEST(TableScheduleTest, ApplyUsesTheRateOfThePushesStep) {
  v1::OptimizerSpec opt = Optimizer(v1::OptimizerSpec::SGD, 1.f);
  opt.set_lr_schedule(v1::OptimizerSpec::COSINE);
  opt.set_lr_decay_steps(100);
  auto spec = DenseSpec("w", {10}, opt, 10);
  TableInfo info(spec, Params(spec.optimizer()), 1);
  DenseTable t(&info);
  MemoryBudget budget(0);
  ASSERT_TRUE(t.SetHeldShards({true}, &budget).ok());
  auto one = [](size_t, size_t k, float* out) { std::fill(out, out + k, 1.f); };
  std::vector<float> w0(10), w1(10), w2(10);
  t.Read(t.block(0), 0, 10, v1::DT_FLOAT32, reinterpret_cast<char*>(w0.data()));
  t.Apply(t.block(0), 0, 10, one, /*step=*/0);
  t.Read(t.block(0), 0, 10, v1::DT_FLOAT32, reinterpret_cast<char*>(w1.data()));
  t.Apply(t.block(0), 0, 10, one, /*step=*/50);
  t.Read(t.block(0), 0, 10, v1::DT_FLOAT32, reinterpret_cast<char*>(w2.data()));
  EXPECT_NEAR(w0[3] - w1[3], 1.0f, 1e-6f);   // Full rate at step 0.
  EXPECT_NEAR(w1[3] - w2[3], 0.5f, 1e-6f);   // Half way down the cosine at step 50.
}

}  // namespace
}  // namespace pscluster
