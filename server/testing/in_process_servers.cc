#include "server/testing/in_process_servers.h"

#include <deque>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_convert.h"
#include "grpcpp/server_builder.h"
#include "server/buffer_pool.h"
#include "server/data_stream.h"
#include "server/wire.h"

namespace pscluster {
namespace testing {
namespace {

constexpr char kAddressPrefix[] = "in-process:";

// A data connection whose server side is a DataStream in this process: the client's messages
// are handed to the stream as its reads, its replies come back as its writes and are dispatched
// to their rounds as PsStream and TcpConn dispatch theirs. One thread feeds the reads (as a
// socket's reader thread does); writes complete where they are made.
class InProcessDataConn final : public DataConn {
 public:
  InProcessDataConn(PsHandler* handler, Executor* executor, std::string peer,
                    std::shared_ptr<InProcessServers::Faults> faults)
      : peer_(std::move(peer)), faults_(std::move(faults)), opened_(absl::Now()) {
    stream_ = DataStream::Create(
        DataStream::Mode::kPushPull, handler, executor, BufferPool::Create(16 << 20),
        DataPlaneOptions{},
        {[this](grpc::ByteBuffer* b) { StartRead(b); },
         [this](const grpc::ByteBuffer* b) { StartWrite(b); },
         [this](grpc::Status s) { Finish(std::move(s)); }});
    reader_ = std::thread([this] { ReadLoop(); });
    stream_->StartReading(nullptr);
  }

  ~InProcessDataConn() override { Shutdown(absl::Seconds(30)); }

  absl::Status Send(const std::shared_ptr<Round>& round,
                    std::vector<grpc::ByteBuffer> messages) override {
    bool lose = false, stall = false;
    {
      absl::MutexLock f(&faults_->mu);
      stall = faults_->stalled;
      if (!stall) {
        ++faults_->rounds;
        if (faults_->lose_replies > 0) {
          --faults_->lose_replies;
          lose = true;
        }
      }
    }
    absl::MutexLock l(&mu_);
    if (closing_ || finished_) {
      return absl::UnavailableError(absl::StrCat("connection to ", peer_, " is closed"));
    }
    rounds_[round->request_id()] = round;
    if (stall) return absl::OkStatus();  // Never delivered, never answered.
    if (lose) lost_.insert(round->request_id());
    for (auto& m : messages) queue_.push_back(std::move(m));
    return absl::OkStatus();
  }

  void Forget(uint64_t request_id) override {
    bool idle;
    {
      absl::MutexLock l(&mu_);
      rounds_.erase(request_id);
      idle = rounds_.empty() && retiring_;
    }
    if (idle) Close();
  }
  void Cancel() override {
    FailAll(absl::CancelledError(absl::StrCat("connection to ", peer_, " cancelled")));
    Close();
  }
  void Retire() override {
    bool idle;
    {
      absl::MutexLock l(&mu_);
      retiring_ = true;
      closing_ = true;
      idle = rounds_.empty();
    }
    if (idle) Close();
  }
  void Shutdown(absl::Duration timeout) override {
    Cancel();
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout);
    }
    if (reader_.joinable()) reader_.join();
  }
  bool done() const override {
    absl::MutexLock l(&mu_);
    return finished_;
  }
  bool usable() const override {
    absl::MutexLock l(&mu_);
    return !closing_ && !finished_;
  }
  absl::Time opened() const override { return opened_; }
  const char* transport() const override { return "in-process"; }

 private:
  // The client side ends the connection: the stream is told its peer went away.
  void Close() {
    absl::MutexLock l(&mu_);
    closing_ = true;
    closed_ = true;
  }

  void FailAll(const absl::Status& st) {
    absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds;
    {
      absl::MutexLock l(&mu_);
      closing_ = true;
      rounds.swap(rounds_);
    }
    for (auto& [id, r] : rounds) r->Fail(st);
  }

  void StartRead(grpc::ByteBuffer* buf) {
    absl::MutexLock l(&mu_);
    read_target_ = buf;
  }

  void ReadLoop() {
    while (true) {
      grpc::ByteBuffer* target = nullptr;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return (read_target_ != nullptr && !queue_.empty()) || finished_ || closed_;
        };
        mu_.Await(absl::Condition(&ready));
        if (finished_) return;
        if (closed_) {
          // Nothing more will come: as when a client closes its socket.
          mu_.Unlock();
          stream_->OnCancel();
          mu_.Lock();
          mu_.Await(absl::Condition(&finished_));
          return;
        }
        target = read_target_;
        read_target_ = nullptr;
        *target = std::move(queue_.front());
        queue_.pop_front();
      }
      stream_->OnReadDone(true);
    }
  }

  void StartWrite(const grpc::ByteBuffer* buf) {
    v1::PullChunk chunk;
    Payload values;
    absl::Status st = DecodeWithPayload(*buf, kPullChunkValuesField, &chunk, &values, "PullChunk");
    std::shared_ptr<Round> round;
    bool lost = false, idle = false;
    if (st.ok()) {
      absl::MutexLock l(&mu_);
      auto it = rounds_.find(chunk.request_id());
      lost = lost_.contains(chunk.request_id());
      if (it != rounds_.end()) {
        round = it->second;
        if (chunk.last()) {
          rounds_.erase(it);
          lost_.erase(chunk.request_id());
          idle = rounds_.empty() && retiring_;
        }
      }
    }
    if (!st.ok()) {
      FailAll(absl::InternalError(absl::StrCat("reply from ", peer_, ": ", st.message())));
      Close();
    } else if (round != nullptr) {
      // Dispatched before the write completes: completing it may start the next reply's write
      // on this thread, and a round takes its replies in order.
      if (lost) {
        if (chunk.last()) {
          round->Fail(absl::UnavailableError(absl::StrCat(
              "the reply from ", peer_, " was lost (injected) after the server applied it")));
        }
      } else if (round->Enter(chunk)) {
        round->Copy(chunk, values);
      }
    }
    stream_->OnWriteDone(true);
    if (idle) Close();
  }

  void Finish(grpc::Status status) {
    absl::Status st = FromGrpcStatus(status, absl::StrCat("PushPull to ", peer_));
    if (st.ok()) st = absl::UnavailableError(absl::StrCat("connection to ", peer_, " ended"));
    FailAll(st);
    absl::MutexLock l(&mu_);
    finished_ = true;
  }

  const std::string peer_;
  const std::shared_ptr<InProcessServers::Faults> faults_;
  const absl::Time opened_;
  std::shared_ptr<DataStream> stream_;
  std::thread reader_;
  mutable absl::Mutex mu_;
  grpc::ByteBuffer* read_target_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> lost_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;   // Takes no new rounds.
  bool retiring_ ABSL_GUARDED_BY(mu_) = false;  // Closes once its rounds are answered.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;    // The client side ended it.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // The stream finished.
};

}  // namespace

