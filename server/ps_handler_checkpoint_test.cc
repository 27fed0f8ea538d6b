// PsHandler's checkpoints, restores and exports with a fake clock: bit-for-bit restores, damaged
// files refused, periodic checkpoints (testing/handler_fixture.h).
#include <sys/stat.h>

#include <cstring>
#include <functional>
#include <set>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "common/testing/fault_injection_fs.h"
#include "server/testing/handler_fixture.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT
using ::pscluster::testing::FaultInjectionFileSystem;

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

// Checkpoints go through the handler's file system. A crash after any step of writing one
// (create, write, fsync, close, rename, directory fsync) leaves only whole checkpoints: the
// previous one, and the new one once it was renamed; a file named .ckpt always restores. Once
// Checkpoint returned, the new one survives.
TEST_F(CheckpointTest, ACrashWhileACheckpointIsWrittenLeavesOnlyWholeCheckpoints) {
  for (int k = 0;; ++k) {
    SCOPED_TRACE(::testing::Message() << "crash after step " << k << " of the second checkpoint");
    FaultInjectionFileSystem fs;
    PsHandlerOptions o;
    o.fs = &fs;
    o.checkpoint_dir = "/ckpt";
    Make(o);
    Create(JobRequest());
    Train(0, 2);
    const std::string first = Ckpt();
    ASSERT_TRUE(absl::StartsWith(first, "/ckpt/j/") && absl::EndsWith(first, "-step2.ckpt"))
        << first;
    const std::string second = absl::StrReplaceAll(first, {{"-step2.ckpt", "-step4.ckpt"}});
    Train(2, 4);
    fs.CrashAfter(k);
    v1::CheckpointRequest req;
    req.set_job_id("j");
    v1::CheckpointResponse resp;
    const absl::Status written = h_->Checkpoint(req, &resp);
    fs.Crash();
    auto names = fs.ListDir("/ckpt/j");
    ASSERT_TRUE(names.ok()) << names.status();
    std::set<std::string> ckpts;
    for (const std::string& n : *names) {
      if (absl::EndsWith(n, ".ckpt")) ckpts.insert("/ckpt/j/" + n);
    }
    ASSERT_TRUE(ckpts.count(first)) << "the previous checkpoint is gone";
    for (const std::string& path : ckpts) {
      v1::RestoreRequest rr;
      rr.set_job_id("j");
      rr.set_path(path);
      v1::RestoreResponse restored;
      ASSERT_TRUE(h_->Restore(rr, &restored).ok()) << path << ": " << h_->Restore(rr, &restored);
      EXPECT_EQ(restored.step(), path == first ? 2 : 4) << path;
    }
    if (written.ok()) {
      EXPECT_TRUE(ckpts.count(second)) << "a written checkpoint was lost";
      EXPECT_GE(k, 6);
      break;
    }
    ASSERT_LT(k, 20) << "the checkpoint never completed";
  }
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

// ListKeys: the keys pushed (never one only read), increasing, a page at a time; every bad
// request refused with its code and field; a job with a data secret answers only a call that
// proves it, for the worker it names.
TEST_F(CheckpointTest, ListKeysGivesThePushedKeysAndRefusesBadRequests) {
  Train(0, 2);
  ASSERT_TRUE(Pull("j", 0, 2, {Rows("emb", {5, 77})}).ok());  // Read only: no rows.
  auto list = [&](v1::ListKeysRequest req, const PsHandler::GrpcDataProof& proof = {}) {
    v1::ListKeysResponse resp;
    absl::Status s = h_->ListKeys(req, &resp, proof);
    std::vector<uint64_t> keys(resp.keys().size() / 8);
    std::memcpy(keys.data(), resp.keys().data(), keys.size() * 8);
    return std::make_tuple(s, keys, resp.more());
  };
  v1::ListKeysRequest req;
  req.set_job_id("j");
  req.set_table("emb");
  auto [s, keys, more] = list(req);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(keys, (std::vector<uint64_t>{0, 1, 7, 8, 1000}));
  EXPECT_FALSE(more);
  req.set_limit(2);
  req.set_start(2);
  std::tie(s, keys, more) = list(req);
  EXPECT_EQ(keys, (std::vector<uint64_t>{7, 8}));
  EXPECT_TRUE(more);
  req.set_start(9);
  std::tie(s, keys, more) = list(req);
  EXPECT_EQ(keys, (std::vector<uint64_t>{1000}));
  EXPECT_FALSE(more);

  auto refused = [&](const std::function<void(v1::ListKeysRequest*)>& edit, absl::StatusCode code,
                     const std::string& text) {
    v1::ListKeysRequest bad;
    bad.set_job_id("j");
    bad.set_table("emb");
    edit(&bad);
    auto [st, k, m] = list(bad);
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(text), absl::string_view::npos) << st;
    EXPECT_TRUE(k.empty());
  };
  refused([](v1::ListKeysRequest* r) { r->set_job_id("nope"); }, absl::StatusCode::kNotFound,
          "job_id");
  refused([](v1::ListKeysRequest* r) { r->set_table(""); }, absl::StatusCode::kInvalidArgument,
          "table: required");
  refused([](v1::ListKeysRequest* r) { r->set_table("x"); }, absl::StatusCode::kNotFound,
          "table: unknown table 'x'");
  refused([](v1::ListKeysRequest* r) { r->set_table("adam"); }, absl::StatusCode::kInvalidArgument,
          "'adam' is a dense table");
  refused([](v1::ListKeysRequest* r) { r->set_limit(2000000); }, absl::StatusCode::kInvalidArgument,
          "limit: 2000000");

  // A data secret: no proof, a proof for another worker or a wrong one are refused.
  const std::string secret(kDataSecretBytes, 's');
  ASSERT_TRUE(h_->SetDataSecret("j", secret).ok());
  std::tie(s, keys, more) = list(req);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  PsHandler::GrpcDataProof proof;
  proof.present = true;
  proof.claim.worker = 1;
  proof.claim.proof = DataAuthProof(secret, kGrpcDataNonce, "j", 1, 0);
  std::tie(s, keys, more) = list(req, proof);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;  // req.worker is 0.
  req.set_worker(1);
  proof.claim.proof = DataAuthProof("another secret of 32 bytes......", kGrpcDataNonce, "j", 1, 0);
  std::tie(s, keys, more) = list(req, proof);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  proof.claim.proof = DataAuthProof(secret, kGrpcDataNonce, "j", 1, 0);
  std::tie(s, keys, more) = list(req, proof);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(keys, (std::vector<uint64_t>{1000}));
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

class PeriodicTest : public HandlerTest {
 protected:
  // Worker 0 of job "j" waits to read block 0 of "w" at clock 2, and pushes its step 2 of it
  // (`g`) from the read's own callback the moment it may, setting *pushed. Returns the job
  // (null, with a failure, when the read does not park).
  std::shared_ptr<Job> ParkReadThenPushStepTwo(const std::vector<float>& g,
                                               std::atomic<bool>* pushed) {
    v1::PullRequest pull;
    pull.set_job_id("j");
    pull.set_worker(0);
    pull.set_clock(2);
    *pull.add_slices() = Block("w", 0);
    auto plan = h_->PlanPull(pull);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return nullptr;
    uint64_t wait = 0;
    const bool now = plan->job->WhenReadable(2, [this, g, pushed](absl::Status) {
      *pushed = PushDense("j", 0, 2, 0, "w", 0, g, true).ok();
    }, &wait);
    EXPECT_FALSE(now) << "the read at clock 2 was served at once";
    return now ? nullptr : plan->job;
  }
};

// The snapshot of a periodic checkpoint is taken before the reads that the step released are
// served: a worker that pushes its next step the moment its read is released (here, from the
// read's own callback) does not get that step into the checkpoint. A recovery restoring it then
// replays that step once, not twice.
TEST_F(PeriodicTest, APeriodicCheckpointHoldsExactlyTheStepsUpToItsClock) {
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
  std::atomic<bool> pushed{false};
  ASSERT_NE(ParkReadThenPushStepTwo(g, &pushed), nullptr);
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

// The same with a disk tier (a memory cap and --spill_dir): the periodic checkpoint is not
// taken in memory but streamed to its file by the push that makes it due, before the reads that
// the step released are served; it holds exactly the steps up to its clock, rows on disk
// included, and the file is byte for byte the checkpoint taken in memory.
TEST_F(PeriodicTest, ADiskTiersPeriodicCheckpointIsStreamedAndHoldsExactlyItsSteps) {
  PsHandlerOptions o;
  o.checkpoint_dir = TempDir("tiered-periodic");
  o.spill_dir = TempDir("tiered-spill");
  ASSERT_EQ(mkdir(o.spill_dir.c_str(), 0755), 0);
  constexpr uint32_t kWidth = 8;
  constexpr uint64_t kRowBytes = kWidth * 2 * sizeof(float);  // Adagrad.
  o.memory_bytes = 10 * 4 + 40 * kRowBytes;  // The dense block and 40 rows.
  Make(o);
  auto r = CreateRequest(
      "j", {DenseSpec("w", {10}, kSgd),
            SparseSpec("emb", kWidth, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f))},
      v1::ConsistencySpec::BSP, 2);
  r.set_checkpoint_every_steps(2);
  Create(r);
  const std::vector<float> g(10, 1.f);
  auto push_step = [&](uint32_t w, int step) {
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 30; ++k) keys.push_back(1000 * step + 100 * w + k);  // New rows.
    ASSERT_TRUE(PushDense("j", w, step, 0, "w", 0, g, false).ok());
    ASSERT_TRUE(PushSparse("j", w, step, 1, "emb", keys, std::vector<float>(30 * kWidth, 0.5f),
                           true).ok());
  };
  push_step(0, 0);
  push_step(1, 0);
  push_step(0, 1);
  std::atomic<bool> pushed{false};
  std::shared_ptr<Job> job = ParkReadThenPushStepTwo(g, &pushed);
  ASSERT_NE(job, nullptr);
  ASSERT_TRUE(job->HasDiskTier());
  push_step(1, 1);  // Completes step 1: the checkpoint at step 2 falls due.
  ASSERT_TRUE(pushed.load());
  const std::string path = o.checkpoint_dir + "/j/server-step2.ckpt";
  auto h = ReadCheckpointHeader(path);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->step(), 2);
  ASSERT_EQ(h->tables_size(), 2);
  EXPECT_EQ(h->tables(0).blocks(0).updates(), 4) << "two workers x two steps, nothing of step 2";
  EXPECT_EQ(h->tables(1).rows(), 120u) << "every row of steps 0 and 1, on disk or not";
  EXPECT_GT(Status("j").jobs(0).tables(1).rows_on_disk(), 0u);

  // Streamed (as above, or through the Checkpoint call) and taken in memory: the same bytes.
  auto in_memory = job->MakeCheckpoint("s", 1234, 2);
  ASSERT_TRUE(in_memory.ok()) << in_memory.status();
  std::string streamed;
  CheckpointWriter writer([&](absl::string_view piece) {
    streamed.append(piece.data(), piece.size());
    return absl::OkStatus();
  });
  auto meta = job->StreamCheckpoint(
      "s", 1234, 2, [&](int64_t, uint64_t) -> absl::StatusOr<CheckpointWriter*> {
        return &writer;
      });
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(streamed == in_memory->bytes);
  EXPECT_EQ(meta->crc, in_memory->crc);
  EXPECT_EQ(meta->size, streamed.size());
  EXPECT_TRUE(meta->bytes.empty());
  // A sink that fails: the error comes back and nothing else happens.
  auto failed = job->StreamCheckpoint(
      "s", 1234, 2, [&](int64_t, uint64_t) -> absl::StatusOr<CheckpointWriter*> {
        return absl::ResourceExhaustedError("disk full");
      });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
}

