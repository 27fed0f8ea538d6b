#include "tests/bench/ps_bench_baselines.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "common/grpc_server.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/ps.grpc.pb.h"

namespace pscluster {
namespace bench {
namespace {

// ---------------------------------------------------------------- raw TCP

void EchoConnection(int fd) {
  std::vector<char> buf(4 << 20);
  while (true) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(fd, buf.data() + off, n - off);
      if (w <= 0) {
        close(fd);
        return;
      }
      off += w;
    }
  }
  close(fd);
}

int ServeTcp(const std::string& port_file) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(s, 16) != 0) {
    perror("tcp echo");
    return 1;
  }
  socklen_t len = sizeof(addr);
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  if (!WriteFileAtomically(port_file, absl::StrCat("127.0.0.1:", ntohs(addr.sin_port), "\n")).ok()) {
    return 1;
  }
  while (true) {
    int c = accept(s, nullptr, nullptr);
    if (c < 0) continue;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::thread(EchoConnection, c).detach();
  }
}

// One thread, non-blocking: writes what the socket takes, reads what has arrived, until the
// whole payload is back.
class TcpEcho final : public EchoClient {
 public:
  explicit TcpEcho(int fd) : fd_(fd) { fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK); }
  ~TcpEcho() override { close(fd_); }

  absl::StatusOr<double> Round(size_t bytes) override {
    if (out_.size() < bytes) {
      out_.assign(bytes, 'x');
      in_.assign(bytes, 0);
    }
    absl::Time t0 = absl::Now();
    size_t sent = 0, got = 0;
    while (got < bytes) {
      pollfd p{fd_, static_cast<short>(POLLIN | (sent < bytes ? POLLOUT : 0)), 0};
      if (poll(&p, 1, 10000) <= 0) return absl::UnavailableError("tcp echo stalled");
      if (sent < bytes && (p.revents & POLLOUT)) {
        ssize_t w = write(fd_, out_.data() + sent, bytes - sent);
        if (w > 0) sent += w;
        else if (errno != EAGAIN) return absl::UnavailableError("tcp echo write failed");
      }
      if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t r = read(fd_, in_.data() + got, bytes - got);
        if (r > 0) got += r;
        else if (r == 0 || errno != EAGAIN) return absl::UnavailableError("tcp echo read failed");
      }
    }
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

 private:
  int fd_;
  std::vector<char> out_, in_;
};

// ---------------------------------------------------------------- gRPC

class EchoReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  EchoReactor() { StartRead(&in_); }
  void OnReadDone(bool ok) override {
    bool start = false;
    {
      absl::MutexLock l(&mu_);
      if (!ok) {
        reads_done_ = true;
      } else {
        queue_.push_back(std::move(in_));
        in_.Clear();
        if (!writing_) {
          writing_ = true;
          out_ = std::move(queue_.front());
          queue_.pop_front();
          start = true;
        }
      }
    }
    if (ok) StartRead(&in_);
    if (start) StartWrite(&out_);
    MaybeFinish();
  }
  void OnWriteDone(bool ok) override {
    bool start = false;
    {
      absl::MutexLock l(&mu_);
      out_.Clear();
      if (ok && !queue_.empty()) {
        out_ = std::move(queue_.front());
        queue_.pop_front();
        start = true;
      } else {
        writing_ = false;
      }
    }
    if (start) StartWrite(&out_);
    MaybeFinish();
  }
  void OnDone() override { delete this; }

 private:
  void MaybeFinish() {
    bool finish;
    {
      absl::MutexLock l(&mu_);
      finish = reads_done_ && !writing_ && queue_.empty() && !finished_;
      if (finish) finished_ = true;
    }
    if (finish) Finish(grpc::Status::OK);
  }
  absl::Mutex mu_;
  grpc::ByteBuffer in_, out_;
  std::deque<grpc::ByteBuffer> queue_;
  bool writing_ = false, reads_done_ = false, finished_ = false;
};

class EchoService final
    : public v1::ParameterServer::WithRawCallbackMethod_PushPull<v1::ParameterServer::Service> {
 public:
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* PushPull(
      grpc::CallbackServerContext*) override {
    return new EchoReactor();
  }
};

int ServeGrpc(const std::string& port_file,
              const std::vector<std::pair<std::string, int>>& grpc_args) {
  EchoService service;
  GrpcServerOptions o;
  o.int_args = grpc_args;
  o.port_file = port_file;
  o.component = "echo";
  auto server = GrpcServer::Start(o, {&service});
  if (!server.ok()) return 1;
  (*server)->Wait();
  return 0;
}

