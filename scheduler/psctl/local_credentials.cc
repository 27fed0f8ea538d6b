#include "scheduler/psctl/local_credentials.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/data_auth.h"
#include "common/token_file.h"

namespace pscluster::psctl {
namespace {

// Writes `text` to `path` readable by this user only: a new file (0600) renamed over the old.
absl::Status WritePrivate(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::remove(tmp.c_str());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    ssize_t w = write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      close(fd);
      std::remove(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(w);
  }
  if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NewToken() {
  auto bytes = RandomBytes(32);
  if (!bytes.ok()) return bytes.status();
  return absl::BytesToHexString(*bytes);
}

// ------------------------------------------------------------------ certificates

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using CertPtr = std::unique_ptr<X509, decltype(&X509_free)>;

// OpenSSL's queued errors as one line (and the queue emptied).
std::string OpenSslErrors() {
  std::string out;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

absl::Status OpenSslFailure(absl::string_view what) {
  return absl::InternalError(absl::StrCat("cannot ", what, ": ", OpenSslErrors()));
}

absl::StatusOr<KeyPtr> NewKey() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (key == nullptr) return OpenSslFailure("make a P-256 key");
  return KeyPtr(key, &EVP_PKEY_free);
}

bool AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `key` named `cn`, signed by `issuer_key` (of `issuer`; nullptr: self-signed,
// a CA). Leaf certificates serve and authenticate on loopback: 127.0.0.1 and localhost.
absl::StatusOr<CertPtr> NewCertificate(const std::string& cn, EVP_PKEY* key, X509* issuer,
                                       EVP_PKEY* issuer_key) {
  CertPtr cert(X509_new(), &X509_free);
  auto serial = RandomBytes(16);
  if (!serial.ok()) return serial.status();
  (*serial)[0] &= 0x7f;  // Positive.
  BIGNUM* bn = BN_bin2bn(reinterpret_cast<const unsigned char*>(serial->data()),
                         static_cast<int>(serial->size()), nullptr);
  const bool ca = issuer == nullptr;
  bool ok = cert != nullptr && bn != nullptr && X509_set_version(cert.get(), 2) == 1 &&
            BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr &&
            X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) != nullptr &&
            X509_gmtime_adj(X509_getm_notAfter(cert.get()), 365L * 24 * 3600) != nullptr &&
            X509_set_pubkey(cert.get(), key) == 1;
  BN_free(bn);
  X509_NAME* name = cert ? X509_get_subject_name(cert.get()) : nullptr;
  ok = ok &&
       X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                                  reinterpret_cast<const unsigned char*>("pscluster local cluster"),
                                  -1, -1, 0) == 1 &&
       X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                  reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                  0) == 1 &&
       X509_set_issuer_name(cert.get(), ca ? name : X509_get_subject_name(issuer)) == 1;
  X509* signer = ca ? cert.get() : issuer;
  if (ok && ca) {
    ok = AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
         AddExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign") &&
         AddExtension(cert.get(), signer, NID_subject_key_identifier, "hash");
  } else if (ok) {
    ok = AddExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE") &&
         AddExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature") &&
         AddExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth") &&
         AddExtension(cert.get(), signer, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1") &&
         AddExtension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  }
  ok = ok && X509_sign(cert.get(), ca ? key : issuer_key, EVP_sha256()) > 0;
  if (!ok) return OpenSslFailure(absl::StrCat("make the certificate of ", cn));
  return cert;
}

// PEM text of a certificate or a private key.
template <typename T, typename Write>
absl::StatusOr<std::string> Pem(T* object, Write write, absl::string_view what) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  if (bio == nullptr || !write(bio.get(), object)) return OpenSslFailure(what);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  return Pem(cert, [](BIO* b, X509* c) { return PEM_write_bio_X509(b, c) == 1; },
             "write a certificate");
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  return Pem(
      key,
      [](BIO* b, EVP_PKEY* k) {
        return PEM_write_bio_PrivateKey(b, k, nullptr, nullptr, 0, nullptr, nullptr) == 1;
      },
      "write a private key");
}

}  // namespace

std::string LocalAdminTokenFile(const std::string& work_dir) {
  return work_dir + "/credentials/admin.token";
}

