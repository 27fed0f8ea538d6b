#include "common/data_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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

std::string GrpcDataAuthValue(const DataAuth& auth) {
  if (auth.secret.empty()) return "";
  return absl::StrCat(auth.worker, ":", auth.attempt, ":",
                      absl::BytesToHexString(DataAuthProof(auth.secret, kGrpcDataNonce,
                                                           auth.job_id, auth.worker,
                                                           auth.attempt)));
}

absl::StatusOr<GrpcDataClaim> ParseGrpcDataAuth(absl::string_view value) {
  std::vector<absl::string_view> parts = absl::StrSplit(value, ':');
  GrpcDataClaim c;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &c.worker) ||
      !absl::SimpleAtoi(parts[1], &c.attempt) || parts[2].size() != 2 * kDataProofBytes ||
      parts[2].find_first_not_of("0123456789abcdefABCDEF") != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(kGrpcDataAuthKey, " metadata: expected WORKER:ATTEMPT:PROOF (",
                     2 * kDataProofBytes, " hex digits)"));
  }
  c.proof = absl::HexStringToBytes(parts[2]);
  return c;
}

bool SameSecret(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace pscluster
