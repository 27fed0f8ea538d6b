#include "server/tls_stream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pscluster {
namespace {

// A frame's small pieces (header, message) are gathered up to one full record.
constexpr size_t kRecordBytes = 16384;
// Plaintext encrypted per Send() before the records go to the kernel in one send().
constexpr size_t kBatchBytes = 256 << 10;

// OpenSSL's reasons for the errors queued on this thread (cleared), or `fallback`.
std::string OpenSslErrors(const std::string& fallback) {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    if (!out.empty()) out += "; ";
    out += reason != nullptr ? reason : absl::StrCat("OpenSSL error ", e);
  }
  return out.empty() ? fallback : out;
}

}  // namespace

// The socket under the SSL object. Writes are buffered by the TlsIo (sent with MSG_NOSIGNAL:
// the stock socket BIO's write() raises SIGPIPE on a closed connection); reads are recv()
// without waiting.
int TlsBioWrite(void* io, const char* data, int n) {
  static_cast<TlsIo*>(io)->Buffer(data, static_cast<size_t>(n));
  return n;
}

namespace {

int BioWrite(BIO* b, const char* data, int n) {
  BIO_clear_retry_flags(b);
  return TlsBioWrite(BIO_get_data(b), data, n);
}

int BioRead(BIO* b, char* data, int n) {
  BIO_clear_retry_flags(b);
  const int fd = static_cast<TlsIo*>(BIO_get_data(b))->fd();
  ssize_t r;
  do {
    r = recv(fd, data, static_cast<size_t>(n), MSG_DONTWAIT);
  } while (r < 0 && errno == EINTR);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_read(b);
  return static_cast<int>(r);
}

long BioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int BioCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

int BioDestroy(BIO*) { return 1; }

const BIO_METHOD* SocketBio() {
  static const BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR,
                                 "pscluster data socket");
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    BIO_meth_set_destroy(m, BioDestroy);
    return m;
  }();
  return method;
}

// Settings of both sides: TLS 1.3, AES-GCM first (hardware-accelerated), no renegotiation or
// session tickets (nothing arrives after the handshake but data), large reads.
absl::Status Configure(SSL_CTX* ctx) {
  if (SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_ciphersuites(ctx,
                               "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                               "TLS_CHACHA20_POLY1305_SHA256") != 1) {
    return absl::InternalError(
        absl::StrCat("TLS setup: ", OpenSslErrors("cannot configure TLS 1.3")));
  }
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION |
                               SSL_OP_NO_TICKET);
  SSL_CTX_clear_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
  // Read ahead: one recv() takes several records.
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, 256 << 10);
  return absl::OkStatus();
}

absl::Status UseCertificate(SSL_CTX* ctx, const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert.c_str()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert: cannot use ", files.cert, ": ", OpenSslErrors("not a PEM certificate")));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_key: cannot use ", files.key, ": ", OpenSslErrors("not a PEM private key")));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls_key: ", files.key,
                                                   " does not match the certificate in ",
                                                   files.cert));
  }
  return absl::OkStatus();
}

absl::Status UseCa(SSL_CTX* ctx, const std::string& ca) {
  if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_ca: cannot use ", ca, ": ", OpenSslErrors("not a PEM CA bundle")));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::ForServer(const TlsFiles& files) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError(OpenSslErrors("SSL_CTX_new failed"));
  std::shared_ptr<TlsContext> c(new TlsContext(ctx, true, ""));
  absl::Status st = Configure(ctx);
  if (st.ok()) st = UseCertificate(ctx, files);
  if (st.ok() && !files.ca.empty()) {
    st = UseCa(ctx, files.ca);
    if (st.ok()) {
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      SSL_CTX_set_client_CA_list(ctx, SSL_load_client_CA_file(files.ca.c_str()));
    }
  }
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  if (!st.ok()) return st;
  return c;
}

