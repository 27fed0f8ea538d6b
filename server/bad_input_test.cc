// Bad input, one test per case: each gets the matching gRPC status with a message naming the
// field at fault, and changes nothing on the server (values, clocks, counters, tables).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "common/channel.h"
#include "common/status_convert.h"
#include "common/testing/garbage_calls.h"
#include "grpcpp/generic/generic_stub.h"
#include "server/testing/cluster.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PsServerOptions o;
    o.limits.max_chunk_bytes = 1 << 20;
    o.limits.max_keys = 1000;
    cluster_ = std::make_unique<InProcessCluster>(1, o);
    ASSERT_TRUE(cluster_->status().ok());
    ChannelOptions co;
    co.max_message_bytes = 128 << 20;
    channel_ = *MakeChannel(cluster_->addresses()[0], co);
    stub_ = v1::ParameterServer::NewStub(channel_);
    v1::CreateTablesResponse cr;
    ASSERT_TRUE(CreateTables(CreateRequest("job",
                                           {DenseSpec("w", {4, 1000}, Sgd(), 1000),
                                            SparseSpec("e", 8, 100, Sgd())},
                                           v1::ConsistencySpec::ASP, 2),
                             &cr)
                    .ok());
    v1::UpdateShardMapRequest mr;
    *mr.mutable_map() = cluster_->Map("job", 3);
    mr.set_self("s0");
    v1::UpdateShardMapResponse mresp;
    auto ctx = CallContext(absl::Seconds(10));
    ASSERT_TRUE(stub_->UpdateShardMap(ctx.get(), mr, &mresp).ok());
    // Some state to protect.
    ASSERT_TRUE(Push(Dense(0, std::vector<float>(1000, 1.f))).ok());
    ASSERT_TRUE(Push(Sparse({1, 2}, std::vector<float>(16, 1.f))).ok());
    before_ = Snapshot();
  }

  void TearDown() override {
    // Nothing changed: same values, clocks, counters and tables.
    EXPECT_EQ(Snapshot(), before_) << "bad input changed the server's state";
  }

  static v1::OptimizerSpec Sgd() { return Optimizer(v1::OptimizerSpec::SGD, 0.1f); }

  absl::Status CreateTables(const v1::CreateTablesRequest& r, v1::CreateTablesResponse* resp) {
    auto ctx = CallContext(absl::Seconds(10));
    return FromGrpcStatus(stub_->CreateTables(ctx.get(), r, resp));
  }

  v1::PushChunk Dense(uint64_t block, const std::vector<float>& g) {
    v1::PushChunk c;
    c.mutable_tag()->set_job_id("job");
    c.mutable_tag()->set_step(0);
    c.mutable_tag()->set_seq(seq_++);
    c.set_epoch(3);
    c.mutable_slice()->set_table("w");
    c.mutable_slice()->set_block(block);
    c.set_values(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 4));
    c.set_last(true);
    return c;
  }

  v1::PushChunk Sparse(const std::vector<uint64_t>& keys, const std::vector<float>& g) {
    v1::PushChunk c = Dense(0, g);
    c.mutable_slice()->set_table("e");
    c.mutable_slice()->set_block(0);
    c.mutable_slice()->set_keys(std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * 8));
    return c;
  }

  absl::Status Push(const v1::PushChunk& c) {
    auto ctx = CallContext(absl::Seconds(10));
    v1::PushResponse resp;
    auto w = stub_->Push(ctx.get(), &resp);
    w->Write(c);
    w->WritesDone();
    return FromGrpcStatus(w->Finish());
  }

  absl::Status Pull(const v1::PullRequest& r, std::string* values = nullptr) {
    auto ctx = CallContext(absl::Seconds(10));
    auto reader = stub_->Pull(ctx.get(), r);
    v1::PullChunk chunk;
    while (reader->Read(&chunk)) {
      if (values) values->append(chunk.values());
    }
    return FromGrpcStatus(reader->Finish());
  }

  v1::PullRequest PullOf(const std::string& table, uint64_t block = 0) {
    v1::PullRequest r;
    r.set_job_id("job");
    r.set_epoch(3);
    auto* s = r.add_slices();
    s->set_table(table);
    s->set_block(block);
    return r;
  }

  std::string Snapshot() {
    std::string out;
    v1::PullRequest r = PullOf("w");
    for (int b = 1; b < 4; ++b) {
      auto* s = r.add_slices();
      s->set_table("w");
      s->set_block(b);
    }
    std::vector<uint64_t> keys = {1, 2, 3};
    auto* s = r.add_slices();
    s->set_table("e");
    s->set_keys(std::string(reinterpret_cast<const char*>(keys.data()), 24));
    EXPECT_TRUE(Pull(r, &out).ok());
    v1::ServerStatusRequest sr;
    v1::ServerStatus st;
    auto ctx = CallContext(absl::Seconds(10));
    EXPECT_TRUE(stub_->Status(ctx.get(), sr, &st).ok());
    const auto& job = st.jobs(0);
    for (const auto& c : job.clocks()) absl::StrAppend(&out, "|clock", c.clock());
    for (const auto& t : job.tables()) absl::StrAppend(&out, "|", t.name(), ":", t.elements());
    absl::StrAppend(&out, "|pushes", st.pushes_total(), "|epoch", job.epoch(), "|jobs",
                    st.jobs_size());
    return out;
  }

  static void ExpectError(const absl::Status& st, absl::StatusCode code, absl::string_view field) {
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(st.message().find(std::string(field)), std::string::npos)
        << "message must name '" << field << "': " << st;
  }

  std::unique_ptr<InProcessCluster> cluster_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  uint64_t seq_ = 0;
  std::string before_;
};

