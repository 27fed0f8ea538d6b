#include "server/tls_stream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/aes_gcm.h"

namespace pscluster {
namespace {

// The most data one record carries (TLS: 2^14 bytes).
constexpr size_t kRecordBytes = 16384;
// A record's header (type, version, length), its inner content type and its AEAD tag.
constexpr size_t kHeaderBytes = 5;
constexpr size_t kTagBytes = 16;
constexpr size_t kOverheadBytes = kHeaderBytes + 1 + kTagBytes;
// The longest record TLS 1.3 allows after its header (2^14 + 256).
constexpr size_t kMaxSealedBytes = kRecordBytes + 256;
// Data sealed per Send() before the records go to the kernel in one send().
constexpr size_t kBatchBytes = 256 << 10;
// Room for one batch's records (all full but the last) and a KeyUpdate among them.
constexpr size_t kOutBytes = kBatchBytes + (kBatchBytes / kRecordBytes + 2) * (kOverheadBytes + 8);
// recv() reads up to this much of the stream at once.
constexpr size_t kInBytes = (256 << 10) + kHeaderBytes + kMaxSealedBytes;
// TLS content types (RFC 8446 section 5.1).
constexpr uint8_t kAlert = 21, kHandshake = 22, kApplicationData = 23;

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

// The key log of a connection's handshake (defined below).
void TlsKeyLog(void* io, const char* line);

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

void KeyLog(const SSL* ssl, const char* line) {
  void* io = SSL_get_app_data(ssl);
  if (io != nullptr) TlsKeyLog(io, line);
}

// Settings of both sides: TLS 1.3, AES-GCM first (hardware-accelerated), no renegotiation or
// session tickets (nothing arrives after the handshake but data). No read-ahead: OpenSSL must
// read the handshake's records and nothing after them, which the record layer here reads. The
// key log hands the traffic secrets to the TlsIo of the connection (and nowhere else).
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
  SSL_CTX_set_read_ahead(ctx, 0);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_keylog_callback(ctx, KeyLog);
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

// The AEAD of one direction (RFC 8446 section 5.2-5.3): the nonce of record n is the static IV
// XOR n; the additional data is the record's header. The traffic secret stays for KeyUpdates.
struct TlsIo::RecordKeys {
  EVP_CIPHER_CTX* ctx = nullptr;
  // AES-GCM on the vector instructions instead of ctx, where the CPU has them (server/aes_gcm.h).
  std::unique_ptr<VectorAesGcm> vector;
  const EVP_MD* md = nullptr;
  std::string secret;
  unsigned char iv[12] = {};
  uint64_t seq = 0;

