#include "common/data_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/status/status.h"

namespace pscluster {
namespace {

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutField(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len);
  return std::string(reinterpret_cast<const char*>(md), len);
}

}  // namespace

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return absl::InternalError("OpenSSL's random generator failed");
  }
  return out;
}

std::string DeriveJobDataSecret(absl::string_view cluster_key, absl::string_view job_id) {
  std::string ctx;
  PutField(&ctx, "pscluster job data secret v1");
  PutField(&ctx, job_id);
  return HmacSha256(cluster_key, ctx);
}

std::string DataAuthProof(absl::string_view secret, absl::string_view nonce,
                          absl::string_view job_id, uint32_t worker, uint32_t attempt) {
  std::string ctx;
  PutField(&ctx, "pscluster data auth v1");
  PutField(&ctx, nonce);
  PutField(&ctx, job_id);
  PutU32(&ctx, worker);
  PutU32(&ctx, attempt);
  return HmacSha256(secret, ctx);
}

bool SameSecret(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace pscluster
