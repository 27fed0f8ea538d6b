#include "common/token_file.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

std::string Line(absl::string_view token, absl::string_view id, absl::string_view roles) {
  return std::string(token.empty() ? "-" : Sha256Hex(token)) + " " + std::string(id) + " " +
         std::string(roles) + "\n";
}

TEST(Sha256HexTest, MatchesTheStandardVectors) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(ConstantTimeEqualsTest, ComparesEveryByte) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret-token", "secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-tokeN"));
  EXPECT_FALSE(ConstantTimeEquals("Secret-token", "secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret-token"));
  std::string a(1000, 'x'), b(1000, 'x');
  b[999] = 'y';
  EXPECT_FALSE(ConstantTimeEquals(a, b));
  b[999] = 'x';
  b[0] = '\0';
  EXPECT_FALSE(ConstantTimeEquals(a, b));
}

TEST(TokenFileTest, FindsIdentitiesByTokenAndByName) {
  std::string text = "# the cluster's identities\n\n" + Line("tok-admin", "alice", "admin,viewer") +
                     "  " + Line("tok-sched", "scheduler", "scheduler") +
                     Line("", "worker-1.example", "worker,node");
  auto f = TokenFile::Parse("tokens", text);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 3u);
  const Identity* a = f->FindByToken("tok-admin");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->name, "alice");
  EXPECT_EQ(a->roles, Role::kAdmin | Role::kViewer);
  EXPECT_EQ(f->FindByToken("tok-sched")->name, "scheduler");
  EXPECT_EQ(f->FindByToken("tok-admin2"), nullptr);
  EXPECT_EQ(f->FindByToken(""), nullptr);
  // A certificate-only identity has no token; "-" is not one.
  EXPECT_EQ(f->FindByToken("-"), nullptr);
  const Identity* w = f->FindByName("worker-1.example");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->roles, Role::kWorker | Role::kNode);
  EXPECT_EQ(f->FindByName("nobody"), nullptr);
}

TEST(TokenFileTest, AcceptsUpperCaseHashes) {
  std::string hex = Sha256Hex("t");
  for (char& c : hex) c = static_cast<char>(std::toupper(c));
  auto f = TokenFile::Parse("tokens", hex + "\tbob\tviewer\n");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->FindByToken("t")->name, "bob");
}

TEST(TokenFileTest, BadLinesAreNamedByFileAndLine) {
  struct Case {
    std::string text;
    std::string message;
  } cases[] = {
      {"# ok\n" + Line("a", "alice", "admin") + "oops\n", "tokens.txt:3: expected 3 fields"},
      {"abc alice admin\n", "tokens.txt:1: the first field must be the SHA-256"},
      {std::string(64, 'g') + " alice admin\n", "tokens.txt:1: the first field"},
      {Line("a", "alice", "root"), "tokens.txt:1: unknown role 'root'"},
      {Line("a", "alice", ","), "tokens.txt:1: no role for 'alice'"},
      {Line("a", "alice", "admin") + Line("b", "alice", "viewer"),
       "tokens.txt:2: duplicate identity 'alice'"},
      {Line("a", "alice", "admin") + "\n" + Line("a", "bob", "viewer"),
       "tokens.txt:3: duplicate token hash"},
      {Line("a", "-", "admin"), "tokens.txt:1: bad identity"},
      {Line("a", "alice", "admin viewer"), "tokens.txt:1: expected 3 fields"},
  };
  for (const Case& c : cases) {
    auto f = TokenFile::Parse("tokens.txt", c.text);
    ASSERT_FALSE(f.ok()) << c.text;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(c.message)) << c.text;
  }
}

TEST(TokenFileTest, LoadNamesAMissingFile) {
  auto f = TokenFile::Load("/nonexistent/tokens");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("/nonexistent/tokens"));
}

TEST(ReadCredentialFileTest, StripsTheNewlineAndRefusesEmptyFiles) {
  std::string dir = ::testing::TempDir();
  std::string good = dir + "/good.token", empty = dir + "/empty.token", spaced = dir + "/sp";
  std::ofstream(good) << "  s3cret-token\n";
  std::ofstream(empty) << "\n";
  std::ofstream(spaced) << "two words\n";
  auto t = ReadCredentialFile(good);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "s3cret-token");
  EXPECT_EQ(ReadCredentialFile(empty).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ReadCredentialFile(empty).status().message()), HasSubstr(empty));
  EXPECT_EQ(ReadCredentialFile(spaced).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadCredentialFile(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(RoleSetTextTest, NamesRolesInOrder) {
  EXPECT_EQ(RoleSetText(Role::kViewer | Role::kAdmin), "admin or viewer");
  EXPECT_EQ(RoleSetText(0), "none");
  EXPECT_EQ(RoleSetText(Roles(Role::kServer), ","), "server");
}

}  // namespace
}  // namespace pscluster
