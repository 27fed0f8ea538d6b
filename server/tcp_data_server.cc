#include "server/tcp_data_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/data_auth.h"
#include "common/logging.h"
#include "server/data_socket_io.h"
#include "server/shm_ring.h"
#include "server/tcp_frame.h"
#include "server/tls_stream.h"

namespace pscluster {

class TcpDataServer::Conn {
 public:
  Conn(int fd, std::string peer, bool is_unix, const TcpDataServerOptions& options,
       std::shared_ptr<BufferPool> pool, ShmCounters* counters, Refusals* refusals)
      : fd_(fd),
        peer_(std::move(peer)),
        is_unix_(is_unix),
        options_(options),
        pool_(std::move(pool)),
        counters_(counters),
        refusals_(refusals),
        // TLS on the TCP port; the Unix socket never leaves the host.
        tls_(options.tls != nullptr && !is_unix
                 ? new TlsIo(fd, *options.tls, "", options.send_timeout)
                 : nullptr),
        io_(tls_ != nullptr ? tls_ : new DataIo(fd)) {}
  ~Conn() {
    io_.reset();
    close(fd_);
  }

  void Start(PsHandler* handler, Executor* executor, const DataPlaneOptions& data_plane) {
    handler_ = handler;
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
  bool has_shm() const {
    absl::MutexLock l(&mu_);
    return shm_attached_;
  }

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
    // The stream has one write in flight at a time, so reply-ring space is reserved in the
    // order the frames go out.
    auto frame = OutFrame::Message(*buf, shm_ != nullptr ? &shm_->reply() : nullptr);
    if (!frame.ok()) {
      Logger("server")->warn("data connection {}: {}", peer_, frame.status());
      stream_->OnWriteDone(false);
      return;
    }
    counters_->sent += frame->shm_bytes();
    // Most messages fit in the socket buffer: send them here, without a thread hand-off.
    auto all = frame->SendSome(*io_);
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
  // The client's attach frame (header `h` read, the memfd `passed`): maps the area and answers.
  // A refusal is answered too and the connection goes on without shared memory; only a
  // malformed frame ends it.
  absl::Status Attach(FrameReader* reader, const FrameHeader& h, int passed) {
    if (h.length != 16) {
      if (passed >= 0) close(passed);
      return absl::InvalidArgumentError(
          absl::StrCat("attach frame of ", h.length, " bytes (16 expected)"));
    }
    unsigned char body[16];
    absl::Status st = reader->Read(body, sizeof(body), false, absl::Seconds(30));
    if (!st.ok()) {
      if (passed >= 0) close(passed);
      return st;
    }
    const uint64_t request = GetU64(body), reply = GetU64(body + 8);
    absl::StatusOr<std::unique_ptr<ShmArea>> area;
    if (passed < 0) {
      area = absl::InvalidArgumentError("shared memory refused: no memory passed");
    } else if (options_.shm_max_bytes == 0) {
      close(passed);
      area = absl::FailedPreconditionError(
          "shared memory refused: off on this server (--data_shm_mib=0)");
    } else {
      area = ShmArea::Attach(passed, request, reply, options_.shm_max_bytes);
    }
    if (area.ok()) {
      shm_ = std::move(*area);
      absl::MutexLock l(&mu_);
      shm_attached_ = true;
    } else {
      Logger("server")->info("data connection {}: {}", peer_, area.status().message());
    }
    OutFrame answer = OutFrame::Raw(kFrameAttach, shm_ != nullptr ? 1 : 0, "");
    return answer.SendRest(*io_);
  }

  // A kind-3 frame's message: its bytes from the socket, its payload from the request ring, put
  // together as one message whose payload starts on a cache line.
  absl::Status ReadShmMessage(FrameReader* reader, const FrameHeader& h, grpc::ByteBuffer* out) {
    if (shm_ == nullptr) {
      return absl::InvalidArgumentError("a payload in shared memory, but none is attached");
    }
    const size_t message = h.length - kShmPositionBytes;
    const size_t payload = h.aux;
    if (message + payload > options_.max_frame_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("frame of ", message + payload,
                                                     " bytes exceeds the limit of ",
                                                     options_.max_frame_bytes));
    }
    const size_t pad = (64 - message % 64) % 64;
    BufferPool::Buffer b =
        pool_->Acquire(pad + message + std::max<size_t>(payload, kShmPositionBytes));
    absl::Status st = reader->Read(b.data + pad, h.length, false, absl::Seconds(30));
    if (st.ok()) {
      const uint64_t position =
          GetU64(reinterpret_cast<const unsigned char*>(b.data + pad + message));
      absl::StatusOr<const char*> src = shm_->request().Locate(position, payload);
      if (src.ok()) {
        std::memcpy(b.data + pad + message, *src, payload);
        shm_->request().Release(position, payload);
        counters_->received += payload;
        grpc::Slice s = pool_->ToSlice(b, message + payload, pad);
        *out = grpc::ByteBuffer(&s, 1);
        return absl::OkStatus();
      }
      st = src.status();
    }
    pool_->Release(b);
    return st;
  }