TEST_F(BadInputTest, UnknownTable) {
  auto c = Dense(0, std::vector<float>(1000, 1.f));
  c.mutable_slice()->set_table("nope");
  ExpectError(Push(c), absl::StatusCode::kNotFound, "slice.table");
  ExpectError(Pull(PullOf("nope")), absl::StatusCode::kNotFound, "slices[0].table");
}

TEST_F(BadInputTest, UnknownJob) {
  auto c = Dense(0, std::vector<float>(1000, 1.f));
  c.mutable_tag()->set_job_id("ghost");
  ExpectError(Push(c), absl::StatusCode::kNotFound, "tag.job_id");
  auto r = PullOf("w");
  r.set_job_id("ghost");
  ExpectError(Pull(r), absl::StatusCode::kNotFound, "job_id");
  v1::CheckpointRequest cr;
  cr.set_job_id("ghost");
  v1::CheckpointResponse resp;
  auto ctx = CallContext(absl::Seconds(10));
  ExpectError(FromGrpcStatus(stub_->Checkpoint(ctx.get(), cr, &resp)),
              absl::StatusCode::kNotFound, "job_id");
}

TEST_F(BadInputTest, WrongDtype) {
  auto c = Dense(0, std::vector<float>(500, 1.f));
  c.set_dtype(v1::DT_INT64);
  ExpectError(Push(c), absl::StatusCode::kInvalidArgument, "dtype");
  auto r = PullOf("w");
  r.set_dtype(v1::DT_FLOAT64);
  ExpectError(Pull(r), absl::StatusCode::kInvalidArgument, "dtype");
  auto t = DenseSpec("w2", {10}, Sgd());
  t.set_dtype(v1::DT_FLOAT64);
  v1::CreateTablesResponse resp;
  ExpectError(CreateTables(CreateRequest("job", {t}, v1::ConsistencySpec::ASP, 2), &resp),
              absl::StatusCode::kInvalidArgument, "tables[0].dtype");
}

