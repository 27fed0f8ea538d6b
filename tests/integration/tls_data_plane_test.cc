// The TCP data plane in TLS (server/tls_stream.h): a server with --tls_cert/--tls_key/--tls_ca
// serves its data port in mutual TLS; rounds give the same values as over plaintext; clients
// with a certificate of another CA, plaintext clients, TLS clients of a plaintext port and
// truncated or garbage handshakes are refused with the reason while the server keeps serving.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <sstream>
#include <mutex>
#include <thread>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/logging.h"
#include "spdlog/sinks/ostream_sink.h"
#include "server/client/tcp_conn.h"
#include "server/testing/cluster.h"
#include "server/tls_stream.h"
#include "tests/integration/test_certs.h"
#include "tests/integration/tls_hello.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

const v1::OptimizerSpec kAdam = Optimizer(v1::OptimizerSpec::ADAM, 0.01f);

class TlsDataPlaneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTestCerts());
  }
  static std::string File(const std::string& name) { return *dir_ + "/" + name; }

  // A server in mutual TLS (its data port too), without the Unix socket: only TCP is offered.
  static PsServerOptions TlsServer() {
    PsServerOptions so;
    so.tls = {File("server.pem"), File("server.key"), File("ca.pem")};
    so.data_unix = false;
    return so;
  }
  static TlsFiles ClientFiles() { return {File("client.pem"), File("client.key"), File("ca.pem")}; }

  // A client of job "job" with table "w" (ASP, one worker).
  static std::unique_ptr<PsClient> ClientOf(InProcessCluster& cluster, const TlsFiles& tls,
                                            DataTransport transport) {
    PsClientOptions o;
    o.channel.tls = tls;
    o.data_transport = transport;
    auto client = cluster.Client("job", {DenseSpec("w", {kSize}, kAdam, 1000)}, 0, o);
    if (!client.ok()) {
      ADD_FAILURE() << client.status();
      return nullptr;
    }
    v1::ConsistencySpec asp;
    asp.set_mode(v1::ConsistencySpec::ASP);
    absl::Status st = (*client)->CreateTables(asp, 1);
    if (!st.ok()) {
      ADD_FAILURE() << st;
      return nullptr;
    }
    return std::move(*client);
  }

  // Rounds of push-pull with fixed gradients; the values pulled after each.
  static std::vector<std::vector<float>> Train(PsClient* client) {
    std::vector<std::vector<float>> seen;
    std::vector<float> g(kSize), v(kSize);
    for (int round = 0; round < 5; ++round) {
      for (int i = 0; i < kSize; ++i) g[i] = 0.001f * static_cast<float>((i * 7 + round) % 101);
      absl::Status st = client->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", v.data()}}, {}});
      EXPECT_TRUE(st.ok()) << st;
      seen.push_back(v);
    }
    return seen;
  }

  // A raw TCP connection to the local `port`.
  static int Dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  }

  // A TLS data connection to server 0 of `cluster` with `tls`.
  static absl::StatusOr<std::shared_ptr<TcpConn>> OpenTls(InProcessCluster& cluster,
                                                          const TlsFiles& tls) {
    auto ctx = TlsContext::ForClient(tls, "");
    if (!ctx.ok()) return ctx.status();
    return TcpConn::Open("127.0.0.1", cluster.server(0)->data_port(), "server-0",
                         absl::Seconds(5), BufferPool::Create(), absl::ZeroDuration(), {},
                         ctx->get());
  }

  // Waits up to 10 s for `counter` (a server's refusal count, bumped by its connection's thread)
  // to reach `want`; returns what it reached.
  static uint64_t AwaitCount(const std::atomic<uint64_t>& counter, uint64_t want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (counter.load() < want && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    return counter.load();
  }

  static constexpr int kSize = 300000;  // Chunks of 1000 floats: many frames per round.
  static std::string* dir_;
};

std::string* TlsDataPlaneTest::dir_ = nullptr;

