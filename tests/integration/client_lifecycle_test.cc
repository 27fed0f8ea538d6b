// Data-plane clients created, used and dropped one after another (as a worker does per task, and
// the training benchmark per run) in a process with no gRPC server of its own, against a real
// ps_server process. gRPC 1.51 corrupted the heap in exactly this pattern until MakeChannel
// anchored its shared callback queue (common/channel.cc).
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "scheduler/psctl/subprocess.h"
#include "server/client/ps_client.h"
#include "worker/standalone.h"

namespace pscluster {
namespace {

TEST(ClientLifecycleTest, ClientsComeAndGoAgainstARealServer) {
  std::string dir = std::getenv("TEST_TMPDIR");
  psctl::SpawnOptions so;
  so.binary = std::string(std::getenv("TEST_SRCDIR")) + "/pscluster/server/ps_server";
  so.args = {"--listen=127.0.0.1:0", "--port_file=" + dir + "/port", "--log_level=warn"};
  so.log_file = dir + "/server.log";
  auto server = psctl::Subprocess::Spawn(so);
  ASSERT_TRUE(server.ok()) << server.status();
  std::string address;
  for (int i = 0; i < 400 && address.empty(); ++i) {
    auto text = ReadFile(dir + "/port");
    if (text.ok()) address = std::string(absl::StripAsciiWhitespace(*text));
    if (address.empty()) absl::SleepFor(absl::Milliseconds(25));
  }
  ASSERT_FALSE(address.empty()) << "ps_server did not start";

  v1::TableSpec table;
  table.set_name("w");
  table.set_kind(v1::DENSE);
  table.mutable_shape()->add_dims(1000);
  table.mutable_optimizer()->set_learning_rate(0.1f);
  auto rounds = [&](int worker, int n) {
    for (int i = 0; i < n; ++i) {
      std::string job = absl::StrCat("job-", worker, "-", i);
      PsClientOptions o;
      o.job_id = job;
      o.call_timeout = absl::Seconds(20);
      auto map = worker::RoundRobinShardMap(job, {address}, 4);
      ASSERT_TRUE(map.ok());
      auto client = PsClient::Create(o, *map, {table});
      ASSERT_TRUE(client.ok()) << client.status();
      ASSERT_TRUE((*client)->InstallShardMap().ok());
      v1::ConsistencySpec asp;
      asp.set_mode(v1::ConsistencySpec::ASP);
      ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
      std::vector<float> w(1000), g(1000, 1.0f);
      for (int step = 0; step < 3; ++step) {
        ASSERT_TRUE((*client)->Pull(step, {{{"w", w.data()}}, {}}).ok());
        ASSERT_TRUE((*client)->Push(step, {{{"w", g.data()}}, {}}).ok());
      }
      ASSERT_TRUE((*client)->Pull(3, {{{"w", w.data()}}, {}}).ok());
      EXPECT_NEAR(w[7], -0.3f, 1e-5f);  // Three SGD steps of 0.1 * 1 from zeros.
      ASSERT_TRUE((*client)->DropJob().ok());
    }
  };
  std::thread other(rounds, 1, 30);
  rounds(0, 30);
  other.join();
  EXPECT_FALSE((*server)->Poll().has_value()) << "ps_server died";
  (*server)->Terminate(absl::Seconds(5));
}

}  // namespace
}  // namespace pscluster