InProcessServers::InProcessServers(int n, PsHandlerOptions options) {
  for (int i = 0; i < n; ++i) {
    auto s = std::make_unique<Server>();
    s->handler = std::make_unique<PsHandler>(options, &clock_,
                                             [this](std::function<void()> f) {
                                               control_.Post(std::move(f));
                                             });
    s->handler->set_node_id(NodeId(i));
    s->handler->set_address(Address(i));
    s->service = std::make_unique<PsService>(s->handler.get(), &data_, &control_);
    grpc::ServerBuilder builder;
    builder.RegisterService(s->service.get());
    s->grpc = builder.BuildAndStart();
    servers_.push_back(std::move(s));
  }
}

InProcessServers::~InProcessServers() {
  for (auto& s : servers_) s->grpc->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
}

std::string InProcessServers::NodeId(int i) { return absl::StrCat("ps-", i); }
std::string InProcessServers::Address(int i) { return absl::StrCat(kAddressPrefix, i); }

v1::ShardMap InProcessServers::Map(const std::string& job, uint32_t num_shards, uint64_t epoch,
                                   const std::vector<int>& owners) const {
  v1::ShardMap map;
  map.set_job_id(job);
  map.set_epoch(epoch);
  map.set_num_virtual_shards(num_shards);
  for (int i : owners) {
    auto* s = map.add_servers();
    s->set_node_id(NodeId(i));
    s->set_address(Address(i));
  }
  for (uint32_t s = 0; s < num_shards; ++s) {
    auto* a = map.add_assignments();
    a->set_shard(s);
    a->set_primary(NodeId(owners[s % owners.size()]));
  }
  return map;
}

absl::StatusOr<int> InProcessServers::IndexOf(const std::string& address) const {
  int i = -1;
  if (!absl::StartsWith(address, kAddressPrefix) ||
      !absl::SimpleAtoi(address.substr(sizeof(kAddressPrefix) - 1), &i) || i < 0 ||
      i >= size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not the address of a server in this process"));
  }
  return i;
}

void InProcessServers::FailOpens(int i, int n, absl::Status why) {
  absl::MutexLock l(&servers_[i]->faults->mu);
  servers_[i]->faults->fail_opens = n;
  servers_[i]->faults->open_error = std::move(why);
}
void InProcessServers::LoseReplies(int i, int n) {
  absl::MutexLock l(&servers_[i]->faults->mu);
  servers_[i]->faults->lose_replies = n;
}
void InProcessServers::Stall(int i, bool stalled) {
  absl::MutexLock l(&servers_[i]->faults->mu);
  servers_[i]->faults->stalled = stalled;
}
void InProcessServers::UseGrpcData(int i, bool grpc) {
  absl::MutexLock l(&servers_[i]->faults->mu);
  servers_[i]->faults->grpc = grpc;
}
int InProcessServers::opens(int i) const {
  absl::MutexLock l(&servers_[i]->faults->mu);
  return servers_[i]->faults->opens;
}
int InProcessServers::rounds(int i) const {
  absl::MutexLock l(&servers_[i]->faults->mu);
  return servers_[i]->faults->rounds;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> InProcessServers::Channel(
    const std::string& address) {
  absl::StatusOr<int> i = IndexOf(address);
  if (!i.ok()) return i.status();
  return servers_[*i]->grpc->InProcessChannel(grpc::ChannelArguments());
}

absl::StatusOr<std::shared_ptr<DataConn>> InProcessServers::OpenData(const std::string& address) {
  absl::StatusOr<int> i = IndexOf(address);
  if (!i.ok()) return i.status();
  Server& s = *servers_[*i];
  {
    absl::MutexLock l(&s.faults->mu);
    if (s.faults->grpc) return std::shared_ptr<DataConn>();
    ++s.faults->opens;
    if (s.faults->fail_opens > 0) {
      --s.faults->fail_opens;
      return s.faults->open_error;
    }
  }
  return std::shared_ptr<DataConn>(
      std::make_shared<InProcessDataConn>(s.handler.get(), &data_, address, s.faults));
}

}  // namespace testing
}  // namespace pscluster
