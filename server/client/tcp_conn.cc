#include "server/client/tcp_conn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_convert.h"
#include "server/client/socket_setup.h"
#include "server/wire.h"

namespace pscluster {
namespace {

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}


}  // namespace

absl::StatusOr<std::shared_ptr<TcpConn>> TcpConn::Open(const std::string& host, int port,
                                                       const std::string& peer,
                                                       absl::Duration connect_timeout,
                                                       std::shared_ptr<BufferPool> pool,
                                                       absl::Duration spin,
                                                       const DataAuth& auth,
                                                       const TlsContext* tls) {
  auto fd = ConnectTcp(host, port, connect_timeout);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("data port of ", peer, ": ", fd.status().message()));
  }
  auto io = SetUpDataSocket(*fd, host, tls, connect_timeout, auth, peer);
  int wake = io.ok() ? eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) : -1;
  if (wake < 0) {
    close(*fd);
    if (!io.ok()) return io.status();
    return absl::ResourceExhaustedError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  TuneDataSocket(*fd, absl::InfiniteDuration());
  return std::shared_ptr<TcpConn>(
      new TcpConn(*fd, std::move(*io), wake, peer, std::move(pool), spin));
}

absl::StatusOr<std::shared_ptr<TcpConn>> TcpConn::OpenUnix(const std::string& name, uint32_t pid,
                                                           const std::string& peer,
                                                           std::shared_ptr<BufferPool> pool,
                                                           absl::Duration spin,
                                                           size_t shm_ring_bytes,
                                                           const DataAuth& auth) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (name.empty() || name.size() > sizeof(a.sun_path) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data socket of ", peer, ": bad Unix socket name \"", name, "\""));
  }
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  // Non-blocking: a full backlog fails at once (EAGAIN) instead of waiting.
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("socket: ", std::strerror(errno)));
  TuneUnixDataSocket(fd);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), len) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("data socket of ", peer, ": cannot connect to @",
                                               name, ": ", std::strerror(err)));
  }
  // Anyone on the host can bind an abstract name: the peer must be the server that advertised it.
  ucred cred{};
  socklen_t cl = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
      static_cast<uint32_t>(cred.pid) != pid) {
    close(fd);
    return absl::PermissionDeniedError(absl::StrCat("data socket of ", peer, ": @", name,
                                                    " is served by process ", cred.pid,
                                                    ", not by the server (process ", pid, ")"));
  }
  auto io = std::make_unique<DataIo>(fd);
  absl::Status authed = AuthenticateDataSocket(*io, auth, peer);
  if (!authed.ok()) {
    close(fd);
    return authed;
  }
  std::unique_ptr<ShmArea> shm;
  if (shm_ring_bytes > 0) {
    auto area = ShmArea::Create(shm_ring_bytes, shm_ring_bytes);
    if (!area.ok()) {
      Logger("worker")->info("data socket of {}: no shared memory: {}", peer,
                             area.status().message());
    } else {
      auto taken = OfferSharedMemory(fd, **area, peer);
      if (!taken.ok()) {
        close(fd);
        return taken.status();
      }
      if (*taken) {
        shm = std::move(*area);
      } else {
        Logger("worker")->info("data socket of {}: the server refused shared memory", peer);
      }
    }
  }
  int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::shared_ptr<TcpConn>(
      new TcpConn(fd, std::move(io), wake, peer, std::move(pool), spin, true, std::move(shm)));
}

TcpConn::~TcpConn() {
  Break(absl::CancelledError(absl::StrCat("data connection to ", peer_, " closed")));
  close(wake_fd_);
  close(fd_);
}

// ------------------------------------------------------------------ ownership of the I/O

bool TcpConn::TryOwn() {
  absl::MutexLock l(&mu_);
  if (owned_) return false;
  owned_ = true;
  return true;
}

void TcpConn::Disown() {
  absl::MutexLock l(&mu_);
  owned_ = false;
}

absl::Status TcpConn::Send(const std::shared_ptr<Round>& round,
                           std::vector<grpc::ByteBuffer> messages) {
  if (shm_ != nullptr) return SendThroughRing(round, std::move(messages));
  std::vector<OutFrame> frames;
  frames.reserve(messages.size());
  for (auto& m : messages) {
    auto f = OutFrame::Message(m);
    if (!f.ok()) return f.status();
    frames.push_back(std::move(*f));
  }
  messages.clear();  // The frames hold the payload now.
  {
    absl::MutexLock l(&mu_);
    if (closing_) {
      return absl::UnavailableError(absl::StrCat("data connection to ", peer_, " is closed"));
    }
    rounds_[round->request_id()] = round;
    for (auto& f : frames) writes_.push_back(std::move(f));
  }
  Kick();
  return absl::OkStatus();
}

