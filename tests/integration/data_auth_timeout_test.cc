// --data_auth_timeout against a real ps_server process: data connections that connect and stay
// silent (plaintext TCP, the Unix socket, TLS without a ClientHello), or send only part of a
// handshake or of their auth frame, are closed by the server with the reason in its log, while
// a real client's push-pull rounds go on meanwhile; bad values of the flag are refused.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "scheduler/psctl/subprocess.h"
#include "server/client/ps_client.h"
#include "server/tcp_frame.h"
#include "server/tls_stream.h"
#include "tests/integration/test_certs.h"
#include "tests/integration/tls_hello.h"
#include "worker/standalone.h"

namespace pscluster {
namespace {

constexpr int kSize = 20000;

class DataAuthTimeoutTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(::pscluster::testing::MakeTestCerts());
  }
  static std::string Cert(const std::string& name) { return *certs_ + "/" + name; }
  static TlsFiles ClientFiles() { return {Cert("client.pem"), Cert("client.key"), Cert("ca.pem")}; }

  // A ps_server with mutual TLS and --data_auth_timeout=`timeout` (StartServer).
  std::string StartTlsServer(const std::string& name, const std::string& timeout) {
    return StartServer(name, {"--data_auth_timeout=" + timeout,
                              "--tls_cert=" + Cert("server.pem"),
                              "--tls_key=" + Cert("server.key"), "--tls_ca=" + Cert("ca.pem")});
  }

  // Starts ps_server with `flags` (log in `name`.log); its gRPC address, or "" if it did not
  // come up.
  std::string StartServer(const std::string& name, std::vector<std::string> flags) {
    const std::string dir = std::getenv("TEST_TMPDIR");
    log_ = dir + "/" + name + ".log";
    psctl::SpawnOptions so;
    so.binary = std::string(std::getenv("TEST_SRCDIR")) + "/pscluster/server/ps_server";
    so.args = {"--listen=127.0.0.1:0", "--port_file=" + dir + "/" + name + ".port",
               "--log_level=info"};
    so.args.insert(so.args.end(), flags.begin(), flags.end());
    so.log_file = log_;
    auto server = psctl::Subprocess::Spawn(so);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "";
    server_ = std::move(*server);
    for (int i = 0; i < 1200; ++i) {
      auto text = ReadFile(dir + "/" + name + ".port");
      if (text.ok() && !absl::StripAsciiWhitespace(*text).empty()) {
        return std::string(absl::StripAsciiWhitespace(*text));
      }
      if (server_->Poll().has_value()) break;
      absl::SleepFor(absl::Milliseconds(25));
    }
    ADD_FAILURE() << "ps_server did not start: " << Log();
    return "";
  }

  std::string Log() const {
    auto text = ReadFile(log_);
    return text.ok() ? *text : "";
  }

  void TearDown() override {
    if (server_ != nullptr) {
      EXPECT_FALSE(server_->Poll().has_value()) << "ps_server died: " << Log();
      server_->Terminate(absl::Seconds(5));
    }
  }

  // A client of job "job" (table "w", ASP) whose rounds go over the server's TCP data port.
  static std::unique_ptr<PsClient> ClientOf(const std::string& address, const TlsFiles& tls) {
    v1::TableSpec table;
    table.set_name("w");
    table.set_kind(v1::DENSE);
    table.mutable_shape()->add_dims(kSize);
    table.mutable_optimizer()->set_learning_rate(0.1f);
    PsClientOptions o;
    o.job_id = "job";
    o.call_timeout = absl::Seconds(20);
    o.channel.tls = tls;
    o.data_transport = DataTransport::kTcp;
    auto map = worker::RoundRobinShardMap("job", {address}, 4);
    EXPECT_TRUE(map.ok()) << map.status();
    if (!map.ok()) return nullptr;
    auto client = PsClient::Create(o, *map, {table});
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    absl::Status st = (*client)->InstallShardMap();
    v1::ConsistencySpec asp;
    asp.set_mode(v1::ConsistencySpec::ASP);
    if (st.ok()) st = (*client)->CreateTables(asp, 1);
    EXPECT_TRUE(st.ok()) << st;
    return st.ok() ? std::move(*client) : nullptr;
  }