// An aggregate-mode job keeps its rows in memory even where the server has a disk tier: when
// they do not fit, the push is refused naming the limit, the job's mode and the directory it
// does not use, and nothing is applied.
TEST_F(HandlerTest, AnAggregateJobsRowsStayInMemoryAndItsRefusalSaysWhy) {
  PsHandlerOptions o;
  o.spill_dir = TempDir("aggregate-spill");
  ASSERT_EQ(mkdir(o.spill_dir.c_str(), 0755), 0);
  constexpr uint32_t kWidth = 8;
  o.memory_bytes = 20 * kWidth * 2 * sizeof(float);  // 20 rows with Adagrad's accumulator.
  Make(o);
  auto r = CreateRequest(
      "agg", {SparseSpec("emb", kWidth, 0, Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f))},
      v1::ConsistencySpec::BSP, 1);
  r.mutable_consistency()->set_aggregate(true);
  Create(r);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 30; ++k) keys.push_back(k);
  absl::Status s =
      PushSparse("agg", 0, 0, 0, "emb", keys, std::vector<float>(30 * kWidth, 0.5f), true).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  for (const std::string& needle : {std::string("--memory_bytes"), std::string("aggregate"),
                                    o.spill_dir}) {
    EXPECT_NE(s.message().find(needle), std::string::npos) << needle << ": " << s;
  }
  const v1::TableStatus t = Status("agg").jobs(0).tables(0);
  EXPECT_EQ(t.rows(), 0u) << "nothing applied";
  EXPECT_EQ(t.rows_on_disk(), 0u);
  keys.resize(10);
  EXPECT_TRUE(
      PushSparse("agg", 0, 0, 0, "emb", keys, std::vector<float>(10 * kWidth, 0.5f), true).ok())
      << "rows that fit are taken";
}