absl::Status TcpConn::SendThroughRing(const std::shared_ptr<Round>& round,
                                      std::vector<grpc::ByteBuffer> messages) {
  {
    absl::MutexLock l(&mu_);
    if (closing_) {
      return absl::UnavailableError(absl::StrCat("data connection to ", peer_, " is closed"));
    }
    rounds_[round->request_id()] = round;
  }
  // Frame by frame: each payload is copied into the ring and its small frame sent before the
  // next payload is copied, so the server applies one while this thread copies the next.
  // Ring space is reserved in the order frames join writes_ (the server hands it back in that
  // order), hence under the lock.
  for (size_t i = 0; i < messages.size(); ++i) {
    absl::Status bad;
    {
      absl::MutexLock l(&mu_);
      auto f = OutFrame::Message(messages[i], &shm_->request());
      if (f.ok()) {
        writes_.push_back(std::move(*f));
      } else {
        bad = f.status();
      }
    }
    if (!bad.ok()) {
      // Part of the round may be out already: end the connection, as a broken one would.
      Break(bad);
      return bad;
    }
    messages[i].Clear();  // The frame (or the ring) holds the payload now.
    Kick();
  }
  return absl::OkStatus();
}

void TcpConn::Kick() {
  if (TryOwn()) {
    // Writes what the socket takes now and returns: a call to several servers fills every
    // server's socket before it waits on the first, so they all work at once.
    Drive(
        [this] {
          absl::MutexLock l(&mu_);
          return !out_.has_value() && writes_.empty();
        },
        absl::InfiniteFuture(), /*until_full=*/true, /*poll_first=*/true);
    Disown();
  } else {
    // The owner may be waiting for replies only: have it send these too.
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
}

absl::Status TcpConn::Wait(const std::shared_ptr<Round>& round, absl::Time deadline) {
  while (true) {
    absl::Status st;
    if (round->Finished(&st)) return st;
    if (absl::Now() >= deadline) break;
    if (TryOwn()) {
      // Frames other threads queued meanwhile go out before this thread lets go.
      Drive([this, &round] { return Settled(*round); }, deadline, /*until_full=*/false,
            /*poll_first=*/rpos_ == rend_);
      Disown();
      continue;
    }
    // Another thread drives the socket: sleep until the I/O is free or a round completed.
    absl::MutexLock l(&mu_);
    const uint64_t seen = completions_;
    auto ready = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !owned_ || completions_ != seen;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready),
                          std::min(deadline, absl::Now() + absl::Milliseconds(100)));
  }
  // Past the deadline: end the connection, so that nothing is written into the caller's memory
  // after this returns.
  absl::Status late = absl::DeadlineExceededError(absl::StrCat(
      "request ", round->request_id(), " got no complete reply before its deadline"));
  round->Fail(late);
  Break(late);
  return round->Wait(absl::InfiniteFuture());  // Returns once no receive into it is running.
}

TcpConn::Progress TcpConn::Step(absl::FunctionRef<bool()> stop, bool until_full,
                                bool* readable) {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (broken_) break;
      if (!out_.has_value() && !writes_.empty()) {
        out_.emplace(std::move(writes_.front()));
        writes_.pop_front();
      }
    }
    absl::Status st;
    if (out_.has_value()) {
      auto all = out_->SendSome(*io_);
      if (!all.ok()) {
        st = absl::UnavailableError(
            absl::StrCat("data connection to ", peer_, ": ", all.status().message()));
      } else if (*all) {
        out_.reset();  // Lets go of the caller's memory.
        continue;
      }
    }
    // Records TLS already took off the socket are not seen by poll().
    if (!*readable && io_->HasPending()) *readable = true;
    if (st.ok() && *readable) st = ReadAvailable(stop);
    if (!st.ok()) {
      Break(st);
      break;
    }
    if (stop() || (until_full && out_.has_value())) return Progress::kDone;
    return Progress::kBlocked;
  }
  CleanUp();
  return Progress::kBroken;
}

void TcpConn::PollEvents(pollfd* p) const {
  p[0] = {fd_, static_cast<short>(POLLIN | (out_.has_value() ? POLLOUT : 0)), 0};
  p[1] = {wake_fd_, POLLIN, 0};
}