absl::StatusOr<std::shared_ptr<TlsContext>> TlsContext::ForClient(
    const TlsFiles& files, const std::string& server_name) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return absl::InternalError(OpenSslErrors("SSL_CTX_new failed"));
  std::shared_ptr<TlsContext> c(new TlsContext(ctx, false, server_name));
  absl::Status st = Configure(ctx);
  if (st.ok()) {
    // As gRPC: the CA given, else the system's.
    st = files.ca.empty() ? (SSL_CTX_set_default_verify_paths(ctx) == 1
                                 ? absl::OkStatus()
                                 : absl::InternalError("TLS setup: no system CA certificates"))
                          : UseCa(ctx, files.ca);
  }
  if (st.ok() && (!files.cert.empty() || !files.key.empty())) st = UseCertificate(ctx, files);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!st.ok()) return st;
  return c;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

TlsIo::TlsIo(int fd, const TlsContext& context, const std::string& host,
             absl::Duration send_timeout)
    : DataIo(fd), send_timeout_(send_timeout) {
  absl::MutexLock l(&mu_);
  ssl_ = SSL_new(context.ctx());
  if (ssl_ == nullptr) {
    failed_ = true;
    error_ = OpenSslErrors("SSL_new failed");
    return;
  }
  BIO* bio = BIO_new(SocketBio());
  BIO_set_data(bio, this);
  SSL_set_bio(ssl_, bio, bio);
  if (context.is_server()) {
    SSL_set_accept_state(ssl_);
    return;
  }
  SSL_set_connect_state(ssl_);
  const std::string& name = context.server_name().empty() ? host : context.server_name();
  in6_addr scratch;
  const bool numeric = inet_pton(AF_INET, name.c_str(), &scratch) == 1 ||
                       inet_pton(AF_INET6, name.c_str(), &scratch) == 1;
  if (numeric) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), name.c_str());
  } else {
    SSL_set1_host(ssl_, name.c_str());
    SSL_set_tlsext_host_name(ssl_, name.c_str());
  }
}

TlsIo::~TlsIo() {
  absl::MutexLock l(&mu_);
  SSL_free(ssl_);
}

int TlsIo::Classify(int r) {
  const int saved = errno;
  const int e = SSL_get_error(ssl_, r);
  switch (e) {
    case SSL_ERROR_WANT_READ:
      return 1;
    case SSL_ERROR_WANT_WRITE:
      return 2;
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    case SSL_ERROR_SYSCALL:
      error_ = OpenSslErrors(saved != 0 ? std::strerror(saved) : "connection closed");
      errno = saved != 0 ? saved : ECONNRESET;
      break;
    default: {
      error_ = OpenSslErrors(absl::StrCat("TLS error ", e));
      const long verify = SSL_get_verify_result(ssl_);
      if (verify != X509_V_OK) {
        absl::StrAppend(&error_, " (", X509_verify_cert_error_string(verify), ")");
      }
      errno = EPROTO;
      break;
    }
  }
  failed_ = true;
  return -1;
}

bool TlsIo::WaitSocket(int want, absl::Time deadline) const {
  pollfd p{fd_, static_cast<short>(want == 2 ? POLLOUT : POLLIN), 0};
  while (true) {
    int ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      ms = static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left)));
    }
    const int r = poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // Let OpenSSL report the socket's error.
  }
}

void TlsIo::Buffer(const char* data, size_t n) {
  if (out_pos_ == out_.size()) {
    out_.clear();
    out_pos_ = 0;
  }
  out_.insert(out_.end(), data, data + n);
}

