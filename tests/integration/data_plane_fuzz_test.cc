// Structure-aware fuzzing of ps_server's TCP data port. Thousands of connections each send one
// to three PushChunk frames built from a valid chunk with some fields replaced by edge or random
// values (unknown jobs, tables and workers, blocks and offsets past the end or near 2^64, wrong
// dtypes and byte lengths, ragged keys and indices, clocks at the int64 limits), frames whose
// headers lie about their bodies, and valid frames with bytes flipped. For every connection the
// server must answer with well-formed replies and a status, or close, within 10 s; it must never
// crash or hang; another job's table must not change; and afterwards it serves as before.
//
// The same chunks go over the gRPC PushPull and Push streams, and mutated PullRequests over
// Pull. Deterministic: fixed seeds, so a failure replays. PSCLUSTER_FUZZ_ITERATIONS overrides
// the number of connections (calls) per seed, for longer runs by hand.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "proto/ps.grpc.pb.h"
#include "server/tcp_frame.h"
#include "server/testing/cluster.h"
#include "server/wire.h"
#include "tests/integration/raw_frames.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

constexpr uint64_t kDenseElems = 1000;
constexpr uint64_t kBlockElems = 256;  // Blocks 0..3; the last holds 232 elements.
constexpr uint32_t kRowWidth = 8;
constexpr uint64_t kKeySpace = 1000;

const v1::OptimizerSpec kAdam = Optimizer(v1::OptimizerSpec::ADAM, 0.01f);
const v1::OptimizerSpec kAdagrad = Optimizer(v1::OptimizerSpec::ADAGRAD, 0.1f);

std::vector<v1::TableSpec> FuzzTables() {
  return {DenseSpec("w", {kDenseElems}, kAdam, kBlockElems),
          SparseSpec("e", kRowWidth, kKeySpace, kAdagrad)};
}