  // The authentication exchange (tcp_frame.h, kinds 5 and 6) that opens every connection:
  // binds the stream to what the client proved, or fails naming why.
  absl::Status Authenticate(PsHandler* handler) {
    absl::StatusOr<std::string> nonce = RandomBytes(kDataNonceBytes);
    if (!nonce.ok()) return nonce.status();
    absl::Status st =
        OutFrame::Raw(kFrameChallenge, options_.require_auth ? 1 : 0, *nonce).SendRest(*io_);
    if (!st.ok()) return absl::OutOfRangeError(st.message());  // The client is gone.
    // The whole auth frame must be in within the time (one deadline, not a wait per byte: a
    // peer dribbling bytes is closed as one that sends none).
    const absl::Time deadline = absl::Now() + options_.auth_timeout;
    unsigned char hb[kFrameHeaderBytes];
    st = ReadAuth(hb, sizeof(hb), /*eof_ok=*/true, deadline);
    if (!st.ok()) return st;
    absl::StatusOr<FrameHeader> h = ParseFrameHeader(hb);
    if (!h.ok()) return h.status();
    if (h->kind != kFrameAuth) {
      return absl::UnauthenticatedError(absl::StrCat(
          "the connection's first frame is of kind ", h->kind, ", not an auth frame (kind ",
          kFrameAuth, "): a data connection authenticates before anything else"));
    }
    if (h->length > kMaxAuthFrameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth frame of ", h->length, " bytes (at most ", kMaxAuthFrameBytes, ")"));
    }
    std::string body(h->length, '\0');
    st = ReadAuth(body.data(), body.size(), /*eof_ok=*/false, deadline);
    if (!st.ok()) return st;
    absl::StatusOr<AuthClaim> claim = ParseAuthBody(body, h->aux);
    if (!claim.ok()) return claim.status();
    DataAuth hello{claim->job_id, claim->worker, claim->attempt, ""};
    absl::StatusOr<bool> bound =
        handler->AuthenticateData(hello, claim->proof, *nonce, options_.require_auth, peer_);
    if (!bound.ok()) return bound.status();
    stream_->SetSocketAuth(*bound, std::move(hello));
    st = OutFrame::Raw(kFrameAuth, 1, "").SendRest(*io_);
    return st.ok() ? st : absl::OutOfRangeError(st.message());
  }

  // Reads exactly `n` bytes of the auth frame by `deadline`. DEADLINE_EXCEEDED names the time
  // (--data_auth_timeout) and how much came; OUT_OF_RANGE: the client went away (or closed
  // before the first byte with `eof_ok`).
  absl::Status ReadAuth(void* data, size_t n, bool eof_ok, absl::Time deadline) {
    char* p = static_cast<char*>(data);
    size_t got = 0;
    while (got < n) {
      const ssize_t r = io_->Recv(p + got, n - got, /*dontwait=*/true);
      if (r > 0) {
        got += static_cast<size_t>(r);
        continue;
      }
      if (r == 0) {
        return absl::OutOfRangeError(got == 0 && eof_ok ? "end of stream"
                                                        : "connection closed inside a frame");
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        const std::string why = absl::StrCat("recv: ", io_->ErrorText(errno));
        // A record TLS refuses is the client's fault, not its going away.
        return tls_ != nullptr && tls_->refused() ? absl::InvalidArgumentError(why)
                                                  : absl::OutOfRangeError(why);
      }
      if (io_->HasPending()) continue;
      const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now()) + 1;
      pollfd pfd{fd_, POLLIN, 0};
      if (left_ms <= 0 || poll(&pfd, 1, static_cast<int>(left_ms)) == 0) {
        if (absl::Now() < deadline) continue;
        return absl::DeadlineExceededError(absl::StrCat(
            got == 0 && eof_ok ? "no auth frame"
                               : absl::StrCat("an incomplete auth frame (", got, " of ", n,
                                              " bytes)"),
            " within ", absl::FormatDuration(options_.auth_timeout), " (--data_auth_timeout)"));
      }
    }
    return absl::OkStatus();
  }

  void ReadLoop() {
    if (tls_ != nullptr) {
      absl::Status hs = tls_->Handshake(absl::Now() + options_.auth_timeout);
      if (!hs.ok()) {
        ++refusals_->tls_handshake;
        // Nothing can be told to a peer that does not speak TLS with this server.
        Logger("server")->warn(
            "data connection {}: {}{}; closing it", peer_, hs.message(),
            absl::IsDeadlineExceeded(hs)
                ? absl::StrCat(" (not done within ", absl::FormatDuration(options_.auth_timeout),
                               ", --data_auth_timeout)")
                : "");
        stream_->OnCancel();
        Drain();
        return;
      }
    }
    absl::Status auth = Authenticate(handler_);
    if (auth.ok()) {
      ReadFrames();
    } else if (absl::IsOutOfRange(auth)) {
      stream_->OnCancel();  // The client went away.
    } else {
      if (absl::IsInvalidArgument(auth) || absl::IsDeadlineExceeded(auth) ||
          absl::IsUnauthenticated(auth)) {
        Logger("server")->warn("data connection {}: {}; closing it", peer_, auth.message());
      }
      ++(tls_ != nullptr && tls_->refused() ? refusals_->tls_record : refusals_->auth);
      stream_->Abort(auth);  // The client learns why from the status frame.
    }
    Drain();
  }

