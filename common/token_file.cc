#include "common/token_file.h"

#include <openssl/sha.h>

#include <cctype>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/atomic_file.h"

namespace pscluster {
namespace {

std::array<unsigned char, 32> Sha256(absl::string_view data) {
  std::array<unsigned char, 32> d;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), d.data());
  return d;
}

bool ParseRole(absl::string_view name, Role* out) {
  for (Role r : AllRoles()) {
    if (RoleName(r) == name) {
      *out = r;
      return true;
    }
  }
  return false;
}

bool ValidIdentityName(absl::string_view name) {
  if (name.empty() || name.size() > 256 || name == "-") return false;
  for (char c : name) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

const std::vector<Role>& AllRoles() {
  static const auto* all = new std::vector<Role>{Role::kAdmin,     Role::kViewer, Role::kNode,
                                                 Role::kScheduler, Role::kWorker, Role::kServer};
  return *all;
}

absl::string_view RoleName(Role r) {
  switch (r) {
    case Role::kAdmin:
      return "admin";
    case Role::kViewer:
      return "viewer";
    case Role::kNode:
      return "node";
    case Role::kScheduler:
      return "scheduler";
    case Role::kWorker:
      return "worker";
    case Role::kServer:
      return "server";
  }
  return "unknown";
}

std::string RoleSetText(RoleSet roles, absl::string_view joiner) {
  std::vector<absl::string_view> names;
  for (Role r : AllRoles()) {
    if (roles & Roles(r)) names.push_back(RoleName(r));
  }
  if (names.empty()) return "none";
  return absl::StrJoin(names, joiner);
}

std::string Sha256Hex(absl::string_view data) {
  auto d = Sha256(data);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

absl::StatusOr<TokenFile> TokenFile::Parse(absl::string_view path, absl::string_view text) {
  TokenFile file;
  absl::flat_hash_set<std::string> names, hashes;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    auto where = [&] { return absl::StrCat(path, ":", line_no, ": "); };
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "expected 3 fields 'SHA256_HEX_OF_TOKEN|- IDENTITY ROLE[,ROLE...]', got ",
          fields.size()));
    }
    Entry e;
    if (fields[0] != "-") {
      std::string hex = absl::AsciiStrToLower(fields[0]);
      bool is_hex = hex.size() == 64;
      for (char c : hex) is_hex = is_hex && std::isxdigit(static_cast<unsigned char>(c));
      if (!is_hex) {
        return absl::InvalidArgumentError(absl::StrCat(
            where(), "the first field must be the SHA-256 of the token (64 hex digits) or '-'"));
      }
      if (!hashes.insert(hex).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), "duplicate token hash (the same token for two identities?)"));
      }
      std::string bytes = absl::HexStringToBytes(hex);
      std::copy(bytes.begin(), bytes.end(), e.digest.begin());
      e.has_token = true;
    }
    if (!ValidIdentityName(fields[1])) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "bad identity '", absl::CHexEscape(fields[1].substr(0, 64)),
                       "': printable, no spaces, at most 256 characters"));
    }
    e.identity.name = std::string(fields[1]);
    if (!names.insert(e.identity.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "duplicate identity '", e.identity.name, "'"));
    }
    for (absl::string_view rn : absl::StrSplit(fields[2], ',', absl::SkipEmpty())) {
      Role r;
      if (!ParseRole(rn, &r)) {
        return absl::InvalidArgumentError(absl::StrCat(where(), "unknown role '",
                                                       absl::CHexEscape(rn.substr(0, 32)),
                                                       "' (known: ", RoleSetText(~0u, ", "), ")"));
      }
      e.identity.roles |= Roles(r);
    }
    if (e.identity.roles == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "no role for '", e.identity.name, "'"));
    }
    file.entries_.push_back(std::move(e));
  }
  return file;
}

absl::StatusOr<TokenFile> TokenFile::Load(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  return Parse(path, *text);
}

const Identity* TokenFile::FindByToken(absl::string_view token) const {
  const auto digest = Sha256(token);
  const absl::string_view want(reinterpret_cast<const char*>(digest.data()), digest.size());
  const Identity* found = nullptr;
  for (const Entry& e : entries_) {
    bool match = ConstantTimeEquals(
        want, absl::string_view(reinterpret_cast<const char*>(e.digest.data()), e.digest.size()));
    if (match && e.has_token && found == nullptr) found = &e.identity;
  }
  return found;
}

const Identity* TokenFile::FindByName(absl::string_view name) const {
  for (const Entry& e : entries_) {
    if (e.identity.name == name) return &e.identity;
  }
  return nullptr;
}

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::string_view token = absl::StripAsciiWhitespace(*text);
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the credential file is empty"));
  }
  for (char c : token) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a token is one line of printable characters without spaces"));
    }
  }
  return std::string(token);
}

}  // namespace pscluster