TEST_F(TlsDataPlaneTest, MutualTlsGivesTheValuesOfPlaintextOverTheDataPort) {
  InProcessCluster plain(1);
  InProcessCluster tls(1, TlsServer());
  ASSERT_TRUE(plain.status().ok()) << plain.status();
  ASSERT_TRUE(tls.status().ok()) << tls.status();
  ASSERT_GT(tls.server(0)->data_port(), 0) << "the data port is open under TLS";
  auto a = ClientOf(plain, {}, DataTransport::kTcp);
  auto b = ClientOf(tls, ClientFiles(), DataTransport::kTcp);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto want = Train(a.get());
  const auto got = Train(b.get());
  ASSERT_EQ(want.size(), got.size());
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(std::memcmp(want[r].data(), got[r].data(), kSize * sizeof(float)), 0)
        << "round " << r;
  }
  EXPECT_EQ(tls.server(0)->data_connections(), 1);
  EXPECT_EQ(tls.server(0)->data_unix_connections(), 0);
}

TEST_F(TlsDataPlaneTest, WorkerOfATlsClusterUsesTheTcpDataPlaneByDefault) {
  InProcessCluster tls(1, TlsServer());
  ASSERT_TRUE(tls.status().ok()) << tls.status();
  auto client = ClientOf(tls, ClientFiles(), DataTransport::kAuto);
  ASSERT_NE(client, nullptr);
  Train(client.get());
  // The rounds went over the data port, not over gRPC PushPull.
  EXPECT_EQ(tls.server(0)->data_connections(), 1);
}

TEST_F(TlsDataPlaneTest, ClientOfAnotherCaIsRefusedAndTheServerKeepsServing) {
  InProcessCluster tls(1, TlsServer());
  ASSERT_TRUE(tls.status().ok()) << tls.status();
  auto good = ClientOf(tls, ClientFiles(), DataTransport::kTcp);
  ASSERT_NE(good, nullptr);
  Train(good.get());

  // A client certificate the server's CA did not sign.
  auto other = OpenTls(tls, {File("other-client.pem"), File("other-client.key"), File("ca.pem")});
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(absl::StrContains(other.status().message(), "server-0")) << other.status();
  EXPECT_TRUE(absl::StrContains(other.status().message(), "unknown ca")) << other.status();
  // A client that does not trust the server's certificate.
  auto distrust = OpenTls(tls, {File("client.pem"), File("client.key"), File("other-ca.pem")});
  ASSERT_FALSE(distrust.ok());
  EXPECT_TRUE(absl::StrContains(distrust.status().message(), "certificate verify failed"))
      << distrust.status();
  // No client certificate at all.
  auto anonymous = OpenTls(tls, {"", "", File("ca.pem")});
  ASSERT_FALSE(anonymous.ok());
  EXPECT_TRUE(absl::StrContains(anonymous.status().message(), "certificate required"))
      << anonymous.status();
  // Three failed handshakes, counted (pscluster_server_data_connections_refused_total).
  const TcpDataServer::Refusals* refused = tls.server(0)->data_refusals();
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(AwaitCount(refused->tls_handshake, 3), 3u);
  EXPECT_EQ(refused->tls_record.load(), 0u);

  Train(good.get());
  auto again = OpenTls(tls, ClientFiles());
  EXPECT_TRUE(again.ok()) << again.status();
  if (again.ok()) (*again)->Shutdown(absl::Seconds(1));
}

TEST_F(TlsDataPlaneTest, PlaintextAndTlsDoNotMix) {
  InProcessCluster plain(1);
  InProcessCluster tls(1, TlsServer());
  ASSERT_TRUE(plain.status().ok()) << plain.status();
  ASSERT_TRUE(tls.status().ok()) << tls.status();
  // A TLS client on a plaintext port: the server's challenge is no TLS record.
  auto ctx = TlsContext::ForClient(ClientFiles(), "");
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto to_plain = TcpConn::Open("127.0.0.1", plain.server(0)->data_port(), "server-p",
                                absl::Seconds(5), BufferPool::Create(), absl::ZeroDuration(), {},
                                ctx->get());
  ASSERT_FALSE(to_plain.ok());
  EXPECT_TRUE(absl::StrContains(to_plain.status().message(), "TLS handshake"))
      << to_plain.status();
  // A plaintext client on the TLS port gets no challenge and gives up.
  auto to_tls = TcpConn::Open("127.0.0.1", tls.server(0)->data_port(), "server-t",
                              absl::Seconds(5), BufferPool::Create(), absl::ZeroDuration());
  ASSERT_FALSE(to_tls.ok());
  EXPECT_TRUE(absl::StrContains(to_tls.status().message(), "server-t")) << to_tls.status();
  // Plaintext frames on the TLS port are refused at once.
  int fd = Dial(tls.server(0)->data_port());
  const std::string frame = AuthFrame("job", 0, 0, "");
  ASSERT_EQ(send(fd, frame.data(), frame.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size()));
  char sink[256];
  EXPECT_LE(recv(fd, sink, sizeof(sink), 0), 64) << "at most an alert, then the end";
  close(fd);
  // Both servers still serve.
  for (InProcessCluster* c : {&plain, &tls}) {
    auto client = ClientOf(*c, c == &tls ? ClientFiles() : TlsFiles{}, DataTransport::kTcp);
    ASSERT_NE(client, nullptr);
    Train(client.get());
  }
}

