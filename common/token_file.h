// Identities and roles of callers, and the token file that maps credentials to them.
//
// A token file (--token_file on every daemon) holds one identity per line:
//
//   # comment
//   <sha256-hex of the token>  <identity>  <role>[,<role>...]
//   -                          <identity>  <role>[,<role>...]
//
// The first field is the SHA-256 of the bearer token, 64 hex digits (`printf %s "$TOKEN" |
// sha256sum`); "-" names an identity that has no token and is known only by its TLS client
// certificate (its subject alternative name or common name). Tokens are never stored, only
// their hashes; a presented token is hashed and compared with every entry in constant time.
// Identities and hashes are unique in a file; errors name the file and line.
//
// Thread-safe: a TokenFile is immutable once parsed.
#ifndef PSCLUSTER_COMMON_TOKEN_FILE_H_
#define PSCLUSTER_COMMON_TOKEN_FILE_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster {

enum class Role : uint32_t {
  kAdmin = 1u << 0,      // submit, cancel, move shards
  kViewer = 1u << 1,     // read-only: jobs, status, nodes, shards
  kNode = 1u << 2,       // servers and workers talking to the scheduler
  kScheduler = 1u << 3,  // the scheduler's calls to servers and workers
  kWorker = 1u << 4,     // a worker's data plane to the servers
  kServer = 1u << 5,     // a server's calls to other servers (replication)
};

// A set of roles, as a bit mask of Role.
using RoleSet = uint32_t;
constexpr RoleSet Roles(Role r) { return static_cast<RoleSet>(r); }
constexpr RoleSet operator|(Role a, Role b) { return Roles(a) | Roles(b); }
constexpr RoleSet operator|(RoleSet a, Role b) { return a | Roles(b); }

// Every role, in the order above.
const std::vector<Role>& AllRoles();
absl::string_view RoleName(Role r);
// "admin or viewer"; "none" for the empty set.
std::string RoleSetText(RoleSet roles, absl::string_view joiner = " or ");

struct Identity {
  std::string name;
  RoleSet roles = 0;
};

// SHA-256 of `data`, as 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view data);

// True when `a` and `b` are equal; takes the same time for any two inputs of the same length.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class TokenFile {
 public:
  // Parses `text`, read from `path` (used in errors as "path:line: ...").
  static absl::StatusOr<TokenFile> Parse(absl::string_view path, absl::string_view text);
  // Reads and parses `path`.
  static absl::StatusOr<TokenFile> Load(const std::string& path);

  // The identity whose token is `token`, or nullptr. Hashes `token` and compares it with every
  // entry (no early exit).
  const Identity* FindByToken(absl::string_view token) const;
  // The identity named `name` (a certificate's identity), or nullptr.
  const Identity* FindByName(absl::string_view name) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    bool has_token = false;
    std::array<unsigned char, 32> digest{};
    Identity identity;
  };
  std::vector<Entry> entries_;
};

// The token in a credential file (--credential_file of a daemon, --token_file of psctl): the
// file's text without surrounding whitespace. INVALID_ARGUMENT naming the file when it is empty
// or holds whitespace inside.
absl::StatusOr<std::string> ReadCredentialFile(const std::string& path);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_TOKEN_FILE_H_