// With --checkpoint_root and --export_root, every path a request names must lie in its root:
// others (outside, "..", a symlink out) are refused naming the field and the root, and nothing
// is read, written or created.
TEST_F(HandlerTest, FilesOutsideTheConfiguredRootsAreRefusedAndNothingIsWritten) {
  const std::string base = TempDir("roots");
  const std::string ckpt_root = base + "/checkpoints", export_root = base + "/exports";
  const std::string outside = base + "/outside";
  for (const std::string& d : {ckpt_root, export_root, outside}) {
    ASSERT_TRUE(MakeDirs(d).ok());
  }
  ASSERT_EQ(::symlink(outside.c_str(), (ckpt_root + "/escape").c_str()), 0);
  PsHandlerOptions o;
  o.checkpoint_dir = ckpt_root + "/default";
  o.checkpoint_root = ckpt_root;
  o.export_root = export_root;
  Make(o);

  // A job whose checkpoint directory is outside the root is not created.
  auto req = CreateRequest("j", {DenseSpec("w", {64}, kSgd)}, v1::ConsistencySpec::ASP, 1);
  req.set_checkpoint_dir(outside);
  v1::CreateTablesResponse cresp;
  absl::Status s = h_->CreateTables(req, &cresp);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("checkpoint_dir: " + outside + " is outside " + ckpt_root),
            std::string::npos)
      << s;
  v1::ServerStatus st;
  ASSERT_TRUE(h_->Status(v1::ServerStatusRequest(), &st).ok());
  EXPECT_EQ(st.jobs_size(), 0);
  req.set_checkpoint_dir("");
  Create(req);

  // Checkpoints: inside the root (the default) yes; outside, through "..", or a symlink, no.
  v1::CheckpointRequest c;
  c.set_job_id("j");
  v1::CheckpointResponse cr;
  ASSERT_TRUE(h_->Checkpoint(c, &cr).ok());
  EXPECT_EQ(cr.path().rfind(ckpt_root + "/default/j/", 0), 0u) << cr.path();
  for (const std::string& dir :
       {outside, ckpt_root + "/../outside", ckpt_root + "/escape", std::string("relative")}) {
    c.set_dir(dir);
    s = h_->Checkpoint(c, &cr);
    EXPECT_FALSE(s.ok()) << dir;
    EXPECT_NE(s.message().find("dir: "), std::string::npos) << s;
  }
  DIR* d = opendir(outside.c_str());
  ASSERT_NE(d, nullptr);
  int entries = 0;
  while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(entries, 0);  // Nothing was written outside.

  // Restores read only inside the checkpoint root.
  v1::RestoreRequest r;
  r.set_job_id("j");
  r.set_path("/etc/hostname");
  v1::RestoreResponse rr;
  s = h_->Restore(r, &rr);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  r.set_path(cr.path().empty() ? ckpt_root : cr.path());
  c.set_dir("");
  ASSERT_TRUE(h_->Checkpoint(c, &cr).ok());
  r.set_path(cr.path());
  EXPECT_TRUE(h_->Restore(r, &rr).ok());
  v1::UpdateShardMapRequest m;
  *m.mutable_map() = RoundRobinMap("j", 5, {"a:1"});
  m.set_self("s0");
  m.add_restore_from("/etc/hostname");
  v1::UpdateShardMapResponse mr;
  s = h_->UpdateShardMap(m, &mr);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("restore_from[0]"), std::string::npos) << s;

  // Exports only inside the export root (not even inside the checkpoint root).
  v1::ExportRequest e;
  e.set_job_id("j");
  e.set_path(ckpt_root + "/model.safetensors");
  v1::ExportResponse er;
  s = h_->Export(e, &er);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("path: "), std::string::npos) << s;
  e.set_path(export_root + "/m/model.safetensors");
  EXPECT_TRUE(h_->Export(e, &er).ok());
}