TEST_F(BadInputTest, WrongShape) {
  v1::CreateTablesResponse resp;
  ExpectError(CreateTables(CreateRequest("job", {DenseSpec("w2", {10, 0}, Sgd())},
                                         v1::ConsistencySpec::ASP, 2),
                           &resp),
              absl::StatusCode::kInvalidArgument, "tables[0].shape.dims[1]");
  // The same name with another shape: refused, the existing table stays.
  ExpectError(CreateTables(CreateRequest("job", {DenseSpec("w", {4, 999}, Sgd(), 1000)},
                                         v1::ConsistencySpec::ASP, 2),
                           &resp),
              absl::StatusCode::kAlreadyExists, "tables[0]");
}

TEST_F(BadInputTest, WrongByteLength) {
  auto c = Dense(0, std::vector<float>(1000, 1.f));
  c.mutable_values()->push_back('x');  // 4001 bytes.
  ExpectError(Push(c), absl::StatusCode::kInvalidArgument, "values");
  ExpectError(Push(Dense(3, std::vector<float>(1001, 1.f))), absl::StatusCode::kInvalidArgument,
              "values");
  // Sparse: 2 keys of width 8 need 16 floats, not 12.
  ExpectError(Push(Sparse({1, 2}, std::vector<float>(12, 1.f))),
              absl::StatusCode::kInvalidArgument, "values");
}

TEST_F(BadInputTest, KeyOutsideTheTable) {
  ExpectError(Push(Sparse({5, 100}, std::vector<float>(16, 1.f))),
              absl::StatusCode::kInvalidArgument, "slice.keys");
  auto c = Sparse({1}, std::vector<float>(8, 1.f));
  c.mutable_slice()->mutable_keys()->push_back('\0');  // 9 bytes: not whole keys.
  ExpectError(Push(c), absl::StatusCode::kInvalidArgument, "slice.keys");
  ExpectError(Push(Dense(4, std::vector<float>(1000, 1.f))), absl::StatusCode::kInvalidArgument,
              "slice.block");
  ExpectError(Pull(PullOf("w", 17)), absl::StatusCode::kInvalidArgument, "slices[0].block");
}

TEST_F(BadInputTest, StaleEpoch) {
  auto c = Dense(0, std::vector<float>(1000, 1.f));
  c.set_epoch(2);
  c.set_end_of_step(true);
  absl::Status st = Push(c);
  ExpectError(st, absl::StatusCode::kFailedPrecondition, "epoch");
  EXPECT_NE(st.message().find("current epoch 3"), std::string::npos) << st;
  auto r = PullOf("w");
  r.set_epoch(1);
  ExpectError(Pull(r), absl::StatusCode::kFailedPrecondition, "epoch");
}

TEST_F(BadInputTest, StepsAndClocksOutOfRange) {
  // Negative, or so large that the consistency rules' step + 1 would overflow: refused, naming
  // the field, whether the chunk ends a step or not.
  for (int64_t bad : {int64_t{-1}, std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max(), (int64_t{1} << 62) + 1}) {
    for (bool end : {false, true}) {
      auto c = Dense(0, std::vector<float>(1000, 1.f));
      c.mutable_tag()->set_step(bad);
      c.set_end_of_step(end);
      ExpectError(Push(c), absl::StatusCode::kInvalidArgument, "tag.step");
    }
    auto c = Dense(0, std::vector<float>(1000, 1.f));
    c.set_pull_after(true);
    c.set_pull_clock(bad);
    ExpectError(Push(c), absl::StatusCode::kInvalidArgument, "pull_clock");
    auto r = PullOf("w");
    r.set_clock(bad);
    ExpectError(Pull(r), absl::StatusCode::kInvalidArgument, "clock");
  }
}