  ~RecordKeys() {
    EVP_CIPHER_CTX_free(ctx);
    OPENSSL_cleanse(iv, sizeof(iv));
    OPENSSL_cleanse(secret.data(), secret.size());
  }
  void Nonce(unsigned char* out) const {
    std::memcpy(out, iv, sizeof(iv));
    for (int b = 0; b < 8; ++b) out[11 - b] ^= static_cast<unsigned char>(seq >> (8 * b));
  }
  // The key and IV of `secret` (section 7.3), from record 0 on.
  bool Derive();
  // The next generation of keys (a KeyUpdate, section 7.2).
  bool Next();
};

namespace {

// HKDF-Expand-Label(secret, label, "", n) of TLS 1.3 (RFC 8446 section 7.1), n <= the hash's size:
// one block of HKDF-Expand.
bool ExpandLabel(const EVP_MD* md, const std::string& secret, const char* label, size_t n,
                 unsigned char* out) {
  std::string info;
  info.push_back(static_cast<char>(n >> 8));
  info.push_back(static_cast<char>(n & 0xff));
  const std::string full = absl::StrCat("tls13 ", label);
  info.push_back(static_cast<char>(full.size()));
  info += full;
  info.push_back(0);  // No context.
  info.push_back(1);  // Block 1.
  unsigned char block[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(md, secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(info.data()), info.size(), block,
           &len) == nullptr ||
      len < n) {
    return false;
  }
  std::memcpy(out, block, n);
  OPENSSL_cleanse(block, sizeof(block));
  return true;
}

}  // namespace

bool TlsIo::RecordKeys::Derive() {
  unsigned char key[32];
  const EVP_CIPHER* cipher = EVP_CIPHER_CTX_get0_cipher(ctx);
  const size_t key_len = static_cast<size_t>(EVP_CIPHER_get_key_length(cipher));
  const bool ok = key_len <= sizeof(key) && ExpandLabel(md, secret, "key", key_len, key) &&
                  ExpandLabel(md, secret, "iv", sizeof(iv), iv) &&
                  EVP_CipherInit_ex(ctx, nullptr, nullptr, key, nullptr, -1) == 1 &&
                  (vector == nullptr || vector->SetKey(key, key_len));
  OPENSSL_cleanse(key, sizeof(key));
  seq = 0;
  return ok;
}

bool TlsIo::RecordKeys::Next() {
  unsigned char next[EVP_MAX_MD_SIZE];
  if (!ExpandLabel(md, secret, "traffic upd", secret.size(), next)) return false;
  std::memcpy(secret.data(), next, secret.size());
  OPENSSL_cleanse(next, sizeof(next));
  return Derive();
}

namespace {

std::atomic<bool> vector_aes_allowed{true};

// The keys of one direction from its traffic secret, for the cipher suite `id`.
absl::StatusOr<std::unique_ptr<TlsIo::RecordKeys>> KeysFor(uint16_t id, const std::string& secret,
                                                           bool seal) {
  const EVP_CIPHER* cipher = nullptr;
  const EVP_MD* md = EVP_sha256();
  bool aes_gcm = true;
  switch (id) {
    case 0x1301:
      cipher = EVP_aes_128_gcm();
      break;
    case 0x1302:
      cipher = EVP_aes_256_gcm();
      md = EVP_sha384();
      break;
    case 0x1303:
      cipher = EVP_chacha20_poly1305();
      aes_gcm = false;
      break;
    default:
      return absl::UnimplementedError(
          absl::StrCat("the cipher suite 0x", absl::Hex(id), " is not one of TLS 1.3's AEADs"));
  }
  if (secret.size() != static_cast<size_t>(EVP_MD_get_size(md))) {
    return absl::InternalError("the handshake's traffic secret was not logged");
  }
  auto keys = std::make_unique<TlsIo::RecordKeys>();
  keys->md = md;
  keys->secret = secret;
  if (aes_gcm && TlsIo::UsesVectorAes()) keys->vector = std::make_unique<VectorAesGcm>();
  keys->ctx = EVP_CIPHER_CTX_new();
  if (keys->ctx == nullptr ||
      EVP_CipherInit_ex(keys->ctx, cipher, nullptr, nullptr, nullptr, seal ? 1 : 0) != 1 ||
      !keys->Derive()) {
    return absl::InternalError(OpenSslErrors("cannot set up the record keys"));
  }
  return keys;
}

// Seals or opens (`seal`) one record's bytes: the caller gives the additional data first, then
// the bytes in pieces, then finishes.
bool Begin(TlsIo::RecordKeys& k, const unsigned char* header) {
  unsigned char nonce[12];
  k.Nonce(nonce);
  int len = 0;
  return EVP_CipherInit_ex(k.ctx, nullptr, nullptr, nullptr, nonce, -1) == 1 &&
         EVP_CipherUpdate(k.ctx, nullptr, &len, header, kHeaderBytes) == 1;
}

}  // namespace

void TlsKeyLog(void* io, const char* line) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // "LABEL <client random, hex> <secret, hex>"; only the application traffic secrets are kept.
  TlsIo* self = static_cast<TlsIo*>(io);
  const char* sp = std::strchr(line, ' ');
  if (sp == nullptr) return;
  const std::string label(line, static_cast<size_t>(sp - line));
  std::string* target = label == "CLIENT_TRAFFIC_SECRET_0"   ? &self->client_secret_
                        : label == "SERVER_TRAFFIC_SECRET_0" ? &self->server_secret_
                                                             : nullptr;
  if (target == nullptr) return;
  const char* hex = std::strchr(sp + 1, ' ');
  if (hex == nullptr) return;
  ++hex;
  target->clear();
  for (; hex[0] != '\0' && hex[1] != '\0'; hex += 2) {
    const int hi = OPENSSL_hexchar2int(static_cast<unsigned char>(hex[0]));
    const int lo = OPENSSL_hexchar2int(static_cast<unsigned char>(hex[1]));
    if (hi < 0 || lo < 0) break;
    target->push_back(static_cast<char>(hi * 16 + lo));
  }
}

TlsIo::TlsIo(int fd, const TlsContext& context, const std::string& host,
             absl::Duration send_timeout)
    : DataIo(fd), send_timeout_(send_timeout) {
  absl::MutexLock l(&write_mu_);
  ssl_ = SSL_new(context.ctx());
  if (ssl_ == nullptr) {
    Fail(OpenSslErrors("SSL_new failed"));
    return;
  }
  SSL_set_app_data(ssl_, this);
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
  absl::MutexLock w(&write_mu_);
  SSL_free(ssl_);
  OPENSSL_cleanse(client_secret_.data(), client_secret_.size());
  OPENSSL_cleanse(server_secret_.data(), server_secret_.size());
}

void TlsIo::Fail(const std::string& why) {
  absl::MutexLock l(&err_mu_);
  if (error_.empty()) error_ = why;
  failed_ = true;
}

void TlsIo::Refuse(const std::string& why) {
  refused_ = true;
  Fail(why);
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
      Fail(OpenSslErrors(saved != 0 ? std::strerror(saved) : "connection closed"));
      errno = saved != 0 ? saved : ECONNRESET;
      break;
    default: {
      std::string why = OpenSslErrors(absl::StrCat("TLS error ", e));
      const long verify = SSL_get_verify_result(ssl_);
      if (verify != X509_V_OK) {
        absl::StrAppend(&why, " (", X509_verify_cert_error_string(verify), ")");
      }
      Fail(why);
      errno = EPROTO;
      break;
    }
  }
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
    if (errno != EINTR) return true;  // Let the next call report the socket's error.
  }
}