// A count filter's counts of keys not yet admitted are in the checkpoint: after a restore into a
// new job (as a recovery does), a key pushed twice before the checkpoint is admitted by its third
// push, not counted from zero again. A file whose sketch section does not fit is refused.
TEST_F(HandlerTest, AdmissionCountsSurviveACheckpointAndARestore) {
  v1::TableSpec emb = SparseSpec("emb", 4, 0, Optimizer(v1::OptimizerSpec::SGD, 0.5f));
  emb.mutable_embedding()->set_admit_after_pushes(3);
  emb.mutable_embedding()->set_admit_sketch_bytes(4096);
  const v1::CreateTablesRequest job = CreateRequest("adm", {emb}, v1::ConsistencySpec::ASP, 1);
  Create(job);
  const std::vector<float> g(4, 1.0f);
  ASSERT_TRUE(PushSparse("adm", 0, 0, 0, "emb", {11}, g, true).ok());
  ASSERT_TRUE(PushSparse("adm", 0, 1, 0, "emb", {11}, g, true).ok());
  const std::vector<float> initial = *Pull("adm", 0, 2, {Rows("emb", {11})});
  v1::CheckpointRequest c;
  c.set_job_id("adm");
  v1::CheckpointResponse cr;
  ASSERT_TRUE(h_->Checkpoint(c, &cr).ok());
  const std::string file = *ReadFile(cr.path());

  auto recreate = [&] {
    v1::DropJobRequest d;
    d.set_job_id("adm");
    v1::DropJobResponse dr;
    ASSERT_TRUE(h_->DropJob(d, &dr).ok());
    Create(job);
  };
  auto restore = [&](const std::string& path) {
    v1::RestoreRequest r;
    r.set_job_id("adm");
    r.set_path(path);
    v1::RestoreResponse rr;
    return h_->Restore(r, &rr);
  };
  std::vector<float> admitted = initial;
  for (float& x : admitted) x -= 0.5f;

  // Without the checkpoint's counts the third push is only the first.
  recreate();
  ASSERT_TRUE(PushSparse("adm", 0, 0, 0, "emb", {11}, g, true).ok());
  EXPECT_EQ(*Pull("adm", 0, 1, {Rows("emb", {11})}), initial) << "counted, not admitted";

  // With them it admits the key.
  recreate();
  ASSERT_TRUE(restore(cr.path()).ok()) << restore(cr.path());
  ASSERT_TRUE(PushSparse("adm", 0, 2, 0, "emb", {11}, g, true).ok());
  EXPECT_EQ(*Pull("adm", 0, 3, {Rows("emb", {11})}), admitted);

  // A sketch section of the wrong size: refused, naming the table, and nothing changes.
  auto parsed = ParseCheckpoint(file, cr.path());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  v1::CheckpointHeader h = parsed->header;
  ASSERT_EQ(h.tables(0).admit_sketch_bytes(), 4096u);
  h.mutable_tables(0)->set_admit_sketch_bytes(1024);
  std::string bad;
  AppendCheckpointHead(h, &bad);
  bad.append(parsed->data.data(), parsed->data.size());
  AppendCheckpointTrailer(&bad);
  const std::string bad_path = TempDir("bad-sketch.ckpt");
  ASSERT_TRUE(WriteFileAtomically(bad_path, bad).ok());
  recreate();
  absl::Status st = restore(bad_path);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("table 'emb' admission sketch of 1024 bytes"), std::string::npos)
      << st;
  ASSERT_TRUE(PushSparse("adm", 0, 0, 0, "emb", {11}, g, true).ok());
  EXPECT_EQ(*Pull("adm", 0, 1, {Rows("emb", {11})}), initial) << "no counts were loaded";
}

}  // namespace
}  // namespace pscluster