  // Push-pull rounds of gradient 1 from step `from`: SGD moves every value by -0.1 a round.
  static void Rounds(PsClient* client, int from, int n) {
    std::vector<float> g(kSize, 1.0f), v(kSize);
    for (int step = from; step < from + n; ++step) {
      absl::Status st = client->PushPull(step, {{{"w", g.data()}}, {}}, {{{"w", v.data()}}, {}});
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_NEAR(v[123], -0.1f * static_cast<float>(step + 1), 1e-4f);
    }
  }

  static int DataPort(PsClient* client) {
    auto statuses = client->ServerStatuses();
    EXPECT_TRUE(statuses.ok()) << statuses.status();
    return statuses.ok() ? static_cast<int>((*statuses)[0].data_port()) : 0;
  }

  // A raw connection with a 20 s receive timeout (a bound for the test, not a timing claim).
  static int Dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << std::strerror(errno);
    timeval tv{20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }
  static int DialUnix(const std::string& name) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path + 1, name.data(), name.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), len), 0) << std::strerror(errno);
    timeval tv{20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
  }

  // Reads until the server ends the connection: true when it did (end of stream or a reset),
  // false when the 20 s receive timeout passed first.
  static bool ClosedByServer(int fd) {
    char sink[4096];
    while (true) {
      const ssize_t r = recv(fd, sink, sizeof(sink), 0);
      if (r > 0) continue;  // The challenge, a status frame, an alert.
      if (r < 0 && errno == EINTR) continue;
      return r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
    }
  }

  // Whether the server still holds the connection open (nothing but a challenge came, no end).
  static bool StillOpen(int fd) {
    char sink[4096];
    while (true) {
      const ssize_t r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
      if (r > 0) continue;
      return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }

  static int Count(const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  }

  static std::string* certs_;
  std::unique_ptr<psctl::Subprocess> server_;
  std::string log_;
};

std::string* DataAuthTimeoutTest::certs_ = nullptr;

TEST_F(DataAuthTimeoutTest, SilentPlaintextConnectionsAreClosedAndOthersKeepTraining) {
  const std::string address = StartServer("plain", {"--data_auth_timeout=1s"});
  ASSERT_FALSE(address.empty());
  auto client = ClientOf(address, {});
  ASSERT_NE(client, nullptr);
  const int port = DataPort(client.get());
  ASSERT_GT(port, 0);
  auto statuses = client->ServerStatuses();
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  const std::string unix_name = (*statuses)[0].data_unix();
  ASSERT_FALSE(unix_name.empty()) << "the server offers its Unix data socket";

  // Connects and sends nothing; sends half an auth frame's header; sends a header announcing a
  // body that never comes; a silent Unix connection.
  std::vector<int> idle = {Dial(port), Dial(port), Dial(port), DialUnix(unix_name)};
  const std::string auth = AuthFrame("job", 0, 0, "");
  ASSERT_EQ(send(idle[1], auth.data(), 8, MSG_NOSIGNAL), 8);
  ASSERT_EQ(send(idle[2], auth.data(), kFrameHeaderBytes + 2, MSG_NOSIGNAL),
            static_cast<ssize_t>(kFrameHeaderBytes + 2));
  // The real client trains while they are open.
  Rounds(client.get(), 0, 5);
  for (size_t i = 0; i < idle.size(); ++i) {
    EXPECT_TRUE(ClosedByServer(idle[i])) << "connection " << i << " still open after 20 s";
    close(idle[i]);
  }
  Rounds(client.get(), 5, 3);
  const std::string log = Log();
  EXPECT_GE(Count(log, "no auth frame within 1s (--data_auth_timeout); closing it"), 2) << log;
  EXPECT_GE(Count(log, "an incomplete auth frame ("), 2) << log;
  EXPECT_TRUE(absl::StrContains(log, "unix peer pid")) << log;
}

TEST_F(DataAuthTimeoutTest, TlsConnectionsWithoutAFinishedHandshakeAreClosed) {
  const std::string address = StartTlsServer("tls", "1s");
  ASSERT_FALSE(address.empty());
  auto client = ClientOf(address, ClientFiles());
  ASSERT_NE(client, nullptr);
  const int port = DataPort(client.get());
  ASSERT_GT(port, 0);

  const std::string hello = ::pscluster::testing::TlsClientHello();
  ASSERT_GT(hello.size(), 100u);
  // No ClientHello at all; the first half of one.
  std::vector<int> idle = {Dial(port), Dial(port)};
  ASSERT_EQ(send(idle[1], hello.data(), hello.size() / 2, MSG_NOSIGNAL),
            static_cast<ssize_t>(hello.size() / 2));
  Rounds(client.get(), 0, 5);
  for (size_t i = 0; i < idle.size(); ++i) {
    EXPECT_TRUE(ClosedByServer(idle[i])) << "connection " << i << " still open after 20 s";
    close(idle[i]);
  }
  Rounds(client.get(), 5, 3);
  const std::string log = Log();
  EXPECT_GE(Count(log, "TLS handshake: no answer in time"), 2) << log;
  EXPECT_GE(Count(log, "(not done within 1s, --data_auth_timeout); closing it"), 2) << log;
}