void TlsIo::Buffer(const char* data, size_t n) {
  if (out_pos_ == out_len_) out_pos_ = out_len_ = 0;
  if (out_len_ + n > out_cap_) {
    const size_t cap = std::max(out_len_ + n, kOutBytes);
    std::unique_ptr<char[]> grown(new char[cap]);
    if (out_len_ > out_pos_) std::memcpy(grown.get(), out_.get() + out_pos_, out_len_ - out_pos_);
    out_len_ -= out_pos_;
    out_pos_ = 0;
    out_ = std::move(grown);
    out_cap_ = cap;
  }
  std::memcpy(out_.get() + out_len_, data, n);
  out_len_ += n;
}

int TlsIo::FlushSome() {
  while (out_pos_ < out_len_) {
    const ssize_t r =
        send(fd_, out_.get() + out_pos_, out_len_ - out_pos_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      out_pos_ += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    Fail(std::strerror(errno));
    return -1;
  }
  out_pos_ = out_len_ = 0;
  return 1;
}

absl::Status TlsIo::Handshake(absl::Time deadline) {
  while (true) {
    int want;
    {
      absl::MutexLock l(&write_mu_);
      if (failed_ || ssl_ == nullptr) {
        absl::MutexLock e(&err_mu_);
        return absl::UnavailableError(absl::StrCat(
            "TLS handshake: ", error_.empty() ? "the handshake was already made" : error_));
      }
      ERR_clear_error();
      const int r = SSL_do_handshake(ssl_);
      want = r == 1 ? 3 : Classify(r);
      // What OpenSSL wrote (its handshake messages, or the alert that says why it failed).
      const int flushed = FlushSome();
      if (want == 3 && flushed == 1) {
        absl::MutexLock rl(&read_mu_);
        absl::Status st = StartRecords();
        if (!st.ok()) {
          Fail(std::string(st.message()));
          return absl::UnavailableError(absl::StrCat("TLS handshake: ", st.message()));
        }
        return absl::OkStatus();
      }
      if (want == 0) Fail("the peer closed the connection");
      if (want <= 0) {
        absl::MutexLock e(&err_mu_);
        return absl::UnavailableError(absl::StrCat("TLS handshake: ", error_));
      }
      if (flushed == 0) want = 2;
    }
    if (!WaitSocket(want, deadline)) {
      Fail("no answer in time (is the peer speaking TLS?)");
      return absl::DeadlineExceededError(
          "TLS handshake: no answer in time (is the peer speaking TLS?)");
    }
  }
}

absl::Status TlsIo::StartRecords() {
  if (SSL_version(ssl_) != TLS1_3_VERSION) return absl::InternalError("not TLS 1.3");
  if (SSL_pending(ssl_) > 0 || SSL_has_pending(ssl_) == 1) {
    return absl::InternalError("data was read with the handshake");
  }
  const SSL_CIPHER* cipher = SSL_get_current_cipher(ssl_);
  if (cipher == nullptr) return absl::InternalError("no cipher suite was agreed");
  const uint16_t id = SSL_CIPHER_get_protocol_id(cipher);
  const bool server = SSL_is_server(ssl_) == 1;
  auto seal = KeysFor(id, server ? server_secret_ : client_secret_, /*seal=*/true);
  if (!seal.ok()) return seal.status();
  auto open = KeysFor(id, server ? client_secret_ : server_secret_, /*seal=*/false);
  if (!open.ok()) return open.status();
  OPENSSL_cleanse(client_secret_.data(), client_secret_.size());
  OPENSSL_cleanse(server_secret_.data(), server_secret_.size());
  client_secret_.clear();
  server_secret_.clear();
  SSL_free(ssl_);
  ssl_ = nullptr;
  seal_ = *std::move(seal);
  open_ = *std::move(open);
  if (out_cap_ < kOutBytes) {
    std::unique_ptr<char[]> grown(new char[kOutBytes]);
    if (out_len_ > out_pos_) std::memcpy(grown.get(), out_.get() + out_pos_, out_len_ - out_pos_);
    out_len_ -= out_pos_;
    out_pos_ = 0;
    out_ = std::move(grown);
    out_cap_ = kOutBytes;
  }
  in_.reset(new char[kInBytes]);
  plain_.reset(new char[kMaxSealedBytes]);
  return absl::OkStatus();
}

bool TlsIo::SealRecord(const iovec* iov, size_t n, size_t* i, size_t* off, size_t content,
                       uint8_t type) {
  unsigned char* const header = reinterpret_cast<unsigned char*>(out_.get() + out_len_);
  const size_t sealed = content + 1 + kTagBytes;
  header[0] = kApplicationData;
  header[1] = 0x03;
  header[2] = 0x03;
  header[3] = static_cast<unsigned char>(sealed >> 8);
  header[4] = static_cast<unsigned char>(sealed & 0xff);
  RecordKeys& k = *seal_;
  unsigned char nonce[sizeof(k.iv)];
  k.Nonce(nonce);
  if (k.vector == nullptr && !Begin(k, header)) return false;
  unsigned char* const body = header + kHeaderBytes;
  size_t pos = 0;  // Bytes of the body sealed so far.
  auto crypt = [&](const unsigned char* src, size_t take) {
    if (k.vector != nullptr) {
      k.vector->Crypt(nonce, pos, src, body + pos, take);
      pos += take;
      return true;
    }
    int len = 0;
    if (EVP_CipherUpdate(k.ctx, body + pos, &len, src, static_cast<int>(take)) != 1) return false;
    pos += static_cast<size_t>(len);
    return true;
  };
  for (size_t left = content; left > 0;) {
    if (iov[*i].iov_len == *off) {
      ++*i;
      *off = 0;
      continue;
    }
    const size_t take = std::min(left, iov[*i].iov_len - *off);
    if (!crypt(static_cast<const unsigned char*>(iov[*i].iov_base) + *off, take)) return false;
    *off += take;
    left -= take;
  }
  if (!crypt(&type, 1)) return false;
  if (k.vector != nullptr) {
    k.vector->Tag(nonce, header, kHeaderBytes, body, pos, body + pos);
  } else {
    int len = 0;
    if (EVP_CipherFinal_ex(k.ctx, body + pos, &len) != 1) return false;
    pos += static_cast<size_t>(len);
    if (EVP_CIPHER_CTX_ctrl(k.ctx, EVP_CTRL_AEAD_GET_TAG, kTagBytes, body + pos) != 1) {
      return false;
    }
  }
  ++k.seq;
  out_len_ += kHeaderBytes + sealed;
  return true;
}

namespace {
std::atomic<uint64_t> records_per_key{uint64_t{1} << 20};
}  // namespace

uint64_t TlsIo::RecordsPerKey() { return records_per_key.load(std::memory_order_relaxed); }

void TlsIo::SetRecordsPerKeyForTesting(uint64_t n) { records_per_key = n; }

bool TlsIo::UsesVectorAes() {
  static const bool supported = VectorAesGcm::Supported();
  return supported && vector_aes_allowed.load(std::memory_order_relaxed);
}

void TlsIo::SetVectorAes(bool allowed) { vector_aes_allowed = allowed; }

bool TlsIo::UpdateKeys() {
  // KeyUpdate, update_not_requested (section 4.6.3), sealed with the keys it retires.
  static const unsigned char kMessage[5] = {24, 0, 0, 1, 0};
  const iovec v{const_cast<unsigned char*>(kMessage), sizeof(kMessage)};
  size_t i = 0, off = 0;
  return SealRecord(&v, 1, &i, &off, sizeof(kMessage), kHandshake) && seal_->Next();
}

ssize_t TlsIo::Send(const iovec* iov, size_t n, bool dontwait) {
  const absl::Time deadline = send_timeout_ == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + send_timeout_;
  size_t want = 0;
  for (size_t j = 0; j < n; ++j) want += iov[j].iov_len;
  while (true) {
    {
      absl::MutexLock l(&write_mu_);
      if (failed_ || seal_ == nullptr) {
        errno = EPROTO;
        return -1;
      }
      const int flushed = FlushSome();
      if (flushed < 0) {
        errno = errno != 0 && errno != EAGAIN ? errno : EPIPE;
        return -1;
      }
      if (flushed == 1) {
        // Seal up to kBatchBytes as full records (one record spans the caller's pieces).
        const size_t total = std::min(want, kBatchBytes);
        size_t i = 0, off = 0;
        for (size_t done = 0; done < total;) {
          if ((seal_->seq >= RecordsPerKey() || update_asked_.exchange(false)) && !UpdateKeys()) {
            Fail(OpenSslErrors("cannot update the keys"));
            errno = EPROTO;
            return -1;
          }
          const size_t content = std::min(kRecordBytes, total - done);
          if (!SealRecord(iov, n, &i, &off, content, kApplicationData)) {
            Fail(OpenSslErrors("cannot seal a record"));
            errno = EPROTO;
            return -1;
          }
          done += content;
        }
        if (FlushSome() < 0) {
          errno = errno != 0 && errno != EAGAIN ? errno : EPIPE;
          return -1;
        }
        return static_cast<ssize_t>(total);
      }
    }
    if (dontwait || !WaitSocket(2, deadline)) {
      errno = EAGAIN;
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
      absl::MutexLock l(&write_mu_);
      const int flushed = FlushSome();
      if (flushed != 0) {
        if (flushed < 0) errno = EPIPE;
        return flushed;
      }
    }
    if (dontwait || !WaitSocket(2, deadline)) return 0;
  }
}

bool TlsIo::WholeRecordBuffered() const {
  const size_t have = in_len_ - in_pos_;
  if (have < kHeaderBytes) return false;
  const unsigned char* h = reinterpret_cast<const unsigned char*>(in_.get() + in_pos_);
  const size_t sealed = (size_t{h[3]} << 8) | h[4];
  // A header that OpenRecord refuses counts too: the error comes without waiting for the body.
  return h[0] != kApplicationData || sealed > kMaxSealedBytes || have >= kHeaderBytes + sealed;
}

ssize_t TlsIo::OpenRecord(char* dst, size_t room) {
  const size_t have = in_len_ - in_pos_;
  if (have < kHeaderBytes) return 0;
  const unsigned char* h = reinterpret_cast<const unsigned char*>(in_.get() + in_pos_);
  const size_t sealed = (size_t{h[3]} << 8) | h[4];
  if (h[0] != kApplicationData) {
    Refuse(absl::StrCat("a record of type ", h[0], " after the handshake (unexpected_message)"));
    return -1;
  }
  if (sealed > kMaxSealedBytes || sealed < 1 + kTagBytes) {
    Refuse(absl::StrCat("a record of ", sealed, " bytes (record_overflow)"));
    return -1;
  }
  if (have < kHeaderBytes + sealed) return 0;
  const size_t body = sealed - kTagBytes;
  unsigned char* target = reinterpret_cast<unsigned char*>(room >= body ? dst : plain_.get());
  RecordKeys& k = *open_;
  bool ok;
  if (k.vector != nullptr) {
    // The tag first: nothing of a record that fails it reaches the caller's memory.
    unsigned char nonce[sizeof(k.iv)], tag[kTagBytes];
    k.Nonce(nonce);
    k.vector->Tag(nonce, h, kHeaderBytes, h + kHeaderBytes, body, tag);
    ok = CRYPTO_memcmp(tag, h + kHeaderBytes + body, kTagBytes) == 0;
    if (ok) k.vector->Crypt(nonce, 0, h + kHeaderBytes, target, body);
  } else {
    int len = 0, fin = 0;
    unsigned char tag[kTagBytes];
    std::memcpy(tag, h + kHeaderBytes + body, kTagBytes);
    ok = Begin(k, h) &&
         EVP_CipherUpdate(k.ctx, target, &len, h + kHeaderBytes, static_cast<int>(body)) == 1 &&
         EVP_CIPHER_CTX_ctrl(k.ctx, EVP_CTRL_AEAD_SET_TAG, kTagBytes, tag) == 1 &&
         EVP_CipherFinal_ex(k.ctx, target + len, &fin) == 1;
  }
  if (!ok) {
    ERR_clear_error();
    Refuse("a record failed its authentication check (bad_record_mac): altered on the way, or "
         "not sealed with this connection's keys");
    return -1;
  }
  ++k.seq;
  in_pos_ += kHeaderBytes + sealed;
  // The content type is the last byte that is not padding.
  size_t end = body;
  while (end > 0 && target[end - 1] == 0) --end;
  if (end == 0) {
    Refuse("a record without a content type (unexpected_message)");
    return -1;
  }
  const uint8_t type = target[end - 1];
  const size_t content = end - 1;
  switch (type) {
    case kApplicationData:
      if (target == reinterpret_cast<unsigned char*>(dst)) return static_cast<ssize_t>(content);
      {
        const size_t now = std::min(room, content);
        std::memcpy(dst, target, now);
        plain_pos_ = now;
        plain_len_ = content;
        return static_cast<ssize_t>(now);
      }
    case kAlert:
      if (content == 2 && target[1] == 0) {  // close_notify
        closed_ = true;
        return 0;
      }
      if (content != 2) {
        Refuse("a malformed alert (decode_error)");
      } else {
        // OpenSSL's words for the alert (its reason codes are the alert's plus 1000).
        const char* reason = ERR_reason_error_string(
            ERR_PACK(ERR_LIB_SSL, 0, SSL_AD_REASON_OFFSET + target[1]));
        Refuse(absl::StrCat("the peer refused the connection: ",
                          reason != nullptr ? reason : SSL_alert_desc_string_long(target[1])));
      }
      return -1;
    case kHandshake:
      // A session ticket may come after the handshake (this side asks for none); ignored.
      if (content >= 4 && target[0] == 4) return 0;
      // A KeyUpdate: the peer's next records are sealed with its next keys; when it asks, this
      // side's next record goes with new keys too (Send sends the KeyUpdate first).
      if (content == 5 && target[0] == 24 && target[1] == 0 && target[2] == 0 &&
          target[3] == 1 && target[4] <= 1) {
        if (!k.Next()) {
          Refuse(OpenSslErrors("cannot update the keys"));
          return -1;
        }
        if (target[4] == 1) update_asked_ = true;
        return 0;
      }
      Refuse(absl::StrCat("a handshake message of type ", content >= 1 ? target[0] : 0, " and ",
                        content, " bytes after the handshake (unexpected_message)"));
      return -1;
    default:
      Refuse(absl::StrCat("a record of content type ", type, " (unexpected_message)"));
      return -1;
  }
}

ssize_t TlsIo::FillIn() {
  if (in_pos_ == in_len_) {
    in_pos_ = in_len_ = 0;
  } else if (kInBytes - in_len_ < kHeaderBytes + kMaxSealedBytes) {
    std::memmove(in_.get(), in_.get() + in_pos_, in_len_ - in_pos_);
    in_len_ -= in_pos_;
    in_pos_ = 0;
  }
  ssize_t r;
  do {
    r = recv(fd_, in_.get() + in_len_, kInBytes - in_len_, MSG_DONTWAIT);
  } while (r < 0 && errno == EINTR);
  if (r > 0) in_len_ += static_cast<size_t>(r);
  return r;
}

ssize_t TlsIo::Recv(void* data, size_t n, bool dontwait) {
  char* const out = static_cast<char*>(data);
  while (true) {
    {
      absl::MutexLock l(&read_mu_);
      if (failed_ || open_ == nullptr) {
        errno = EPROTO;
        return -1;
      }
      size_t got = 0;
      if (plain_pos_ < plain_len_) {
        got = std::min(n, plain_len_ - plain_pos_);
        std::memcpy(out, plain_.get() + plain_pos_, got);
        plain_pos_ += got;
      }
      // Whole records straight into the caller's memory; more from the socket while it has some.
      bool drained = false;
      while (got < n && plain_pos_ == plain_len_ && !closed_) {
        if (WholeRecordBuffered()) {
          const ssize_t r = OpenRecord(out + got, n - got);
          if (r < 0) {
            errno = EPROTO;
            return -1;
          }
          got += static_cast<size_t>(r);
          continue;
        }
        if (drained) break;
        const ssize_t r = FillIn();
        if (r > 0) continue;
        if (r == 0) {
          if (got > 0) break;
          if (in_pos_ < in_len_) {
            Fail("the connection closed in the middle of a record");
            errno = EPROTO;
            return -1;
          }
          return 0;  // As OpenSSL with SSL_OP_IGNORE_UNEXPECTED_EOF: the end of the stream.
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          const int err = errno;
          Fail(std::strerror(err));
          errno = err;
          return -1;
        }
        drained = true;
      }
      if (got > 0) return static_cast<ssize_t>(got);
      if (closed_) return 0;
    }
    if (dontwait) {
      errno = EAGAIN;
      return -1;
    }
    WaitSocket(1, absl::InfiniteFuture());
  }
}

bool TlsIo::HasPending() {
  absl::MutexLock l(&read_mu_);
  return !failed_ && open_ != nullptr &&
         (plain_pos_ < plain_len_ || closed_ || WholeRecordBuffered());
}

std::string TlsIo::ErrorText(int err) {
  absl::MutexLock l(&err_mu_);
  if (!error_.empty()) return absl::StrCat("TLS: ", error_);
  return std::strerror(err);
}

}  // namespace pscluster
