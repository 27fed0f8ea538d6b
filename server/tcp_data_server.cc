#include "server/tcp_data_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "server/tcp_frame.h"

namespace pscluster {
namespace {

std::string PeerName(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "unknown peer";
  if (a.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t cl = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) return "unix peer";
    return absl::StrCat("unix peer pid ", cred.pid);
  }
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return absl::StrCat(host, ":", port);
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&a);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  port = ntohs(in6->sin6_port);
  return absl::StrCat("[", host, "]:", port);
}

}  // namespace

class TcpDataServer::Conn {
 public:
  Conn(int fd, std::string peer, bool is_unix, const TcpDataServerOptions& options,
       std::shared_ptr<BufferPool> pool)
      : fd_(fd),
        peer_(std::move(peer)),
        is_unix_(is_unix),
        options_(options),
        pool_(std::move(pool)) {}
  ~Conn() { close(fd_); }

  void Start(PsHandler* handler, Executor* executor, const DataPlaneOptions& data_plane) {
    stream_ = DataStream::Create(DataStream::Mode::kPushPull, handler, executor, pool_,
                                 data_plane,
                                 {[this](grpc::ByteBuffer* b) { StartRead(b); },
                                  [this](const grpc::ByteBuffer* b) { StartWrite(b); },
                                  [this](grpc::Status s) { Finish(std::move(s)); }});
    reader_ = std::thread([this] { ReadLoop(); });
    writer_ = std::thread([this] { WriteLoop(); });
    stream_->StartReading(nullptr);
  }

  // Ends the connection from this side (server shutdown).
  void Close() {
    {
      absl::MutexLock l(&mu_);
      closed_ = true;
    }
    shutdown(fd_, SHUT_RDWR);
  }

  bool is_unix() const { return is_unix_; }

  bool ended() const {
    absl::MutexLock l(&mu_);
    return reader_done_ && writer_done_;
  }

  void Join() {
    if (reader_.joinable()) reader_.join();
    if (writer_.joinable()) writer_.join();
  }

 private:
  // ------------------------------------------------ the DataStream's operations
  void StartRead(grpc::ByteBuffer* buf) {
    absl::MutexLock l(&mu_);
    read_target_ = buf;
  }

  void StartWrite(const grpc::ByteBuffer* buf) {
    auto frame = OutFrame::Message(*buf);
    if (!frame.ok()) {
      Logger("server")->warn("data connection {}: {}", peer_, frame.status());
      stream_->OnWriteDone(false);
      return;
    }
    // Most messages fit in the socket buffer: send them here, without a thread hand-off.
    auto all = frame->SendSome(fd_);
    if (!all.ok()) {
      Logger("server")->debug("data connection {}: {}", peer_, all.status());
      stream_->OnWriteDone(false);
      return;
    }
    if (*all) {
      stream_->OnWriteDone(true);
      return;
    }
    absl::MutexLock l(&mu_);
    pending_.emplace(std::move(*frame));
  }

  void Finish(grpc::Status st) {
    absl::MutexLock l(&mu_);
    finished_ = true;
    // The writer sends the status frame (the peer may not be reading; this thread must not
    // wait for it).
    pending_.emplace(OutFrame::Status(st.error_code(), st.error_message()));
    pending_is_status_ = true;
  }