int TlsIo::FlushSome() {
  while (out_pos_ < out_.size()) {
    const ssize_t r =
        send(fd_, out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      out_pos_ += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (!failed_) {
      failed_ = true;
      error_ = std::strerror(errno);
    }
    return -1;
  }
  out_.clear();
  out_pos_ = 0;
  return 1;
}

absl::Status TlsIo::Handshake(absl::Time deadline) {
  while (true) {
    int want;
    {
      absl::MutexLock l(&mu_);
      if (failed_) return absl::UnavailableError(absl::StrCat("TLS handshake: ", error_));
      ERR_clear_error();
      const int r = SSL_do_handshake(ssl_);
      want = r == 1 ? 3 : Classify(r);
      // What OpenSSL wrote (its handshake messages, or the alert that says why it failed).
      const int flushed = FlushSome();
      if (want == 3 && flushed == 1) return absl::OkStatus();
      if (want == 0) {
        failed_ = true;
        error_ = "the peer closed the connection";
      }
      if (want <= 0) return absl::UnavailableError(absl::StrCat("TLS handshake: ", error_));
      if (flushed == 0) want = 2;
    }
    if (!WaitSocket(want, deadline)) {
      absl::MutexLock l(&mu_);
      failed_ = true;
      error_ = "no answer in time (is the peer speaking TLS?)";
      return absl::DeadlineExceededError(absl::StrCat("TLS handshake: ", error_));
    }
  }
}

ssize_t TlsIo::Recv(void* data, size_t n, bool dontwait) {
  while (true) {
    int want, err = 0;
    {
      absl::MutexLock l(&mu_);
      if (failed_) {
        errno = EPROTO;
        return -1;
      }
      ERR_clear_error();
      size_t got = 0;
      const int r = SSL_read_ex(ssl_, data, n, &got);
      if (out_pos_ < out_.size()) FlushSome();  // An alert, a key update's answer.
      if (r == 1) return static_cast<ssize_t>(got);
      want = Classify(r);
      err = errno;
    }
    if (want == 0) return 0;
    if (want < 0) {
      errno = err;
      return -1;
    }
    if (dontwait) {
      errno = EAGAIN;
      return -1;
    }
    WaitSocket(want, absl::InfiniteFuture());
  }
}

ssize_t TlsIo::Send(const iovec* iov, size_t n, bool dontwait) {
  const absl::Time deadline = send_timeout_ == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + send_timeout_;
  while (true) {
    int err = 0;
    {
      absl::MutexLock l(&mu_);
      if (failed_) {
        errno = EPROTO;
        return -1;
      }
      int flushed = FlushSome();
      if (flushed == 1) {
        // Encrypt up to kBatchBytes: a large piece as it is, small ones gathered into one record.
        size_t total = 0, i = 0, off = 0;
        while (i < n && total < kBatchBytes && !failed_) {
          if (iov[i].iov_len == off) {
            ++i;
            off = 0;
            continue;
          }
          const char* p = static_cast<const char*>(iov[i].iov_base) + off;
          size_t len = std::min(iov[i].iov_len - off, kBatchBytes - total);
          if (len < kRecordBytes && i + 1 < n) {
            gather_.resize(kRecordBytes);
            len = 0;
            for (size_t j = i, o = off; j < n && len < kRecordBytes; ++j, o = 0) {
              const size_t k = std::min(iov[j].iov_len - o, kRecordBytes - len);
              std::memcpy(gather_.data() + len, static_cast<const char*>(iov[j].iov_base) + o, k);
              len += k;
            }
            p = gather_.data();
          }
          ERR_clear_error();
          size_t wrote = 0;
          if (SSL_write_ex(ssl_, p, len, &wrote) != 1) {
            if (Classify(0) >= 0 || error_.empty()) error_ = "the peer closed the connection";
            failed_ = true;
            break;
          }
          total += wrote;
          for (off += wrote; i < n && off >= iov[i].iov_len; ++i) off -= iov[i].iov_len;
        }
        if (!failed_ && total > 0 && FlushSome() >= 0) return static_cast<ssize_t>(total);
        flushed = -1;
      }
      if (flushed < 0) {
        errno = errno != 0 && errno != EAGAIN ? errno : EPIPE;
        return -1;
      }
      err = EAGAIN;
    }
    if (dontwait || !WaitSocket(2, deadline)) {
      errno = err;
      return -1;
    }
  }
}

int TlsIo::Flush(bool dontwait) {
  const absl::Time deadline = send_timeout_ == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + send_timeout_;
  while (true) {
    {
      absl::MutexLock l(&mu_);
      const int flushed = FlushSome();
      if (flushed != 0) {
        if (flushed < 0) errno = EPIPE;
        return flushed;
      }
    }
    if (dontwait || !WaitSocket(2, deadline)) return 0;
  }
}

bool TlsIo::HasPending() {
  absl::MutexLock l(&mu_);
  return !failed_ && SSL_has_pending(ssl_) == 1;
}

std::string TlsIo::ErrorText(int err) {
  absl::MutexLock l(&mu_);
  if (!error_.empty()) return absl::StrCat("TLS: ", error_);
  return std::strerror(err);
}

}  // namespace pscluster