bool TcpConn::TookEvents(const pollfd* p) {
  if (p[1].revents & POLLIN) {
    uint64_t v;
    (void)!read(wake_fd_, &v, sizeof(v));
  }
  return (p[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

namespace {

// Waits for any of `p` until `deadline` (at most 100 ms at a time), first looking for up to
// `spin`: a reply due within microseconds costs less to look for again than to sleep for and be
// woken (tens of microseconds for an idle virtual CPU). Returns poll()'s count.
int PollSpinning(pollfd* p, nfds_t n, absl::Time now, absl::Time deadline, absl::Duration spin) {
  for (nfds_t i = 0; i < n; ++i) p[i].revents = 0;
  int ms = 100;
  if (deadline - now < absl::Milliseconds(100)) {
    ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - now)));
  }
  int ready = 0;
  if (spin > absl::ZeroDuration()) {
    const absl::Time until = now + spin;
    while ((ready = poll(p, n, 0)) == 0 && absl::Now() < until) {
      sched_yield();  // Other work on this core (the server, on a small machine) goes first.
    }
  }
  if (ready > 0) return ready;
  return poll(p, n, ms);
}

}  // namespace

void TcpConn::Drive(absl::FunctionRef<bool()> stop, absl::Time deadline, bool until_full,
                    bool poll_first) {
  // Whether reading may find something (a poll said so, or none was made yet).
  bool readable = !poll_first;
  while (Step(stop, until_full, &readable) == Progress::kBlocked) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return;
    pollfd p[2];
    PollEvents(p);
    readable = PollSpinning(p, 2, now, deadline, spin_) > 0 && TookEvents(p);
  }
}

bool TcpConn::Settled(const Round& round) {
  if (!round.Finished() || out_.has_value()) return false;
  absl::MutexLock l(&mu_);
  return writes_.empty();
}

