// TLS on the TCP data plane (OpenSSL, in user space: the kernel's TLS offload is not assumed).
//
// TlsContext holds the certificates of one side, read from the same PEM files as its gRPC
// credentials (common/tls.h): a server presents --tls_cert/--tls_key and, with --tls_ca, requires
// and verifies client certificates; a client verifies the server against its CA (and its name,
// as gRPC does) and presents its certificate when it has one. TLS 1.3 only.
//
// TlsIo is a connection's byte stream through one SSL object over a non-blocking socket. Several
// threads may use it (the server's reader, writer and producing threads): every OpenSSL call on
// the connection runs under one mutex, never held while waiting, which happens in poll() on the
// socket (for what OpenSSL asked: readable or writable), or not at all with `dontwait`.
// Records are not written one send() each: Send() encrypts up to a few hundred KiB of the
// caller's bytes into a buffer and hands it to the kernel in one send(); what the socket does not
// take at once waits there for the next Send() or Flush().
#ifndef PSCLUSTER_SERVER_TLS_STREAM_H_
#define PSCLUSTER_SERVER_TLS_STREAM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "server/data_io.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace pscluster {

class TlsContext {
 public:
  // Errors name the flag and file that cannot be used.
  static absl::StatusOr<std::shared_ptr<TlsContext>> ForServer(const TlsFiles& files);
  // `server_name`: the name the server's certificate must carry (empty: the host dialed).
  static absl::StatusOr<std::shared_ptr<TlsContext>> ForClient(const TlsFiles& files,
                                                               const std::string& server_name);
  ~TlsContext();

  bool is_server() const { return server_; }
  const std::string& server_name() const { return server_name_; }
  SSL_CTX* ctx() const { return ctx_; }

 private:
  TlsContext(SSL_CTX* ctx, bool server, std::string server_name)
      : ctx_(ctx), server_(server), server_name_(std::move(server_name)) {}
  SSL_CTX* const ctx_;
  const bool server_;
  const std::string server_name_;
};

class TlsIo : public DataIo {
 public:
  // Takes the non-blocking socket `fd` (not its ownership). A client checks the server's
  // certificate against `host` (or the context's server name).
  TlsIo(int fd, const TlsContext& context, const std::string& host,
        absl::Duration send_timeout = absl::InfiniteDuration());
  ~TlsIo() override;

  // The handshake, within `deadline`. An error says why (OpenSSL's reason, with the certificate
  // check's when that failed); then the stream is unusable.
  absl::Status Handshake(absl::Time deadline);

  ssize_t Recv(void* data, size_t n, bool dontwait) override;
  ssize_t Send(const iovec* iov, size_t n, bool dontwait) override;
  int Flush(bool dontwait) override;
  bool HasPending() override;
  std::string ErrorText(int err) override;

 private:
  // After an OpenSSL call returned `r`: 1 = wait for the socket to be readable, 2 = writable,
  // 0 = the stream ended cleanly, -1 = failed (error_ says why; errno is set).
  int Classify(int r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the socket (`want` as from Classify) until `deadline`; false when it passed.
  bool WaitSocket(int want, absl::Time deadline) const;
  // Sends what is buffered without waiting: 1 all of it, 0 some is left, -1 failed.
  int FlushSome() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where OpenSSL's socket writes land (called inside OpenSSL calls, under mu_).
  friend int TlsBioWrite(void* io, const char* data, int n);
  void Buffer(const char* data, size_t n) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  const absl::Duration send_timeout_;
  absl::Mutex mu_;
  SSL* ssl_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  // Small pieces of a frame gathered into one record.
  std::vector<char> gather_ ABSL_GUARDED_BY(mu_);
  // Encrypted bytes not yet sent: out_[out_pos_, out_.size()).
  std::vector<char> out_ ABSL_GUARDED_BY(mu_);
  size_t out_pos_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TLS_STREAM_H_