absl::StatusOr<LocalCredentials> MakeLocalCredentials(const std::string& work_dir,
                                                      const std::string& extra_admin_token) {
  LocalCredentials c;
  c.dir = work_dir + "/credentials";
  absl::Status st = MakeDirs(c.dir);
  if (!st.ok()) return st;
  // A directory made by an earlier run, or by hand, is closed to others too.
  if (chmod(c.dir.c_str(), 0700) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot make ", c.dir, " private (chmod 0700): ", std::strerror(errno)));
  }
  struct Who {
    const char* file;
    const char* identity;
    const char* roles;
    std::string token;
  };
  std::vector<Who> who = {{"admin.token", "psctl-admin", "admin,viewer", ""},
                          {"scheduler.token", "scheduler", "scheduler", ""},
                          {"server.token", "servers", "server,node", ""},
                          {"worker.token", "workers", "worker,node", ""}};
  std::string lines = "# Tokens of this local cluster (psctl up --local); made anew at each start.\n";
  for (Who& w : who) {
    auto token = NewToken();
    if (!token.ok()) return token.status();
    w.token = *token;
    st = WritePrivate(absl::StrCat(c.dir, "/", w.file), w.token + "\n");
    if (!st.ok()) return st;
    absl::StrAppend(&lines, Sha256Hex(w.token), " ", w.identity, " ", w.roles, "\n");
  }
  if (!extra_admin_token.empty() && extra_admin_token != who[0].token) {
    absl::StrAppend(&lines, Sha256Hex(extra_admin_token), " psctl-user admin,viewer\n");
  }
  c.token_file = c.dir + "/tokens";
  st = WritePrivate(c.token_file, lines);
  if (!st.ok()) return st;
  // Checked as the daemons will read it.
  auto parsed = TokenFile::Load(c.token_file);
  if (!parsed.ok()) return parsed.status();
  c.admin_token_file = LocalAdminTokenFile(work_dir);
  c.admin_token = who[0].token;

  // A throw-away CA: its key signs the certificates below and is never written anywhere, so no
  // other certificate can ever be made under it.
  auto ca_key = NewKey();
  if (!ca_key.ok()) return ca_key.status();
  auto ca = NewCertificate("pscluster local CA", ca_key->get(), nullptr, nullptr);
  if (!ca.ok()) return ca.status();
  auto ca_pem = CertPem(ca->get());
  if (!ca_pem.ok()) return ca_pem.status();
  c.tls_ca = c.dir + "/ca.pem";
  st = WritePrivate(c.tls_ca, *ca_pem);
  if (!st.ok()) return st;
  // One certificate per identity, named as in the token file (its subject's common name), so
  // that a call with the certificate alone is authorized as that identity.
  std::vector<TlsFiles> files;
  for (const Who& w : who) {
    auto key = NewKey();
    if (!key.ok()) return key.status();
    auto cert = NewCertificate(w.identity, key->get(), ca->get(), ca_key->get());
    if (!cert.ok()) return cert.status();
    auto cert_pem = CertPem(cert->get());
    if (!cert_pem.ok()) return cert_pem.status();
    auto key_pem = KeyPem(key->get());
    if (!key_pem.ok()) return key_pem.status();
    const std::string base = absl::StrCat(c.dir, "/", absl::string_view(w.file).substr(
                                                           0, std::strlen(w.file) - 6));
    TlsFiles f{base + ".crt", base + ".key", c.tls_ca};
    st = WritePrivate(f.key, *key_pem);
    if (st.ok()) st = WritePrivate(f.cert, *cert_pem);
    if (!st.ok()) return st;
    files.push_back(std::move(f));
  }
  c.admin_tls = files[0];
  const std::string tokens = "--token_file=" + c.token_file;
  auto args = [&](const char* token, const TlsFiles& f) {
    return std::vector<std::string>{tokens,
                                    absl::StrCat("--credential_file=", c.dir, "/", token),
                                    "--tls_cert=" + f.cert, "--tls_key=" + f.key,
                                    "--tls_ca=" + f.ca};
  };
  c.scheduler_args = args("scheduler.token", files[1]);
  c.server_args = args("server.token", files[2]);
  c.worker_args = args("worker.token", files[3]);
  return c;
}

}  // namespace pscluster::psctl