size_t TcpConn::WaitAll(absl::Span<TcpConn* const> conns,
                        absl::Span<const std::shared_ptr<Round>> rounds, absl::Time deadline) {
  struct Driven {
    TcpConn* conn;
    Round* round;
    bool readable;
  };
  std::vector<Driven> driven;
  for (size_t i = 0; i < conns.size() && i < rounds.size(); ++i) {
    if (rounds[i]->Finished()) continue;
    if (conns[i]->TryOwn()) driven.push_back({conns[i], rounds[i].get(), false});
  }
  if (driven.size() < 2) {  // Nothing to gain over waiting on each connection in turn.
    for (auto& d : driven) d.conn->Disown();
    return 0;
  }
  const size_t count = driven.size();
  for (auto& d : driven) d.readable = d.conn->rpos_ != d.conn->rend_;
  std::vector<pollfd> p(2 * driven.size());
  bool failed = false;
  while (!driven.empty()) {
    for (size_t i = 0; i < driven.size();) {
      TcpConn* c = driven[i].conn;
      Round* round = driven[i].round;
      auto stop = [c, round] { return c->Settled(*round); };
      if (c->Step(stop, /*until_full=*/false, &driven[i].readable) == Progress::kBlocked) {
        ++i;
        continue;
      }
      c->Disown();  // Done (or broken): threads waiting on it take over.
      absl::Status st;
      if (round->Finished(&st) && !st.ok()) failed = true;
      driven.erase(driven.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // One part failed: the caller gives up the others rather than waiting for them (a part
    // parked at a gate may wait for what only the failed part's retry brings).
    if (driven.empty() || failed) break;
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    for (size_t i = 0; i < driven.size(); ++i) driven[i].conn->PollEvents(&p[2 * i]);
    const bool any = PollSpinning(p.data(), 2 * driven.size(), now, deadline,
                                  driven[0].conn->spin_) > 0;
    for (size_t i = 0; i < driven.size(); ++i) {
      driven[i].readable = any && driven[i].conn->TookEvents(&p[2 * i]);
    }
  }
  for (auto& d : driven) d.conn->Disown();
  return count;
}

// ------------------------------------------------------------------ receiving

absl::Status TcpConn::ReadAvailable(absl::FunctionRef<bool()> stop) {
  while (true) {
    // Where the next bytes go, and how many are wanted.
    char* p = nullptr;
    size_t want = 0;
    switch (in_.stage) {
      case Incoming::Stage::kHeader:
        p = reinterpret_cast<char*>(in_.header) + in_.got;
        want = kFrameHeaderBytes - in_.got;
        break;
      case Incoming::Stage::kPrefix:
        p = in_.prefix.data() + in_.got;
        want = in_.prefix.size() - in_.got;
        break;
      case Incoming::Stage::kPayload:
        p = in_.dst != nullptr ? in_.dst + (in_.h.aux - in_.remaining) : nullptr;
        want = in_.remaining;
        break;
    }
    if (want > 0) {
      size_t took = 0;
      if (rpos_ < rend_) {
        took = std::min(want, rend_ - rpos_);
        if (p != nullptr) std::memcpy(p, rbuf_.data() + rpos_, took);
        rpos_ += took;
      } else {
        // Large payloads go from the socket straight to their destination; the rest through
        // the buffer, so that one recv() takes a small reply whole.
        const bool straight = in_.stage == Incoming::Stage::kPayload && p != nullptr &&
                              want >= rbuf_.size() / 4;
        ssize_t r = straight ? io_->Recv(p, want, /*dontwait=*/true)
                             : io_->Recv(rbuf_.data(), rbuf_.size(), /*dontwait=*/true);
        if (r < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
          return absl::UnavailableError(
              absl::StrCat("data connection to ", peer_, ": recv: ", io_->ErrorText(errno)));
        }
        if (r == 0) {
          return absl::UnavailableError(
              absl::StrCat("data connection to ", peer_, " closed by the server"));
        }
        if (!straight) {
          rpos_ = 0;
          rend_ = static_cast<size_t>(r);
          continue;
        }
        took = static_cast<size_t>(r);
      }
      if (in_.stage == Incoming::Stage::kPayload) {
        in_.remaining -= took;
      } else {
        in_.got += took;
      }
      if (took < want) continue;
    }
    switch (in_.stage) {
      case Incoming::Stage::kHeader: {
        auto h = ParseFrameHeader(in_.header);
        if (!h.ok()) {
          return absl::InternalError(
              absl::StrCat("reply from ", peer_, ": ", h.status().message()));
        }
        in_.h = *h;
        if (in_.h.kind == kFrameShmMessage ? shm_ == nullptr
                                           : in_.h.kind != kFrameMessage &&
                                                 in_.h.kind != kFrameStatus) {
          return absl::InternalError(absl::StrCat("reply from ", peer_, ": unexpected frame kind ",
                                                  in_.h.kind));
        }
        // A message without its payload (kind 3: followed by the payload's ring position).
        in_.prefix.resize(in_.h.kind == kFrameMessage ? in_.h.length - in_.h.aux
                                                      : in_.h.length);
        in_.got = 0;
        in_.stage = Incoming::Stage::kPrefix;
        break;
      }
      case Incoming::Stage::kPrefix: {
        if (in_.h.kind == kFrameStatus) {
          absl::Status end =
              StatusFromWire(in_.h.aux, in_.prefix, absl::StrCat("PushPull to ", peer_));
          if (end.ok()) end = absl::UnavailableError(absl::StrCat("stream to ", peer_, " ended"));
          return end;
        }
        absl::Status st = OnPrefix();
        if (!st.ok()) return st;
        if (in_.stage == Incoming::Stage::kHeader && rpos_ == rend_ && stop()) {
          return absl::OkStatus();
        }
        break;
      }
      case Incoming::Stage::kPayload:
        FinishFrame();
        // Nothing buffered and nothing more wanted: skip the recv() that would only say so.
        if (rpos_ == rend_ && stop()) return absl::OkStatus();
        break;
    }
  }
}

absl::Status TcpConn::OnPrefix() {
  const uint32_t payload = in_.h.aux;
  size_t header_len = in_.prefix.size();
  const bool in_ring = in_.h.kind == kFrameShmMessage;
  if (in_ring) {  // The length is at least the position's 8 bytes (ParseFrameHeader).
    header_len -= kShmPositionBytes;
    in_.position = GetU64(reinterpret_cast<const unsigned char*>(in_.prefix.data()) + header_len);
  }
  if (payload > 0) {
    // The prefix ends with the `values` field's tag and length.
    const size_t trailer = 1 + VarintSize(payload);
    if (header_len < trailer || static_cast<uint8_t>(in_.prefix[header_len - trailer]) !=
                                    ((kPullChunkValuesField << 3) | 2)) {
      return absl::InternalError(absl::StrCat("reply from ", peer_, ": malformed PullChunk frame"));
    }
    header_len -= trailer;
  }
  in_.chunk.Clear();
  if (!in_.chunk.ParseFromArray(in_.prefix.data(), static_cast<int>(header_len))) {
    return absl::InternalError(absl::StrCat("reply from ", peer_, ": malformed PullChunk"));
  }
  std::shared_ptr<Round> round;
  {
    absl::MutexLock l(&mu_);
    auto it = rounds_.find(in_.chunk.request_id());
    if (it != rounds_.end()) {
      round = it->second;
      if (in_.chunk.last()) rounds_.erase(it);
    }
  }
  if (round != nullptr && round->Enter(in_.chunk)) in_.round = std::move(round);
  in_.direct = false;
  in_.dst = nullptr;
  if (in_.round != nullptr && payload > 0) {
    if (float* d = in_.round->DirectTarget(in_.chunk, payload)) {
      in_.direct = true;
      in_.dst = reinterpret_cast<char*>(d);
    } else {
      in_.buf = pool_->Acquire(payload);
      in_.dst = in_.buf.data;
    }
  }
  in_.remaining = payload;
  in_.stage = Incoming::Stage::kPayload;
  if (in_ring) {
    // The payload is in the reply ring: copied out whole, and its space handed back.
    auto src = shm_->reply().Locate(in_.position, payload);
    if (!src.ok()) {
      return absl::InternalError(absl::StrCat("reply from ", peer_, ": ", src.status().message()));
    }
    if (in_.dst != nullptr) std::memcpy(in_.dst, *src, payload);
    shm_->reply().Release(in_.position, payload);
    in_.remaining = 0;
    FinishFrame();
    return absl::OkStatus();
  }
  if (payload == 0) FinishFrame();
  return absl::OkStatus();
}

void TcpConn::FinishFrame() {
  const bool entered = in_.round != nullptr;
  if (entered) {
    if (in_.direct) {
      in_.round->Received(absl::OkStatus());
    } else {
      Payload values;
      if (in_.buf.data != nullptr) {
        std::shared_ptr<BufferPool> pool = pool_;
        BufferPool::Buffer b = in_.buf;
        values = Payload({absl::string_view(b.data, in_.h.aux)},
                         std::shared_ptr<const void>(b.data, [pool, b](const void*) {
                           pool->Release(b);
                         }));
        in_.buf = {};
      }
      in_.round->Copy(in_.chunk, values);
    }
  }
  in_.round.reset();
  in_.direct = false;
  in_.dst = nullptr;
  in_.remaining = 0;
  in_.got = 0;
  in_.stage = Incoming::Stage::kHeader;
  if (!entered && !in_.chunk.last()) return;
  bool retire = false;
  {
    absl::MutexLock l(&mu_);
    ++completions_;
    retire = retiring_ && rounds_.empty();
  }
  if (retire) Break(absl::UnavailableError(absl::StrCat("data connection to ", peer_, " retired")));
}

// ------------------------------------------------------------------ ending

void TcpConn::CleanUp() {
  if (in_.round != nullptr) {
    in_.round->Received(
        absl::UnavailableError(absl::StrCat("data connection to ", peer_, " broke")));
  }
  if (in_.buf.data != nullptr && !in_.direct) pool_->Release(in_.buf);
  in_ = Incoming();
  rpos_ = rend_ = 0;
  out_.reset();
  absl::MutexLock l(&mu_);
  ++completions_;
}

void TcpConn::Break(const absl::Status& st) {
  absl::flat_hash_map<uint64_t, std::shared_ptr<Round>> rounds;
  std::deque<OutFrame> unsent;
  bool own = false;
  {
    absl::MutexLock l(&mu_);
    if (broken_) return;
    broken_ = true;
    closing_ = true;
    rounds.swap(rounds_);
    unsent.swap(writes_);
    ++completions_;
    if (!owned_) {
      owned_ = true;
      own = true;
    }
  }
  shutdown(fd_, SHUT_RDWR);  // An owner waiting in poll() wakes up and cleans up.
  for (auto& [id, r] : rounds) r->Fail(st);
  unsent.clear();  // Lets go of the callers' memory.
  if (own) {
    CleanUp();
    Disown();
  }
}

void TcpConn::Forget(uint64_t request_id) {
  bool retire;
  {
    absl::MutexLock l(&mu_);
    rounds_.erase(request_id);
    retire = retiring_ && rounds_.empty();
  }
  if (retire) Break(absl::UnavailableError(absl::StrCat("data connection to ", peer_, " retired")));
}

void TcpConn::Cancel() {
  Break(absl::CancelledError(absl::StrCat("data connection to ", peer_, " cancelled")));
}

void TcpConn::Retire() {
  bool now;
  {
    absl::MutexLock l(&mu_);
    retiring_ = true;
    closing_ = true;
    now = rounds_.empty();
  }
  if (now) Break(absl::UnavailableError(absl::StrCat("data connection to ", peer_, " retired")));
}

void TcpConn::Shutdown(absl::Duration timeout) {
  Cancel();
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(
                           +[](bool* owned) { return !*owned; }, &owned_),
                       timeout);
}

bool TcpConn::done() const {
  absl::MutexLock l(&mu_);
  return broken_;
}

bool TcpConn::usable() const {
  absl::MutexLock l(&mu_);
  return !closing_;
}

}  // namespace pscluster