// A server copies what it applies to its backups over their data ports, in TLS with its own
// certificate as the client certificate (one made for both uses).
TEST_F(TlsDataPlaneTest, CopiesToBackupsTravelOverTheTlsDataPorts) {
  PsServerOptions so = TlsServer();
  so.tls.cert = File("node.pem");
  so.tls.key = File("node.key");
  InProcessCluster tls(2, so);
  ASSERT_TRUE(tls.status().ok()) << tls.status();
  for (int i = 0; i < 2; ++i) tls.server(i)->handler()->set_node_id("s" + std::to_string(i));
  PsClientOptions o;
  o.job_id = "job";
  o.channel.tls = ClientFiles();
  o.data_transport = DataTransport::kTcp;
  auto w = DenseSpec("w", {16, 500}, kAdam, 500);
  auto client = PsClient::Create(o, ReplicatedMap("job", 1, tls.addresses()), {w});
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->InstallShardMap().ok());
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
  std::vector<float> g(8000, 0.25f);
  for (int step = 0; step < 3; ++step) {
    absl::Status st = (*client)->Push(step, {{{"w", g.data()}}, {}});
    ASSERT_TRUE(st.ok()) << st;
  }
  auto statuses = (*client)->ServerStatuses();
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ((*statuses)[i].jobs(0).replicas_size(), 1) << i;
    EXPECT_EQ((*statuses)[i].jobs(0).replicas(0).clocks(0).clock(), 3) << i;
    // The worker's connection and the other server's copies (the copies are never sent over
    // gRPC while the backup offers a data port: a failed dial fails the push).
    EXPECT_GE(tls.server(i)->data_connections(), 2) << i;
  }
}

TEST_F(TlsDataPlaneTest, TruncatedAndGarbageHandshakesLeaveTheServerServing) {
  InProcessCluster tls(1, TlsServer());
  ASSERT_TRUE(tls.status().ok()) << tls.status();
  const std::string hello = ::pscluster::testing::TlsClientHello();
  ASSERT_GT(hello.size(), 100u);
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    std::string bytes = hello.substr(0, rng() % hello.size());
    if (i % 2 == 1) {  // A corrupted hello, or garbage after a real prefix.
      for (int k = 0; k < 8 && !bytes.empty(); ++k) bytes[rng() % bytes.size()] ^= 0x5a;
      for (int k = 0; k < 64; ++k) bytes.push_back(static_cast<char>(rng()));
    }
    int fd = Dial(tls.server(0)->data_port());
    (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (i % 4 == 0) shutdown(fd, SHUT_WR);  // Truncated: the end of the stream follows.
    close(fd);
  }
  auto client = ClientOf(tls, ClientFiles(), DataTransport::kTcp);
  ASSERT_NE(client, nullptr);
  Train(client.get());
  EXPECT_GE(tls.server(0)->data_connections(), 1);
}