// One long-lived stream; a round writes the payload as chunks (zero-copy slices) and copies the
// echoed bytes into a receive buffer.
class GrpcEcho final : public EchoClient,
                       public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  GrpcEcho(std::shared_ptr<grpc::Channel> ch, size_t chunk) : stub_(ch), chunk_(chunk) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::hours(1));
    stub_.PrepareBidiStreamingCall(&ctx_, "/pscluster.v1.ParameterServer/PushPull",
                                   grpc::StubOptions(), this);
    AddHold();
    StartRead(&in_);
    StartCall();
  }
  ~GrpcEcho() override {
    auto done = done_;
    StartWritesDone();
    RemoveHold();
    done->WaitForNotification();
  }

  absl::StatusOr<double> Round(size_t bytes) override {
    if (out_.size() < bytes) {
      out_.assign(bytes, 'x');
      recv_.assign(bytes, 0);
    }
    absl::Time t0 = absl::Now();
    {
      absl::MutexLock l(&mu_);
      received_ = 0;
      expect_ = bytes;
      for (size_t off = 0; off < bytes; off += chunk_) {
        grpc::Slice s(out_.data() + off, std::min(chunk_, bytes - off), grpc::Slice::STATIC_SLICE);
        pending_.push_back(grpc::ByteBuffer(&s, 1));
      }
    }
    Pump();
    absl::MutexLock l(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return received_ >= expect_ || broken_; };
    mu_.Await(absl::Condition(&done));
    if (broken_) return absl::UnavailableError("grpc echo stream broke");
    return absl::ToDoubleSeconds(absl::Now() - t0);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock l(&mu_);
      broken_ = true;
      return;
    }
    std::vector<grpc::Slice> slices;
    (void)in_.Dump(&slices);
    absl::MutexLock l(&mu_);
    for (const auto& s : slices) {
      std::memcpy(recv_.data() + received_, s.begin(), s.size());
      received_ += s.size();
    }
    in_.Clear();
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock l(&mu_);
      writing_ = false;
      if (!ok) broken_ = true;
    }
    Pump();
  }
  void OnDone(const grpc::Status&) override {
    auto done = done_;  // This object may be destroyed as soon as it is notified.
    done->Notify();
  }

 private:
  void Pump() {
    {
      absl::MutexLock l(&mu_);
      if (writing_ || pending_.empty()) return;
      writing_ = true;
      cur_ = std::move(pending_.front());
      pending_.pop_front();
    }
    StartWrite(&cur_);
  }

  grpc::GenericStub stub_;
  grpc::ClientContext ctx_;
  const size_t chunk_;
  std::vector<char> out_, recv_;
  absl::Mutex mu_;
  grpc::ByteBuffer in_, cur_;
  std::deque<grpc::ByteBuffer> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  size_t received_ ABSL_GUARDED_BY(mu_) = 0;
  size_t expect_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<absl::Notification> done_ = std::make_shared<absl::Notification>();
};

}  // namespace

int ServeEcho(const std::string& kind, const std::string& port_file,
              const std::vector<std::pair<std::string, int>>& grpc_args) {
  if (kind == "tcp") return ServeTcp(port_file);
  if (kind == "grpc") return ServeGrpc(port_file, grpc_args);
  fprintf(stderr, "--serve: unknown echo kind '%s' (tcp or grpc)\n", kind.c_str());
  return 2;
}

absl::StatusOr<std::unique_ptr<EchoClient>> ConnectTcpEcho(const std::string& address) {
  size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad address ", address));
  }
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  // The echo's host as given (an IPv4 address), loopback for anything else ("localhost").
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr) != 1) {
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to tcp echo ", address));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::unique_ptr<EchoClient>(new TcpEcho(fd));
}

absl::StatusOr<std::unique_ptr<EchoClient>> ConnectGrpcEcho(
    const std::string& address, size_t chunk_bytes,
    const std::vector<std::pair<std::string, int>>& grpc_args) {
  ChannelOptions co;
  co.int_args = grpc_args;
  auto ch = MakeChannel(address, co);
  if (!ch.ok()) return ch.status();
  return std::unique_ptr<EchoClient>(new GrpcEcho(*ch, chunk_bytes));
}

}  // namespace bench
}  // namespace pscluster
