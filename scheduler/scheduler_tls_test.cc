// The scheduler serves TLS when given a certificate, and psctl's client reaches it with the CA;
// a plaintext client is refused. Certificates are made at test time with the openssl CLI.
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/psctl/client.h"
#include "scheduler/scheduler_daemon.h"
#include "common/testing/status_matchers.h"

namespace pscluster::scheduler {
namespace {

using ::pscluster::testing::IsOk;
using ::pscluster::testing::StatusIs;
using ::testing::HasSubstr;

TEST(SchedulerTlsTest, ServesTlsAndRefusesPlaintext) {
  std::string dir = std::getenv("TEST_TMPDIR");
  std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ",
      key, " -out ", cert, " >/dev/null 2>&1");
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl CLI not available";

  SchedulerDaemonOptions o;
  o.listen_address = "127.0.0.1:0";
  o.db_path = dir + "/tls.db";
  o.db_full_sync = false;
  o.tls.cert = cert;
  o.tls.key = key;
  auto d = SchedulerDaemon::Start(o);
  ASSERT_THAT(d, IsOk());

  psctl::ClientOptions good;
  good.address = (*d)->address();
  good.timeout = absl::Seconds(5);
  good.channel.tls.ca = cert;
  auto client = psctl::SchedulerClient::Connect(good);
  ASSERT_THAT(client, IsOk());
  EXPECT_THAT((*client)->ListJobs(true), IsOk());

  psctl::ClientOptions plain = good;
  plain.channel.tls.ca.clear();
  plain.timeout = absl::Seconds(1);
  auto plain_client = psctl::SchedulerClient::Connect(plain);
  ASSERT_THAT(plain_client, IsOk());
  EXPECT_THAT((*plain_client)->ListJobs(true),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr((*d)->address())));

  o.tls.key = dir + "/missing-key.pem";
  o.db_path = dir + "/tls2.db";
  EXPECT_THAT(SchedulerDaemon::Start(o), StatusIs(absl::StatusCode::kNotFound,
                                                  HasSubstr("missing-key.pem")));
}

}  // namespace
}  // namespace pscluster::scheduler
