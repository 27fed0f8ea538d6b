// `psctl up --local` with the real daemons is secured by default: fresh tokens, a throw-away CA
// and a certificate per identity in WORK_DIR/credentials (files 0600, directory 0700); every
// daemon serves mutual TLS (plaintext and certificate-less connections fail), refuses calls
// without a token or certificate (UNAUTHENTICATED) and authorizes a certificate alone as the
// identity it names; later psctl commands against the detached cluster find the admin token and
// certificates by themselves (or the token through $PSCLUSTER_TOKEN_FILE), an explicit
// --token_file wins (given to `up`, its token is admitted as an admin); with --insecure the
// cluster is open and plaintext as before.
#include <sys/stat.h>

#include <fstream>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/channel.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "server/tls_stream.h"
#include "tests/cluster/e2e_cluster.h"

namespace pscluster::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::vector<std::string> UpArgs(const std::string& work, std::vector<std::string> more) {
  std::vector<std::string> args = {"up",
                                   "--local",
                                   "--detach",
                                   "--job=none",
                                   "--work_dir=" + work,
                                   "--scheduler_bin=" + SchedulerBinary(),
                                   "--server_bin=" + ServerBinary(),
                                   "--worker_bin=" + WorkerBinary(),
                                   "--worker_args=--cpu_threads=1"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The address `up --detach` told to export.
std::string SchedulerOf(const std::string& output) {
  std::smatch m;
  std::regex re("export PSCLUSTER_SCHEDULER=([0-9.]+:[0-9]+)");
  return std::regex_search(output, m, re) ? m[1].str() : "";
}

int Mode(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int>(st.st_mode & 0777);
}

// One call of `method` of `Service` at `address` without any token, straight over gRPC (in TLS
// with `channel.tls`).
template <typename Service, typename Req, typename Resp>
grpc::Status CallWithoutToken(const std::string& address, const ChannelOptions& channel,
                              grpc::Status (Service::Stub::*method)(grpc::ClientContext*,
                                                                    const Req&, Resp*),
                              const Req& req = {}) {
  auto ch = MakeChannel(address, channel);
  EXPECT_TRUE(ch.ok()) << ch.status();
  if (!ch.ok()) return grpc::Status(grpc::StatusCode::UNKNOWN, "no channel");
  auto stub = Service::NewStub(*ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  Resp resp;
  return ((*stub).*method)(&ctx, req, &resp);
}

grpc::Status ListJobsWithoutToken(const std::string& scheduler,
                                  const ChannelOptions& channel = {}) {
  return CallWithoutToken<v1::Scheduler>(scheduler, channel, &v1::Scheduler::Stub::ListJobs);
}

grpc::Status ServerStatusWithoutToken(const std::string& server, const ChannelOptions& channel) {
  return CallWithoutToken<v1::ParameterServer>(server, channel,
                                               &v1::ParameterServer::Stub::Status);
}

// The certificate and key of `name` (admin, scheduler, server, worker) with the cluster's CA.
ChannelOptions CertOf(const std::string& creds, const std::string& name) {
  ChannelOptions c;
  c.tls = {creds + "/" + name + ".crt", creds + "/" + name + ".key", creds + "/ca.pem"};
  return c;
}

// Stops the detached cluster in `work` when the test ends, whatever happened.
struct Down {
  std::string work;
  ~Down() { RunCommand(PsctlBinary(), {"down", "--work_dir=" + work}, absl::Seconds(60)); }
};

TEST(E2eUpSecuredTest, ADetachedLocalClusterIsSecuredAndPsctlUsesItsToken) {
  const std::string dir = TestDir("up_secured");
  const std::string work = dir + "/work";
  Down down{work};
  // A token of the user's own, given to `up`, is admitted as an admin too (up's own calls
  // send it: the cluster would not come up otherwise).
  const std::string mine = dir + "/mine.token";
  std::ofstream(mine) << "my-own-token-0123456789abcdef\n";
  // The workers leave their TLS records to OpenSSL (--tls_vector_aes=false); the servers do not.
  CommandResult up = RunCommand(
      PsctlBinary(),
      UpArgs(work, {"--token_file=" + mine,
                    "--worker_args=--cpu_threads=1 --tls_vector_aes=false"}),
      absl::Seconds(90));
  ASSERT_EQ(up.exit_code, 0) << up.output;
  const std::string creds = work + "/credentials";
  EXPECT_THAT(ReadFile(creds + "/tokens").value_or(""), HasSubstr(" psctl-user admin,viewer"));
  EXPECT_THAT(up.output, HasSubstr("secured: every daemon serves mutual TLS under a throw-away "
                                   "CA and authenticates its callers with the tokens and "
                                   "certificates in " + creds));
  EXPECT_THAT(up.output, HasSubstr("export PSCLUSTER_TOKEN_FILE=" + creds + "/admin.token"));
  const std::string scheduler = SchedulerOf(up.output);
  ASSERT_FALSE(scheduler.empty()) << up.output;

  // Only this user can read the tokens.
  EXPECT_EQ(Mode(creds), 0700);
  for (const char* f : {"tokens", "admin.token", "scheduler.token", "server.token",
                        "worker.token", "ca.pem", "admin.crt", "admin.key", "scheduler.crt",
                        "scheduler.key", "server.crt", "server.key", "worker.crt",
                        "worker.key"}) {
    EXPECT_EQ(Mode(creds + "/" + f), 0600) << f;
  }
  // The CA's key is nowhere: no other certificate can be made under it.
  EXPECT_THAT(RunCommand("/bin/ls", {creds}).output, Not(HasSubstr("ca.key")));
  // Every daemon was started with them.
  for (const char* name : {"scheduler", "server-1", "server-2", "worker-1", "worker-2"}) {
    const std::string log = ReadFile(absl::StrCat(work, "/logs/", name, ".log")).value_or("");
    EXPECT_THAT(log, HasSubstr("callers authenticated (bearer tokens and client certificates)"))
        << name;
    EXPECT_THAT(log, Not(HasSubstr("authentication is OFF"))) << name;
  }
  for (const char* name : {"worker-1", "worker-2"}) {
    EXPECT_THAT(ReadFile(absl::StrCat(work, "/logs/", name, ".log")).value_or(""),
                HasSubstr("; TLS data records by OpenSSL (--tls_vector_aes=false"))
        << name;
  }
  if (TlsIo::UsesVectorAes()) {
    EXPECT_THAT(ReadFile(work + "/logs/server-1.log").value_or(""),
                HasSubstr(", TLS records in AES-GCM on the CPU's VAES/VPCLMULQDQ"));
  }

  auto server_port = ReadFile(work + "/ports/server-1.port");
  ASSERT_TRUE(server_port.ok()) << server_port.status();
  const std::string server(absl::StripAsciiWhitespace(*server_port));
  // Plaintext, or TLS without a client certificate: no connection at all.
  EXPECT_EQ(ListJobsWithoutToken(scheduler).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ServerStatusWithoutToken(server, {}).error_code(), grpc::StatusCode::UNAVAILABLE);
  ChannelOptions ca_only;
  ca_only.tls.ca = creds + "/ca.pem";
  EXPECT_EQ(ListJobsWithoutToken(scheduler, ca_only).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ServerStatusWithoutToken(server, ca_only).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A certificate alone authenticates as the identity it names, with that identity's roles.
  EXPECT_TRUE(ListJobsWithoutToken(scheduler, CertOf(creds, "admin")).ok());
  grpc::Status as_worker_cert = ListJobsWithoutToken(scheduler, CertOf(creds, "worker"));
  EXPECT_EQ(as_worker_cert.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(as_worker_cert.error_message(), HasSubstr("needs role"));
  grpc::Status as_worker_on_server = ServerStatusWithoutToken(server, CertOf(creds, "worker"));
  EXPECT_TRUE(as_worker_on_server.ok())
      << as_worker_on_server.error_code() << ": " << as_worker_on_server.error_message();
  // A worker's certificate cannot drop a job on a server (role scheduler).
  v1::DropJobRequest drop;
  drop.set_job_id("job-1");
  grpc::Status dropped = CallWithoutToken<v1::ParameterServer>(
      server, CertOf(creds, "worker"), &v1::ParameterServer::Stub::DropJob, drop);
  EXPECT_EQ(dropped.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(dropped.error_message(), HasSubstr("needs role scheduler"));
  // psctl without the cluster's work directory has neither its certificates nor its token.
  CommandResult anonymous = RunCommand(PsctlBinary(), {"--scheduler=" + scheduler, "jobs"});
  EXPECT_EQ(anonymous.exit_code, 1) << anonymous.output;
  // Its CA alone gets no further.
  CommandResult ca_alone = RunCommand(
      PsctlBinary(), {"--scheduler=" + scheduler, "--tls_ca=" + creds + "/ca.pem", "jobs"});
  EXPECT_EQ(ca_alone.exit_code, 1) << ca_alone.output;

  // With it, psctl finds the admin token by itself: nodes, submit, status, jobs, cancel.
  const std::vector<std::string> base = {"--scheduler=" + scheduler, "--work_dir=" + work};
  auto psctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), base.begin(), base.end());
    return RunCommand(PsctlBinary(), args, absl::Seconds(60));
  };
  CommandResult nodes = psctl({"nodes"});
  ASSERT_EQ(nodes.exit_code, 0) << nodes.output;
  EXPECT_THAT(nodes.output, HasSubstr("alive"));
  const std::string job = dir + "/job.yaml";
  std::ofstream(job) << FashionJobYaml("secured-up", 1, "", 32);
  CommandResult submit = psctl({"submit", job});
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  EXPECT_THAT(submit.output, HasSubstr("job-1"));
  CommandResult status = psctl({"status", "job-1"});
  EXPECT_EQ(status.exit_code, 0) << status.output;
  CommandResult as_me = psctl({"--token_file=" + mine, "status", "job-1"});
  EXPECT_EQ(as_me.exit_code, 0) << as_me.output;
  EXPECT_THAT(psctl({"jobs"}).output, HasSubstr("secured-up"));
  // An explicit --token_file wins: the workers' token may not cancel a job.
  CommandResult as_worker =
      psctl({"--token_file=" + creds + "/worker.token", "cancel", "job-1"});
  EXPECT_EQ(as_worker.exit_code, 1) << as_worker.output;
  EXPECT_THAT(as_worker.output, HasSubstr("needs role admin"));
  // $PSCLUSTER_TOKEN_FILE, as `up` said to export, works from anywhere with the certificates.
  EXPECT_THAT(up.output, HasSubstr("--tls_ca=" + creds + "/ca.pem --tls_cert=" + creds +
                                   "/admin.crt --tls_key=" + creds + "/admin.key"));
  CommandResult by_env = RunCommand(
      "/usr/bin/env",
      {"PSCLUSTER_TOKEN_FILE=" + creds + "/admin.token", PsctlBinary(),
       "--scheduler=" + scheduler, "--tls_ca=" + creds + "/ca.pem",
       "--tls_cert=" + creds + "/admin.crt", "--tls_key=" + creds + "/admin.key", "cancel",
       "job-1"});
  EXPECT_EQ(by_env.exit_code, 0) << by_env.output;

  CommandResult stopped = RunCommand(PsctlBinary(), {"down", "--work_dir=" + work},
                                     absl::Seconds(60));
  EXPECT_EQ(stopped.exit_code, 0) << stopped.output;
  EXPECT_THAT(stopped.output, HasSubstr("local cluster stopped (5 processes)"));
}

TEST(E2eUpSecuredTest, InsecureKeepsTheClusterOpen) {
  const std::string dir = TestDir("up_insecure");
  const std::string work = dir + "/work";
  Down down{work};
  CommandResult up = RunCommand(PsctlBinary(), UpArgs(work, {"--insecure"}), absl::Seconds(90));
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_THAT(up.output, HasSubstr("insecure: every daemon accepts every call"));
  EXPECT_THAT(up.output, Not(HasSubstr("PSCLUSTER_TOKEN_FILE")));
  const std::string scheduler = SchedulerOf(up.output);
  ASSERT_FALSE(scheduler.empty()) << up.output;
  EXPECT_TRUE(ListJobsWithoutToken(scheduler).ok());
  CommandResult jobs = RunCommand(PsctlBinary(), {"--scheduler=" + scheduler, "nodes"});
  EXPECT_EQ(jobs.exit_code, 0) << jobs.output;
}

// `up` makes its own CA and certificates: --tls_* flags given to it are refused, not ignored.
TEST(E2eUpSecuredTest, UpRefusesTlsFlags) {
  const std::string work = TestDir("up_tls_flags") + "/work";
  CommandResult up = RunCommand(PsctlBinary(), UpArgs(work, {"--tls_ca=/etc/ssl/ca.pem"}),
                                absl::Seconds(60));
  EXPECT_EQ(up.exit_code, 1) << up.output;
  EXPECT_THAT(up.output, HasSubstr("psctl up --local makes its own CA and certificates"));
  EXPECT_THAT(up.output, Not(HasSubstr("started scheduler")));
}

}  // namespace
}  // namespace pscluster::testing