// A TLS client whose bytes pass a relay that alters one after the handshake: the server refuses
// the record (bad_record_mac), logs it as a warning naming the connection, closes only that
// connection and keeps serving.
TEST_F(TlsDataPlaneTest, AnAlteredRecordClosesOnlyItsConnectionAndIsLogged) {
  InProcessCluster tls(1, TlsServer());
  ASSERT_TRUE(tls.status().ok()) << tls.status();
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  Logger("server")->sinks().push_back(sink);
  // client a[0] ~ a[1] <relay> server's data port.
  int a[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
  fcntl(a[0], F_SETFL, fcntl(a[0], F_GETFL) | O_NONBLOCK);
  const int server_fd = Dial(tls.server(0)->data_port());
  std::atomic<bool> stop{false};
  std::atomic<size_t> sent_up{0}, flip_at{~size_t{0}};
  // Held while the relay takes bytes off the client's side and counts them, so that the test can
  // see when every byte of the handshake has been counted.
  std::mutex relay_mu;
  std::thread relay([&] {
    char buf[65536];
    while (!stop) {
      pollfd p[2] = {{a[1], POLLIN, 0}, {server_fd, POLLIN, 0}};
      if (poll(p, 2, 20) <= 0) continue;
      std::lock_guard<std::mutex> hold(relay_mu);
      for (int side = 0; side < 2; ++side) {
        if (!(p[side].revents & (POLLIN | POLLHUP))) continue;
        const int from = side == 0 ? a[1] : server_fd, to = side == 0 ? server_fd : a[1];
        const ssize_t r = recv(from, buf, sizeof(buf), MSG_DONTWAIT);
        if (r <= 0) {
          shutdown(to, SHUT_WR);
          continue;
        }
        if (side == 0) {
          const size_t at = sent_up.fetch_add(static_cast<size_t>(r));
          const size_t flip = flip_at.load();
          if (flip >= at && flip < at + static_cast<size_t>(r)) buf[flip - at] ^= 0x01;
        }
        (void)!send(to, buf, static_cast<size_t>(r), MSG_NOSIGNAL);
      }
    }
  });
  auto ctx = TlsContext::ForClient(ClientFiles(), "");
  ASSERT_TRUE(ctx.ok());
  {
    TlsIo io(a[0], **ctx, "127.0.0.1");
    ASSERT_TRUE(io.Handshake(absl::Now() + absl::Seconds(10)).ok());
    // Inside the first record after the handshake: once the relay has counted every byte the
    // handshake wrote (its side of the pair empty, the relay between two reads).
    for (bool armed = false; !armed;) {
      {
        std::lock_guard<std::mutex> hold(relay_mu);
        int queued = 1;
        if (ioctl(a[1], FIONREAD, &queued) == 0 && queued == 0) {
          flip_at = sent_up.load() + 5 + 3;
          armed = true;
        }
      }
      if (!armed) absl::SleepFor(absl::Milliseconds(1));
    }
    const std::string bytes(64, 'x');
    iovec v{const_cast<char*>(bytes.data()), bytes.size()};
    ASSERT_EQ(io.Send(&v, 1, /*dontwait=*/false), 64);
    ASSERT_EQ(io.Flush(/*dontwait=*/false), 1);
    // The server closes the connection (after its challenge, sent before our record came): the
    // end of the stream reaches the client.
    char buf[4096];
    ssize_t r = 1;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (r != 0 && absl::Now() < deadline) {
      pollfd p{a[0], POLLIN, 0};
      if (!io.HasPending() && poll(&p, 1, 100) <= 0) continue;
      r = io.Recv(buf, sizeof(buf), /*dontwait=*/true);
      if (r < 0 && errno != EAGAIN) break;
    }
    EXPECT_LE(r, 0) << "the server did not close the connection";
  }
  stop = true;
  relay.join();
  for (int fd : {a[0], a[1], server_fd}) close(fd);
  Logger("server")->flush();
  Logger("server")->sinks().pop_back();
  EXPECT_TRUE(absl::StrContains(log.str(), "bad_record_mac")) << log.str();
  EXPECT_TRUE(absl::StrContains(log.str(), "closing it")) << log.str();
  EXPECT_EQ(tls.server(0)->data_refusals()->tls_record.load(), 1u);
  EXPECT_EQ(tls.server(0)->data_refusals()->tls_handshake.load(), 0u);
  // Only that connection: a client trains as before.
  auto client = ClientOf(tls, ClientFiles(), DataTransport::kTcp);
  ASSERT_NE(client, nullptr);
  Train(client.get());
}

}  // namespace
}  // namespace pscluster