std::string Bytes(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(b.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

template <typename T>
std::string Packed(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// What one connection ended with.
struct Outcome {
  bool status_frame = false;
  absl::StatusCode code = absl::StatusCode::kOk;
  int replies = 0;
  bool hung = false;       // Neither an answer nor a close within 10 s.
  bool bad_reply = false;  // A message frame that is not a PullChunk.
};

// Reads the server's frames until its status frame, the end of the connection or 10 s of
// silence.
Outcome Drain(int fd) {
  Outcome o;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) {
      o.hung = true;
      return o;
    }
    auto h = ReadFrameHeader(fd);
    if (!h.ok()) return o;  // Closed (or a reset after our garbage).
    std::string body(h->length, '\0');
    if (!ReadFull(fd, body.data(), body.size(), false, absl::Seconds(10)).ok()) return o;
    if (h->kind == kFrameStatus) {
      o.status_frame = true;
      o.code = static_cast<absl::StatusCode>(h->aux);
      return o;
    }
    v1::PullChunk chunk;
    if (!chunk.ParseFromString(body)) o.bad_reply = true;
    ++o.replies;
  }
}

class ChunkFuzzer {
 public:
  explicit ChunkFuzzer(uint64_t seed) : rng_(seed) {}

  // The bytes of one frame (header included).
  std::string Frame() {
    v1::PushChunk c;
    std::string values;
    Chunk(&c, &values);
    const int how = Pick(10);
    if (how < 6) return ClientFrame(c, values);
    if (how < 8) {  // Values inside the protobuf, with an honest or a lying header.
      std::string body = Inline(&c, values);
      uint32_t aux = 0;
      switch (Pick(4)) {
        case 0: aux = static_cast<uint32_t>(body.size()); break;
        case 1: aux = static_cast<uint32_t>(body.size()) + 1 + Pick(100); break;
        case 2: aux = body.empty() ? 0 : static_cast<uint32_t>(rng_() % body.size()); break;
        default: break;
      }
      uint32_t length = static_cast<uint32_t>(body.size());
      if (Pick(5) == 0 && !body.empty()) {
        length = static_cast<uint32_t>(rng_() % (body.size() * 2));  // Shorter or longer.
      }
      return Header(kTcpFrameMagic, kFrameMessage, length, aux) + body;
    }
    std::string frame = ClientFrame(c, values);
    Flip(&frame, kFrameHeaderBytes);
    return frame;
  }

  // One message of a gRPC Push or PushPull stream: as the client encodes it (the values in
  // their own slices), with the values inside the protobuf, or with bytes flipped.
  grpc::ByteBuffer Message() {
    v1::PushChunk c;
    std::string values;
    Chunk(&c, &values);
    const int how = Pick(10);
    if (how < 6) return EncodeWithPayload(c, kPushChunkValuesField, {grpc::Slice(values)});
    std::string body = how < 8 ? Inline(&c, values)
                               : Bytes(EncodeWithPayload(c, kPushChunkValuesField,
                                                         {grpc::Slice(values)}));
    if (how >= 8) Flip(&body, 0);
    grpc::Slice slice(body);
    return grpc::ByteBuffer(&slice, 1);
  }

  // A PullRequest for the fuzzed jobs, mutated like the chunks.
  v1::PullRequest PullRequest() {
    v1::PushChunk c;
    std::string values;
    Chunk(&c, &values);
    v1::PullRequest r;
    r.set_request_id(c.request_id());
    r.set_job_id(c.tag().job_id());
    r.set_epoch(c.epoch());
    r.set_worker(c.tag().worker());
    r.set_clock(c.tag().step());
    r.set_dtype(c.dtype());
    for (int i = 0, n = Pick(4); i < n; ++i) *r.add_slices() = c.slice();
    if (Pick(4) == 0) *r.add_slices() = v1::Slice();
    return r;
  }

  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }

 private:
  // As the client frames it: the values raw at the end, `aux` saying how many bytes they are.
  static std::string ClientFrame(const v1::PushChunk& c, const std::string& values) {
    std::string body = Bytes(EncodeWithPayload(c, kPushChunkValuesField, {grpc::Slice(values)}));
    return Header(kTcpFrameMagic, kFrameMessage, static_cast<uint32_t>(body.size()),
                  static_cast<uint32_t>(values.size())) +
           body;
  }

  // A valid chunk with up to four fields mutated.
  void Chunk(v1::PushChunk* c, std::string* values) {
    Valid(c, values);
    const int mutations = Pick(5);
    for (int i = 0; i < mutations; ++i) Mutate(c, values);
  }

  // The chunk with its values as an ordinary protobuf field.
  static std::string Inline(v1::PushChunk* c, const std::string& values) {
    c->set_values(values);
    return c->SerializeAsString();
  }

  // Flips one to eight bits of `bytes` at or after `from`.
  void Flip(std::string* bytes, size_t from) {
    if (bytes->size() <= from) return;
    for (int i = 0, n = 1 + Pick(8); i < n; ++i) {
      size_t at = from + rng_() % (bytes->size() - from);
      (*bytes)[at] = static_cast<char>((*bytes)[at] ^ (1u << Pick(8)));
    }
  }

  // A chunk the server would accept: job "fz" (or "fzb", BSP), worker 0 or 1, a block of "w" or
  // some rows of "e", float32 gradients of the right length.
  void Valid(v1::PushChunk* c, std::string* values) {
    c->set_request_id(rng_() % 1000);
    c->mutable_tag()->set_job_id(Pick(4) == 0 ? "fzb" : "fz");
    c->mutable_tag()->set_worker(static_cast<uint32_t>(Pick(2)));
    const int64_t step = Pick(6);
    c->mutable_tag()->set_step(step);
    c->mutable_tag()->set_seq(static_cast<uint64_t>(Pick(4)));
    c->set_epoch(1);
    c->set_dtype(v1::DT_FLOAT32);
    c->set_last(Pick(2) == 0);
    c->set_end_of_step(Pick(2) == 0);
    c->set_pull_after(Pick(2) == 0);
    c->set_pull_clock(step + 1);
    c->set_step_final(Pick(2) == 0);
    std::normal_distribution<float> g(0.f, 0.01f);
    if (Pick(3) != 0) {
      const uint64_t block = static_cast<uint64_t>(Pick(4));
      c->mutable_slice()->set_table("w");
      c->mutable_slice()->set_block(block);
      const uint64_t n = std::min(kBlockElems, kDenseElems - block * kBlockElems);
      std::vector<float> v(n);
      for (float& x : v) x = g(rng_);
      *values = Packed(v);
    } else {
      c->mutable_slice()->set_table("e");
      std::vector<uint64_t> keys(1 + Pick(20));
      for (uint64_t& k : keys) k = rng_() % kKeySpace;
      c->mutable_slice()->set_keys(Packed(keys));
      std::vector<float> v(keys.size() * kRowWidth);
      for (float& x : v) x = g(rng_);
      *values = Packed(v);
    }
  }

  void Mutate(v1::PushChunk* c, std::string* values) {
    constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
    constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
    constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
    switch (Pick(16)) {
      case 0: {
        const char* jobs[] = {"", "nope", "fzb", "fz", "\xff\xfe"};
        c->mutable_tag()->set_job_id(Pick(6) == 5 ? std::string(300, 'j') : jobs[Pick(5)]);
        break;
      }
      case 1: {
        const uint32_t workers[] = {2, 7, std::numeric_limits<uint32_t>::max()};
        c->mutable_tag()->set_worker(workers[Pick(3)]);
        break;
      }
      case 2: {
        const int64_t steps[] = {-1, kI64Min, kI64Max, 1000000000000, kI64Max - 1};
        c->mutable_tag()->set_step(steps[Pick(5)]);
        break;
      }
      case 3: {
        const uint64_t epochs[] = {0, 2, kU64Max};
        c->set_epoch(epochs[Pick(3)]);
        break;
      }
      case 4: {
        const char* tables[] = {"", "e", "w", "missing", "\xc3\x28"};
        c->mutable_slice()->set_table(tables[Pick(5)]);
        break;
      }
      case 5: {
        const uint64_t blocks[] = {4, 5, kU64Max, 1ull << 40, 1ull << 62, kU64Max / kBlockElems};
        c->mutable_slice()->set_block(blocks[Pick(6)]);
        break;
      }
      case 6: {
        const uint64_t offsets[] = {1, 255, 256, kDenseElems, kU64Max, kU64Max - 3, 1ull << 62};
        c->set_offset(offsets[Pick(7)]);
        break;
      }
      case 7: {
        const int dtypes[] = {0, 2, 3, 4, 5, 6, 7, 8, 42, -5};
        c->set_dtype(static_cast<v1::DataType>(dtypes[Pick(10)]));
        if (c->dtype() == v1::DT_INT8 && Pick(2) == 0) {  // int8 with scales of random length.
          c->set_scale_group(static_cast<uint32_t>(Pick(300)));
          c->set_scales(std::string(4 * Pick(5), '\x7f'));
        }
        break;
      }
      case 8: {  // Wrong byte lengths.
        const size_t n = values->size();
        const size_t lengths[] = {0, 1, 3, n > 4 ? n - 4 : 0, n + 4, 2 * n, n / 2, n + 2};
        values->resize(lengths[Pick(8)], '\x01');
        break;
      }
      case 9: {  // Non-finite and huge gradients.
        std::vector<float> v(values->size() / 4);
        if (v.empty()) break;  // memcpy of nothing from an empty vector's null data is undefined.
        std::memcpy(v.data(), values->data(), v.size() * 4);
        const float odd[] = {std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::infinity(), -3e38f, 1e-45f};
        for (int i = 0; i < 1 + Pick(4); ++i) v[rng_() % v.size()] = odd[Pick(4)];
        std::memcpy(values->data(), v.data(), v.size() * 4);
        break;
      }
      case 10: {  // Top-k indices: ragged, out of range, or matching the values.
        const size_t count = Pick(2) == 0 ? values->size() / 4 : static_cast<size_t>(Pick(300));
        std::vector<uint32_t> idx(count);
        for (uint32_t& i : idx) i = Pick(3) == 0 ? static_cast<uint32_t>(rng_()) : Pick(300);
        std::string packed = Packed(idx);
        if (Pick(4) == 0 && !packed.empty()) packed.pop_back();
        c->set_indices(packed);
        break;
      }
      case 11: {  // Keys: ragged, outside the key space, on a dense table.
        std::vector<uint64_t> keys(static_cast<size_t>(Pick(40)));
        for (uint64_t& k : keys) k = Pick(2) == 0 ? rng_() : rng_() % kKeySpace;
        std::string packed = Packed(keys);
        if (Pick(3) == 0 && !packed.empty()) packed.resize(packed.size() - 1 - Pick(7));
        c->mutable_slice()->set_keys(packed);
        break;
      }
      case 12: {
        const int64_t clocks[] = {-1, kI64Min, kI64Max, 1000000000000, 0};
        c->set_pull_after(true);
        c->set_pull_clock(clocks[Pick(5)]);
        break;
      }
      case 13: {
        const uint64_t ids[] = {0, kU64Max};
        c->set_request_id(ids[Pick(2)]);
        c->mutable_tag()->set_seq(Pick(2) == 0 ? kU64Max : rng_());
        break;
      }
      case 14:
        c->set_last(!c->last());
        c->set_end_of_step(!c->end_of_step());
        c->set_step_final(!c->step_final());
        break;
      default: {  // Gradient bytes that are not a whole number of floats, or a lot of them.
        values->assign(Pick(2) == 0 ? 4 * kDenseElems * 4 + 2 : 4 * 1024 * 1024, '\x3c');
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

int Iterations(int fallback) {
  const char* env = std::getenv("PSCLUSTER_FUZZ_ITERATIONS");
  return env != nullptr ? std::max(1, std::atoi(env)) : fallback;
}

std::string Summary(const std::map<std::string, int>& outcomes) {
  std::string out;
  for (const auto& [what, n] : outcomes) absl::StrAppend(&out, " ", what, ": ", n);
  return out;
}

// One server holding three jobs: "job", which the fuzzer never addresses (its table must not
// change), and "fz" (ASP) and "fzb" (BSP, so reads park), two workers each, with a dense table
// "w" and a sparse table "e".
class DataPlaneFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.status().ok()) << cluster_.status();
    PsClientOptions o;
    o.data_transport = DataTransport::kTcp;
    auto victim = cluster_.Client("job", {DenseSpec("w", {kDenseElems}, kAdam, kBlockElems)}, 0, o);
    ASSERT_TRUE(victim.ok()) << victim.status();
    victim_ = std::move(*victim);
    v1::ConsistencySpec asp;
    asp.set_mode(v1::ConsistencySpec::ASP);
    ASSERT_TRUE(victim_->CreateTables(asp, 1).ok());
    before_.resize(kDenseElems);
    ASSERT_TRUE(victim_->Pull(0, {{{"w", before_.data()}}, {}}).ok());
    auto fz = cluster_.Client("fz", FuzzTables(), 0, o);
    ASSERT_TRUE(fz.ok()) << fz.status();
    fz_ = std::move(*fz);
    ASSERT_TRUE(fz_->CreateTables(asp, 2).ok());
    auto fzb = cluster_.Client("fzb", FuzzTables(), 0, o);
    ASSERT_TRUE(fzb.ok()) << fzb.status();
    fzb_ = std::move(*fzb);
    v1::ConsistencySpec bsp;
    bsp.set_mode(v1::ConsistencySpec::BSP);
    ASSERT_TRUE(fzb_->CreateTables(bsp, 2).ok());
  }

  // The other job's table is untouched, and everything still serves.
  void ExpectUnharmed() {
    std::vector<float> after(kDenseElems);
    ASSERT_TRUE(victim_->Pull(0, {{{"w", after.data()}}, {}}).ok());
    EXPECT_EQ(before_, after);
    std::vector<float> g(kDenseElems, 1.f);
    ASSERT_TRUE(victim_->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", after.data()}}, {}}).ok());
    EXPECT_NE(before_, after);
    std::vector<float> w(kDenseElems);
    EXPECT_TRUE(fz_->Pull(0, {{{"w", w.data()}}, {}}).ok());
  }

  InProcessCluster cluster_{1};
  std::unique_ptr<PsClient> victim_, fz_, fzb_;
  std::vector<float> before_;
};

TEST_F(DataPlaneFuzzTest, HostileFramesOnTheTcpPortNeverCrashTheServerOrTouchOtherJobs) {
  const int port = cluster_.server(0)->data_port();
  ASSERT_GT(port, 0);
  std::map<std::string, int> outcomes;
  int replies = 0;
  const int iterations = Iterations(1500);
  for (uint64_t seed : {1u, 2u}) {
    ChunkFuzzer fuzzer(seed);
    for (int i = 0; i < iterations; ++i) {
      SCOPED_TRACE(absl::StrCat("seed ", seed, ", connection ", i));
      int fd = Connect(port);
      ASSERT_GE(fd, 0);
      const int frames = 1 + fuzzer.Pick(3);
      std::string bytes;
      for (int f = 0; f < frames; ++f) bytes += fuzzer.Frame();
      // The server may close early (a bad frame ends the connection); what it did not take is
      // not an error here.
      (void)send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      shutdown(fd, SHUT_WR);  // Done sending: the server must finish the connection.
      Outcome out = Drain(fd);
      close(fd);
      ASSERT_FALSE(out.hung) << "the server neither answered nor closed within 10 s";
      ASSERT_FALSE(out.bad_reply) << "a reply that is not a PullChunk";
      replies += out.replies;
      ++outcomes[out.status_frame ? absl::StatusCodeToString(out.code) : "closed"];
    }
  }
  std::cout << "TCP connections by how they ended:" << Summary(outcomes)
            << "; PullChunk replies: " << replies << "\n";
  // The fuzzer reached the validation paths, not only the framing.
  EXPECT_GT(outcomes["INVALID_ARGUMENT"], 0);
  EXPECT_GT(outcomes["NOT_FOUND"], 0);
  EXPECT_GT(replies, 0);
  // Malformed frames are counted (pscluster_server_data_connections_refused_total).
  EXPECT_GT(cluster_.server(0)->data_refusals()->frame.load(), 0u);
  ExpectUnharmed();
}

// The same chunks over the gRPC PushPull and Push streams (messages of one or several slices),
// and mutated PullRequests over Pull. A call parked for the BSP job's absent worker ends at its
// 2 s deadline.
TEST_F(DataPlaneFuzzTest, HostileMessagesOverGrpcNeverCrashTheServerOrTouchOtherJobs) {
  auto channel = MakeChannel(cluster_.addresses()[0]);
  ASSERT_TRUE(channel.ok()) << channel.status();
  const grpc::internal::RpcMethod push_pull("/pscluster.v1.ParameterServer/PushPull",
                                            grpc::internal::RpcMethod::BIDI_STREAMING, *channel);
  const grpc::internal::RpcMethod push("/pscluster.v1.ParameterServer/Push",
                                       grpc::internal::RpcMethod::CLIENT_STREAMING, *channel);
  auto stub = v1::ParameterServer::NewStub(*channel);
  std::map<std::string, int> outcomes;
  int replies = 0;
  const int iterations = Iterations(400);
  for (uint64_t seed : {3u, 4u}) {
    ChunkFuzzer fuzzer(seed);
    for (int i = 0; i < iterations; ++i) {
      SCOPED_TRACE(absl::StrCat("seed ", seed, ", call ", i));
      auto ctx = CallContext(absl::Seconds(2));
      grpc::Status st;
      const int kind = fuzzer.Pick(3);
      if (kind == 0) {
        std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> rw(
            grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
                channel->get(), push_pull, ctx.get()));
        for (int m = 0, n = 1 + fuzzer.Pick(3); m < n; ++m) {
          if (!rw->Write(fuzzer.Message())) break;
        }
        rw->WritesDone();
        grpc::ByteBuffer reply;
        while (rw->Read(&reply)) {
          v1::PullChunk chunk;
          EXPECT_TRUE(chunk.ParseFromString(Bytes(reply))) << "a reply that is not a PullChunk";
          ++replies;
        }
        st = rw->Finish();
      } else if (kind == 1) {
        grpc::ByteBuffer response;
        std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> w(
            grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel->get(), push,
                                                                        ctx.get(), &response));
        for (int m = 0, n = 1 + fuzzer.Pick(3); m < n; ++m) {
          if (!w->Write(fuzzer.Message())) break;
        }
        w->WritesDone();
        st = w->Finish();
      } else {
        std::unique_ptr<grpc::ClientReader<v1::PullChunk>> r(
            stub->Pull(ctx.get(), fuzzer.PullRequest()));
        v1::PullChunk chunk;
        while (r->Read(&chunk)) ++replies;
        st = r->Finish();
      }
      ++outcomes[absl::StrCat(kind == 0 ? "PushPull " : kind == 1 ? "Push " : "Pull ",
                              absl::StatusCodeToString(
                                  static_cast<absl::StatusCode>(st.error_code())))];
      // The server's own UNAVAILABLE is "the map has not reached this server yet"; any other
      // would mean the connection went down.
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
        ASSERT_NE(st.error_message().find("epoch"), std::string::npos) << st.error_message();
      }
    }
  }
  std::cout << "gRPC calls by how they ended:" << Summary(outcomes)
            << "; PullChunk replies: " << replies << "\n";
  EXPECT_GT(outcomes["PushPull INVALID_ARGUMENT"], 0);
  EXPECT_GT(outcomes["Push INVALID_ARGUMENT"], 0);
  EXPECT_GT(outcomes["Pull NOT_FOUND"] + outcomes["Pull INVALID_ARGUMENT"], 0);
  EXPECT_GT(replies, 0);
  ExpectUnharmed();
}

}  // namespace
}  // namespace pscluster
