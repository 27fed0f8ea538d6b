// HandlerTest: a PsHandler driven directly with a fake clock (no gRPC), with helpers to create
// tables, push and pull; shared by the handler's test files (ps_handler_test.cc,
// ps_handler_clocks_test.cc, ps_handler_checkpoint_test.cc).
#ifndef PSCLUSTER_SERVER_TESTING_HANDLER_FIXTURE_H_
#define PSCLUSTER_SERVER_TESTING_HANDLER_FIXTURE_H_

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
#include "server/ps_handler.h"
#include "server/testing/test_tables.h"

namespace pscluster {
namespace testing {

inline std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
inline std::string KeyBytes(const std::vector<uint64_t>& k) {
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

inline const v1::OptimizerSpec kSgd = Optimizer(v1::OptimizerSpec::SGD, 0.5f);
inline const v1::OptimizerSpec kAdam = Optimizer(v1::OptimizerSpec::ADAM, 0.01f);

}  // namespace testing
}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TESTING_HANDLER_FIXTURE_H_