TEST_F(BadInputTest, OversizedMessage) {
  // Over the server's chunk limit (1 MiB here).
  ExpectError(Push(Dense(0, std::vector<float>(300000, 1.f))),
              absl::StatusCode::kResourceExhausted, "values");
  std::vector<uint64_t> keys(1001);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i % 100;
  ExpectError(Push(Sparse(keys, std::vector<float>(keys.size() * 8, 1.f))),
              absl::StatusCode::kResourceExhausted, "slice.keys");
  // Over gRPC's message limit: refused before it is parsed.
  auto c = Dense(0, {});
  c.set_values(std::string(70 << 20, '\0'));
  absl::Status st = Push(c);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
}

// Tables that cannot fit are refused before anything is allocated, even with --memory_bytes left
// at its default (this machine's memory): a single request must not take the server down by
// exhausting memory.
TEST_F(BadInputTest, TablesTooLargeForTheMachineAreRefused) {
  v1::CreateTablesResponse resp;
  // 2^38 elements in 4 MiB blocks: 1 TiB of weights, plus Adam's two slots.
  auto huge = DenseSpec("huge", {uint64_t{1} << 38}, Optimizer(v1::OptimizerSpec::ADAM, 0.01f),
                        uint64_t{1} << 20);
  ExpectError(CreateTables(CreateRequest("job2", {huge}, v1::ConsistencySpec::ASP, 1), &resp),
              absl::StatusCode::kResourceExhausted, "--memory_bytes");
  // More blocks than a table may have (a pointer each, from the start).
  auto tiny_blocks = DenseSpec("tiny", {uint64_t{1} << 30}, Sgd(), 1);
  ExpectError(CreateTables(CreateRequest("job2", {tiny_blocks}, v1::ConsistencySpec::ASP, 1), &resp),
              absl::StatusCode::kInvalidArgument, "tables[0].block_elems");
  auto default_blocks = DenseSpec("wide", {uint64_t{1} << 40}, Sgd());
  ExpectError(CreateTables(CreateRequest("job2", {default_blocks}, v1::ConsistencySpec::ASP, 1), &resp),
              absl::StatusCode::kInvalidArgument, "use larger blocks");
}

TEST_F(BadInputTest, NegativeLearningRate) {
  auto t = DenseSpec("w2", {10}, Optimizer(v1::OptimizerSpec::ADAM, -0.01f));
  v1::CreateTablesResponse resp;
  ExpectError(CreateTables(CreateRequest("job", {t}, v1::ConsistencySpec::ASP, 2), &resp),
              absl::StatusCode::kInvalidArgument, "tables[0].optimizer.learning_rate");
}

TEST_F(BadInputTest, NaNLearningRate) {
  auto t = SparseSpec("e2", 4, 0, Optimizer(v1::OptimizerSpec::SGD, std::nanf("")));
  v1::CreateTablesResponse resp;
  ExpectError(CreateTables(CreateRequest("job", {DenseSpec("ok", {3}, Sgd()), t},
                                         v1::ConsistencySpec::ASP, 2),
                           &resp),
              absl::StatusCode::kInvalidArgument, "tables[1].optimizer.learning_rate");
}

TEST_F(BadInputTest, BytesThatDoNotParseAreInvalidArgumentNamingTheMethod) {
  ExpectEveryMethodRefusesGarbage(channel_, "pscluster.v1.ParameterServer");
}

TEST_F(BadInputTest, MalformedBytes) {
  grpc::GenericStub generic(channel_);
  grpc::ByteBuffer junk;
  std::string bytes = "\x0a\xff\xff\xff\xff\x0f garbage";
  grpc::Slice s(bytes);
  junk = grpc::ByteBuffer(&s, 1);
  grpc::ByteBuffer out;
  auto ctx = CallContext(absl::Seconds(10));
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(ctx.get(), "/pscluster.v1.ParameterServer/Pull", grpc::StubOptions(), &junk,
                    &out, [&](grpc::Status st) {
                      status = st;
                      done.Notify();
                    });
  done.WaitForNotification();
  ExpectError(FromGrpcStatus(status), absl::StatusCode::kInvalidArgument, "PullRequest");
}

}  // namespace
}  // namespace pscluster