  // ------------------------------------------------ threads
  void ReadLoop() {
    FrameReader reader(fd_, options_.spin);
    while (true) {
      grpc::ByteBuffer* target = nullptr;
      bool finished, closed;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return read_target_ != nullptr || finished_ || closed_;
        };
        mu_.Await(absl::Condition(&ready));
        finished = finished_;
        closed = closed_;
        target = read_target_;
        read_target_ = nullptr;
      }
      if (finished) break;
      if (closed) {
        stream_->OnCancel();
        break;
      }
      unsigned char hb[kFrameHeaderBytes];
      absl::Status hs = reader.Read(hb, sizeof(hb), /*eof_ok=*/true, absl::Seconds(30));
      absl::StatusOr<FrameHeader> h = hs.ok() ? ParseFrameHeader(hb) : hs;
      if (!h.ok() && absl::IsOutOfRange(h.status())) {
        // The client closed its side. It does so only when it has no round pending (retiring
        // the connection) or when it gave up (cancelled, timed out): either way nothing it
        // asked for is still wanted, and a pull parked for a slow worker must not keep the
        // connection alive.
        stream_->OnCancel();
        break;
      }
      absl::Status st = h.status();
      if (st.ok() && h->kind != kFrameMessage) {
        st = absl::InvalidArgumentError("a client sent a status frame");
      } else if (st.ok() && h->length > options_.max_frame_bytes) {
        st = absl::InvalidArgumentError(absl::StrCat("frame of ", h->length,
                                                     " bytes exceeds the limit of ",
                                                     options_.max_frame_bytes));
      }
      if (st.ok()) {
        // The frame lands so that its raw payload (its last `aux` bytes) starts on a cache
        // line: the optimizer then reads float32 gradients in place instead of through a copy.
        const size_t prefix = h->length - std::min(h->aux, h->length);
        const size_t pad = (64 - prefix % 64) % 64;
        BufferPool::Buffer b = pool_->Acquire(std::max<size_t>(h->length + pad, 1));
        st = reader.Read(b.data + pad, h->length, false, absl::Seconds(30));
        if (st.ok()) {
          grpc::Slice s = pool_->ToSlice(b, h->length, pad);
          *target = grpc::ByteBuffer(&s, 1);
          stream_->OnReadDone(true);
          continue;
        }
        pool_->Release(b);
      }
      bool quiet;
      {
        absl::MutexLock l(&mu_);
        quiet = closed_ || finished_;
      }
      if (!quiet) {
        if (absl::IsInvalidArgument(st)) {
          Logger("server")->warn("data connection {}: {}; closing it", peer_, st);
        } else {
          Logger("server")->debug("data connection {}: {}", peer_, st);
        }
      }
      if (absl::IsInvalidArgument(st)) {
        stream_->Abort(st);  // The client learns why from the status frame.
      } else {
        stream_->OnCancel();
      }
      break;
    }
    // The stream finishes once its work is done (or cancelled); then the client gets the status
    // frame. What it still sends meanwhile is read and dropped, so that closing the socket does
    // not reset the connection under the status frame.
    bool cancel;
    {
      absl::MutexLock l(&mu_);
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ || closed_; };
      mu_.Await(absl::Condition(&due));
      cancel = !finished_;
    }
    if (cancel) stream_->OnCancel();  // Closed by the server: end what the stream still waits on.
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(&finished_));
    }
    const absl::Time until = absl::Now() + absl::Seconds(5);
    char sink[16 << 10];
    while (absl::Now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) {
        absl::MutexLock l(&mu_);
        if (closed_) break;
        continue;
      }
      ssize_t r = recv(fd_, sink, sizeof(sink), 0);
      if (r <= 0 && !(r < 0 && errno == EINTR)) break;
    }
    absl::MutexLock l(&mu_);
    reader_done_ = true;
  }

  void WriteLoop() {
    while (true) {
      std::optional<OutFrame> frame;
      bool status_frame = false;
      {
        absl::MutexLock l(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return pending_.has_value() || (closed_ && finished_);
        };
        mu_.Await(absl::Condition(&ready));
        if (!pending_.has_value()) break;
        frame = std::move(pending_);
        pending_.reset();
        status_frame = pending_is_status_;
      }
      absl::Status st = frame->SendRest(fd_);
      if (status_frame) {
        shutdown(fd_, SHUT_WR);
        break;
      }
      if (!st.ok()) Logger("server")->debug("data connection {}: {}", peer_, st);
      frame.reset();
      stream_->OnWriteDone(st.ok());
    }
    absl::MutexLock l(&mu_);
    writer_done_ = true;
  }

  const int fd_;
  const std::string peer_;
  const bool is_unix_;
  const TcpDataServerOptions options_;
  const std::shared_ptr<BufferPool> pool_;
  std::shared_ptr<DataStream> stream_;
  std::thread reader_;
  std::thread writer_;

  mutable absl::Mutex mu_;
  grpc::ByteBuffer* read_target_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<OutFrame> pending_ ABSL_GUARDED_BY(mu_);
  bool pending_is_status_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writer_done_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<TcpDataServer>> TcpDataServer::Start(
    const TcpDataServerOptions& options, PsHandler* handler, Executor* executor,
    std::shared_ptr<BufferPool> pool, const DataPlaneOptions& data_plane) {
  std::unique_ptr<TcpDataServer> s(new TcpDataServer());
  s->options_ = options;
  s->handler_ = handler;
  s->executor_ = executor;
  s->pool_ = std::move(pool);
  s->data_plane_ = data_plane;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  std::string host = options.host;
  if (host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*") host.clear();
  addrinfo* res = nullptr;
  const std::string port = std::to_string(options.port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--data_port: cannot resolve \"", options.host,
                                                   "\": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
      s->listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  if (s->listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("--data_port: cannot listen on ", options.host, ":",
                                               options.port, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  s->port_ = ntohs(bound.ss_family == AF_INET
                       ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                       : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  if (!options.unix_name.empty()) {
    // An abstract socket (no file to clean up; gone with the process), in this network
    // namespace only.
    sockaddr_un ua{};
    ua.sun_family = AF_UNIX;
    const size_t n = std::min(options.unix_name.size(), sizeof(ua.sun_path) - 1);
    std::memcpy(ua.sun_path + 1, options.unix_name.data(), n);
    const socklen_t ulen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&ua), ulen) == 0 && listen(fd, 128) == 0) {
      s->unix_fd_ = fd;
      s->unix_name_ = options.unix_name.substr(0, n);
    } else {
      Logger("server")->warn("data plane: no Unix socket \"{}\": {}", options.unix_name,
                             std::strerror(errno));
      if (fd >= 0) close(fd);
    }
  }
  s->acceptor_ = std::thread([p = s.get()] { p->AcceptLoop(p->listen_fd_, false); });
  if (s->unix_fd_ >= 0) {
    s->unix_acceptor_ = std::thread([p = s.get()] { p->AcceptLoop(p->unix_fd_, true); });
  }
  return s;
}

void TcpDataServer::AcceptLoop(int listen_fd, bool is_unix) {
  while (!stopping_.load()) {
    int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (stopping_.load()) break;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        Logger("server")->warn("data port: accept: {}", std::strerror(errno));
        absl::SleepFor(absl::Milliseconds(50));
      }
      continue;
    }
    Reap(false);
    std::string peer = PeerName(c);
    absl::MutexLock l(&mu_);
    if (stopping_.load() || static_cast<int>(conns_.size()) >= options_.max_connections) {
      Logger("server")->warn("data port: refusing {}: {} connections open", peer, conns_.size());
      close(c);
      continue;
    }
    TuneDataSocket(c, options_.send_timeout);
    if (is_unix) TuneUnixDataSocket(c);
    auto conn = std::make_shared<Conn>(c, peer, is_unix, options_, pool_);
    conn->Start(handler_, executor_, data_plane_);
    conns_.push_back(std::move(conn));
  }
}

void TcpDataServer::Reap(bool all) {
  std::vector<std::shared_ptr<Conn>> done;
  {
    absl::MutexLock l(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->ended()) {
        done.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) {
    if (all) c->Close();
  }
  for (auto& c : done) c->Join();
}

int TcpDataServer::connections() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(conns_.size());
}

int TcpDataServer::unix_connections() const {
  absl::MutexLock l(&mu_);
  int n = 0;
  for (const auto& c : conns_) n += c->is_unix() && !c->ended();
  return n;
}

void TcpDataServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  if (unix_fd_ >= 0) {
    shutdown(unix_fd_, SHUT_RDWR);
    if (unix_acceptor_.joinable()) unix_acceptor_.join();
    close(unix_fd_);
  }
  Reap(true);
}

TcpDataServer::~TcpDataServer() { Shutdown(); }

}  // namespace pscluster