// --tls_vector_aes=false: the server's records go through OpenSSL (its log says which), and a
// client sealing with the vector instructions trains against it; the default says the other.
TEST_F(DataAuthTimeoutTest, TheRecordCipherFlagChoosesOpenSslAndBothEndsAgree) {
  const std::string address =
      StartServer("openssl", {"--tls_vector_aes=false", "--tls_cert=" + Cert("server.pem"),
                              "--tls_key=" + Cert("server.key"), "--tls_ca=" + Cert("ca.pem")});
  ASSERT_FALSE(address.empty());
  EXPECT_TRUE(absl::StrContains(Log(), ", TLS records by OpenSSL (--tls_vector_aes=false"))
      << Log();
  auto client = ClientOf(address, ClientFiles());
  ASSERT_NE(client, nullptr);
  Rounds(client.get(), 0, 5);
}

TEST_F(DataAuthTimeoutTest, TheDefaultRecordCipherIsNamedInTheLog) {
  const std::string address = StartTlsServer("vector", "30s");
  ASSERT_FALSE(address.empty());
  EXPECT_TRUE(absl::StrContains(Log(), TlsIo::UsesVectorAes()
                                           ? ", TLS records in AES-GCM on the CPU's VAES"
                                           : ", TLS records by OpenSSL"))
      << Log();
}

// With a long timeout the slow connections are certainly still open while the client trains:
// each connection has its own threads, a silent one holds up nobody.
TEST_F(DataAuthTimeoutTest, SilentConnectionsDoNotHoldUpOtherClients) {
  const std::string address = StartTlsServer("slow", "10m");
  ASSERT_FALSE(address.empty());
  auto client = ClientOf(address, ClientFiles());
  ASSERT_NE(client, nullptr);
  const int port = DataPort(client.get());
  ASSERT_GT(port, 0);
  const std::string hello = ::pscluster::testing::TlsClientHello();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(Dial(port));
    if (i % 2 == 1) {
      ASSERT_EQ(send(idle.back(), hello.data(), hello.size() / 2, MSG_NOSIGNAL),
                static_cast<ssize_t>(hello.size() / 2));
    }
  }
  Rounds(client.get(), 0, 5);
  auto second = ClientOf(address, ClientFiles());
  ASSERT_NE(second, nullptr);
  for (size_t i = 0; i < idle.size(); ++i) {
    EXPECT_TRUE(StillOpen(idle[i])) << "connection " << i;
    close(idle[i]);
  }
}

TEST_F(DataAuthTimeoutTest, BadValuesAreRefusedNamingTheFlag) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  for (const std::string value : {"0", "-5s", "25h"}) {
    psctl::SpawnOptions so;
    so.binary = std::string(std::getenv("TEST_SRCDIR")) + "/pscluster/server/ps_server";
    so.args = {"--listen=127.0.0.1:0", "--data_auth_timeout=" + value};
    so.log_file = dir + "/bad.log";
    auto server = psctl::Subprocess::Spawn(so);
    ASSERT_TRUE(server.ok()) << server.status();
    std::optional<int> code;
    for (int i = 0; i < 1200 && !code.has_value(); ++i) {
      code = (*server)->Poll();
      if (!code.has_value()) absl::SleepFor(absl::Milliseconds(25));
    }
    ASSERT_TRUE(code.has_value()) << value << ": ps_server did not exit";
    EXPECT_EQ(*code, 2) << value;
    auto log = ReadFile(dir + "/bad.log");
    ASSERT_TRUE(log.ok());
    EXPECT_TRUE(absl::StrContains(*log, "--data_auth_timeout: must be more than 0 and at most 24h"))
        << *log;
  }
}

}  // namespace
}  // namespace pscluster