  void ReadFrames() {
    FrameReader reader(io_.get(), options_.spin);
    bool first = true;
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
      int passed = -1;
      // The first frame on a Unix socket may pass the shared memory along (nothing is buffered
      // yet, so it is read from the socket itself).
      absl::Status hs = is_unix_ && first
                            ? ReadHeaderWithFd(fd_, hb, &passed)
                            : reader.Read(hb, sizeof(hb), /*eof_ok=*/true, absl::Seconds(30));
      absl::StatusOr<FrameHeader> h = hs.ok() ? ParseFrameHeader(hb) : hs;
      if (h.ok() && is_unix_ && first && h->kind == kFrameAttach) {
        first = false;
        absl::Status as = Attach(&reader, *h, passed);
        if (as.ok()) {
          absl::MutexLock l(&mu_);
          read_target_ = target;  // Still wanted: the next frame fills it.
          continue;
        }
        h = as;
      } else if (passed >= 0) {
        close(passed);  // Memory passed with anything but an attach frame: not taken.
      }
      first = false;
      if (!h.ok() && absl::IsOutOfRange(h.status())) {
        // The client closed its side. It does so only when it has no round pending (retiring
        // the connection) or when it gave up (cancelled, timed out): either way nothing it
        // asked for is still wanted, and a pull parked for a slow worker must not keep the
        // connection alive.
        stream_->OnCancel();
        break;
      }
      absl::Status st = h.status();
      if (st.ok() && h->kind == kFrameShmMessage) {
        st = ReadShmMessage(&reader, *h, target);
        if (st.ok()) {
          stream_->OnReadDone(true);
          continue;
        }
      } else if (st.ok() && h->kind != kFrameMessage) {
        st = absl::InvalidArgumentError(
            h->kind == kFrameAttach
                ? "an attach frame that is not the first after authentication on a Unix socket"
                : (h->kind == kFrameStatus ? "a client sent a status frame"
                                           : "a second authentication exchange"));
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
        const bool refused_record = tls_ != nullptr && tls_->refused();
        if (absl::IsInvalidArgument(st) || refused_record) {
          Logger("server")->warn("data connection {}: {}; closing it", peer_, st);
          ++(refused_record ? refusals_->tls_record : refusals_->frame);
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
  }

  void Drain() {
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
      if (!io_->HasPending() && poll(&p, 1, 100) <= 0) {
        absl::MutexLock l(&mu_);
        if (closed_) break;
        continue;
      }
      ssize_t r = io_->Recv(sink, sizeof(sink), /*dontwait=*/true);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (r <= 0) break;
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
      absl::Status st = frame->SendRest(*io_);
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

  PsHandler* handler_ = nullptr;
  const int fd_;
  const std::string peer_;
  const bool is_unix_;
  const TcpDataServerOptions options_;
  const std::shared_ptr<BufferPool> pool_;
  ShmCounters* const counters_;
  Refusals* const refusals_;
  TlsIo* const tls_;  // TLS on this connection (owned by io_), or nullptr.
  std::unique_ptr<DataIo> io_;
  std::shared_ptr<DataStream> stream_;
  // Attached by the reader before the stream's first message, then read-only.
  std::unique_ptr<ShmArea> shm_;
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
  bool shm_attached_ ABSL_GUARDED_BY(mu_) = false;
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
      if (!stopping_.load()) {
        Logger("server")->warn("data port: refusing {}: {} connections open", peer, conns_.size());
        ++refusals_.limit;
      }
      close(c);
      continue;
    }
    TuneDataSocket(c, options_.send_timeout);
    if (is_unix) TuneUnixDataSocket(c);
    auto conn =
        std::make_shared<Conn>(c, peer, is_unix, options_, pool_, &shm_counters_, &refusals_);
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

int TcpDataServer::shm_connections() const {
  absl::MutexLock l(&mu_);
  int n = 0;
  for (const auto& c : conns_) n += c->has_shm() && !c->ended();
  return n;
}

TcpDataServer::ConnectionCounts TcpDataServer::CountConnections() const {
  absl::MutexLock l(&mu_);
  ConnectionCounts n;
  for (const auto& c : conns_) {
    if (c->ended()) continue;
    if (!c->is_unix()) {
      ++n.tcp;
    } else if (c->has_shm()) {
      ++n.shm;
    } else {
      ++n.unix_socket;
    }
  }
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
