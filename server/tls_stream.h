// TLS on the TCP data plane (OpenSSL, in user space: the kernel's TLS offload is not assumed).
//
// TlsContext holds the certificates of one side, read from the same PEM files as its gRPC
// credentials (common/tls.h): a server presents --tls_cert/--tls_key and, with --tls_ca, requires
// and verifies client certificates; a client verifies the server against its CA (and its name,
// as gRPC does) and presents its certificate when it has one. TLS 1.3 only.
//
// TlsIo is a connection's byte stream over a non-blocking socket. OpenSSL makes the handshake
// (certificates, key exchange); after it, the connection's records are protected here, as the
// kernel's TLS offload does: the traffic keys of TLS 1.3 (RFC 8446 section 7, from the
// handshake's traffic secrets) seal and open records of the standard format, so the wire is TLS
// 1.3 that any TLS 1.3 peer reads. That saves two copies per direction (OpenSSL seals into its
// own buffer and opens into another, then copies out): Send() seals the caller's bytes straight
// into the buffer that goes to send(), up to a few hundred KiB of records per send(); Recv()
// opens whole records straight into the caller's memory when they fit there. Reading and writing
// have a lock each, so a connection's reader and writers work at once. A record that fails its
// authentication check, one over TLS's size limit, one in the clear or an alert ends the
// connection, naming it; a close_notify ends the stream; session tickets are passed over.
// Each side moves to new keys with a KeyUpdate every RecordsPerKey() records it seals, and
// follows the peer's KeyUpdates.
#ifndef PSCLUSTER_SERVER_TLS_STREAM_H_
#define PSCLUSTER_SERVER_TLS_STREAM_H_

#include <atomic>
#include <memory>
#include <string>

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
  // check's when that failed); then the stream is unusable. Recv and Send only after it.
  absl::Status Handshake(absl::Time deadline);

  ssize_t Recv(void* data, size_t n, bool dontwait) override;
  ssize_t Send(const iovec* iov, size_t n, bool dontwait) override;
  int Flush(bool dontwait) override;
  bool HasPending() override;
  std::string ErrorText(int err) override;
  // The stream failed because of what the peer sent (a record that failed its check, a record
  // TLS does not allow here, an alert), not because the connection broke.
  bool refused() const { return refused_; }

  // The record protection of one direction: an AEAD context with its key, the static IV, the
  // record sequence number and the traffic secret of the next keys.
  struct RecordKeys;

  // Records sealed with one key before this side moves to the next with a KeyUpdate (TLS 1.3
  // limits what one AES-GCM key may seal, RFC 8446 section 5.5): 2^20, 16 GiB of data.
  static uint64_t RecordsPerKey();
  static void SetRecordsPerKeyForTesting(uint64_t n);

  // Whether AES-GCM records are sealed and opened with the CPU's vector AES and carry-less
  // multiply instructions (server/aes_gcm.h) instead of OpenSSL's EVP: where the CPU has them.
  // SetVectorAes(false) makes OpenSSL do every record (`--tls_vector_aes=false`); the setting
  // applies to the process's connections set up after it.
  static bool UsesVectorAes();
  static void SetVectorAes(bool allowed);

 private:
  // After an OpenSSL handshake call returned `r`: 1 = wait for the socket to be readable,
  // 2 = writable, 0 = the stream ended cleanly, -1 = failed (the error is kept; errno is set).
  int Classify(int r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Keeps the first error; the stream is unusable after it.
  void Fail(const std::string& why);
  // Fail, for what the peer sent.
  void Refuse(const std::string& why);
  // Waits for the socket (`want` as from Classify) until `deadline`; false when it passed.
  bool WaitSocket(int want, absl::Time deadline) const;
  // Sends what is buffered without waiting: 1 all of it, 0 some is left, -1 failed.
  int FlushSome() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // The traffic keys from the handshake's secrets, then the SSL object is freed.
  absl::Status StartRecords() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_, read_mu_);
  // Seals `content` bytes of `iov` from (i, off) on as one record of `type` into out_.
  bool SealRecord(const iovec* iov, size_t n, size_t* i, size_t* off, size_t content,
                  uint8_t type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Sends a KeyUpdate and seals what follows with the next keys.
  bool UpdateKeys() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Opens the next whole record of in_, its data into `dst` (room for `room` bytes; what does
  // not fit waits in plain_): >0 bytes delivered, 0 = none now (no whole record, or a record
  // without data), -1 = failed.
  ssize_t OpenRecord(char* dst, size_t room) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // A whole record is in in_ (or a header that OpenRecord refuses).
  bool WholeRecordBuffered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // recv() into in_ without waiting: bytes, 0 at the end of the stream, -1 with errno.
  ssize_t FillIn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // Where OpenSSL's handshake writes and its key log land (called inside OpenSSL calls).
  friend int TlsBioWrite(void* io, const char* data, int n);
  friend void TlsKeyLog(void* io, const char* line);
  void Buffer(const char* data, size_t n) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  const absl::Duration send_timeout_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> refused_{false};
  // The peer's KeyUpdate asked for one from this side.
  std::atomic<bool> update_asked_{false};
  mutable absl::Mutex err_mu_;
  std::string error_ ABSL_GUARDED_BY(err_mu_);

  // The handshake and the sending side.
  absl::Mutex write_mu_ ABSL_ACQUIRED_BEFORE(read_mu_);
  SSL* ssl_ ABSL_GUARDED_BY(write_mu_) = nullptr;  // Until the handshake is done.
  std::string client_secret_ ABSL_GUARDED_BY(write_mu_);
  std::string server_secret_ ABSL_GUARDED_BY(write_mu_);
  std::unique_ptr<RecordKeys> seal_ ABSL_GUARDED_BY(write_mu_);
  // Sealed bytes not yet sent: out_[out_pos_, out_len_).
  std::unique_ptr<char[]> out_ ABSL_GUARDED_BY(write_mu_);
  size_t out_cap_ ABSL_GUARDED_BY(write_mu_) = 0;
  size_t out_pos_ ABSL_GUARDED_BY(write_mu_) = 0;
  size_t out_len_ ABSL_GUARDED_BY(write_mu_) = 0;

  // The receiving side.
  absl::Mutex read_mu_;
  std::unique_ptr<RecordKeys> open_ ABSL_GUARDED_BY(read_mu_);
  // Received record bytes not yet opened: in_[in_pos_, in_len_).
  std::unique_ptr<char[]> in_ ABSL_GUARDED_BY(read_mu_);
  size_t in_pos_ ABSL_GUARDED_BY(read_mu_) = 0;
  size_t in_len_ ABSL_GUARDED_BY(read_mu_) = 0;
  // An opened record's data that did not fit the caller's memory: plain_[plain_pos_, plain_len_).
  std::unique_ptr<char[]> plain_ ABSL_GUARDED_BY(read_mu_);
  size_t plain_pos_ ABSL_GUARDED_BY(read_mu_) = 0;
  size_t plain_len_ ABSL_GUARDED_BY(read_mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(read_mu_) = false;  // The peer's close_notify came.
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TLS_STREAM_H_
