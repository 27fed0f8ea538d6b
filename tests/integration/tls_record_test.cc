// The record layer of the TLS data plane (server/tls_stream.h): after OpenSSL's handshake a
// TlsIo seals and opens TLS 1.3 records itself. Shown here over socket pairs: two TlsIos carry
// large streams both ways at once, in pieces of every size; a standard OpenSSL peer (SSL_read,
// SSL_write) reads what a TlsIo writes and the other way round, for each of TLS 1.3's three
// cipher suites; both follow each other's KeyUpdates; a byte altered on the way, a record in the
// clear and a record over the size limit end the connection naming what happened; a close_notify
// ends the stream.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "server/tls_stream.h"
#include "tests/integration/test_certs.h"

namespace pscluster {
namespace {

using ::pscluster::testing::MakeTestCerts;

// A connected pair of stream sockets, the first non-blocking (the second too by default).
void Pair(int fds[2], bool nonblocking_second = true) {
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  if (nonblocking_second) fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK);
}

struct ConnectedPair;

class TlsRecordTest : public ::testing::Test {
 protected:
  // A TlsIo client (of "localhost") and server with the test certificates, connected over a
  // socket pair and past their handshake (null when the certificates cannot be used).
  static std::unique_ptr<ConnectedPair> Connected();

  static void SetUpTestSuite() { dir_ = new std::string(MakeTestCerts()); }
  static std::string File(const std::string& name) { return *dir_ + "/" + name; }
  static TlsFiles ServerFiles() { return {File("server.pem"), File("server.key"), File("ca.pem")}; }
  static TlsFiles ClientFiles() { return {File("client.pem"), File("client.key"), File("ca.pem")}; }

  // A standard OpenSSL server context (tickets on, as OpenSSL's default), of one cipher suite.
  static SSL_CTX* PlainOpenSslServer(const char* suite) {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    SSL_CTX_set_ciphersuites(ctx, suite);
    EXPECT_EQ(SSL_CTX_use_certificate_chain_file(ctx, File("server.pem").c_str()), 1);
    EXPECT_EQ(SSL_CTX_use_PrivateKey_file(ctx, File("server.key").c_str(), SSL_FILETYPE_PEM), 1);
    return ctx;
  }

  static std::string* dir_;
};
std::string* TlsRecordTest::dir_ = nullptr;

// Sends all of `data` (as a header of 7 bytes and the rest, the way frames go), then flushes.
bool SendAll(TlsIo& io, const std::string& data, size_t piece) {
  size_t done = 0;
  while (done < data.size()) {
    const size_t n = std::min(piece, data.size() - done);
    const size_t head = std::min<size_t>(7, n);
    iovec iov[2] = {{const_cast<char*>(data.data() + done), head},
                    {const_cast<char*>(data.data() + done + head), n - head}};
    size_t sent = 0;
    while (sent < n) {
      // Skip what was taken.
      iovec v[2];
      size_t k = 0, skip = sent;
      for (const iovec& x : iov) {
        if (skip >= x.iov_len) {
          skip -= x.iov_len;
          continue;
        }
        v[k++] = {static_cast<char*>(x.iov_base) + skip, x.iov_len - skip};
        skip = 0;
      }
      const ssize_t r = io.Send(v, k, /*dontwait=*/false);
      if (r < 0) {
        ADD_FAILURE() << "Send: " << io.ErrorText(errno);
        return false;
      }
      sent += static_cast<size_t>(r);
    }
    done += n;
  }
  return io.Flush(/*dontwait=*/false) == 1;
}

// Reads `n` bytes in reads of the sizes in `sizes`, in turn.
std::string RecvAll(TlsIo& io, size_t n, const std::vector<size_t>& sizes) {
  std::string out(n, '\0');
  size_t got = 0, turn = 0;
  while (got < n) {
    const size_t want = std::min(sizes[turn++ % sizes.size()], n - got);
    const ssize_t r = io.Recv(out.data() + got, want, /*dontwait=*/false);
    if (r <= 0) {
      ADD_FAILURE() << "Recv returned " << r << " after " << got << " of " << n
                    << " bytes: " << io.ErrorText(errno);
      out.resize(got);
      return out;
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

// Shuts a socket down when it goes out of scope: a peer thread that fails ends the stream, so the
// test's side sees the end instead of waiting for ever.
struct ShutDownAtExit {
  int fd;
  ~ShutDownAtExit() { shutdown(fd, SHUT_RDWR); }
};

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    s[i] = static_cast<char>(seed >> 24);
  }
  return s;
}

// Both handshakes at once (each side waits for the other).
void Handshake(TlsIo& a, TlsIo& b) {
  absl::Status sb;
  std::thread t([&] { sb = b.Handshake(absl::Now() + absl::Seconds(20)); });
  const absl::Status sa = a.Handshake(absl::Now() + absl::Seconds(20));
  t.join();
  ASSERT_TRUE(sa.ok()) << sa;
  ASSERT_TRUE(sb.ok()) << sb;
}

// A TlsIo client and server over a socket pair, after their handshake.
struct ConnectedPair {
  explicit ConnectedPair(const TlsContext& client_ctx, const TlsContext& server_ctx) {
    Pair(fds);
    client = std::make_unique<TlsIo>(fds[0], client_ctx, "localhost");
    server = std::make_unique<TlsIo>(fds[1], server_ctx, "");
    Handshake(*client, *server);
  }
  ~ConnectedPair() {
    client.reset();
    server.reset();
    close(fds[0]);
    close(fds[1]);
  }
  int fds[2];
  std::unique_ptr<TlsIo> client, server;
};

std::unique_ptr<ConnectedPair> TlsRecordTest::Connected() {
  auto server_ctx = TlsContext::ForServer(ServerFiles());
  auto client_ctx = TlsContext::ForClient(ClientFiles(), "localhost");
  EXPECT_TRUE(server_ctx.ok()) << server_ctx.status();
  EXPECT_TRUE(client_ctx.ok()) << client_ctx.status();
  if (!server_ctx.ok() || !client_ctx.ok()) return nullptr;
  return std::make_unique<ConnectedPair>(**client_ctx, **server_ctx);
}

TEST_F(TlsRecordTest, TwoEndsCarryLargeStreamsBothWaysAtOnceInPiecesOfEverySize) {
  auto pair = Connected();
  ASSERT_NE(pair, nullptr);
  TlsIo& client = *pair->client;
  TlsIo& server = *pair->server;

  const std::string up = Pattern((9 << 20) + 12345, 1);
  const std::string down = Pattern((7 << 20) + 999, 2);
  // Reads smaller than a record (kept back and handed out in pieces), of a record and a bit, and
  // far larger than a batch (opened straight into the destination).
  const std::vector<size_t> sizes = {1, 13, 5000, 16385, 100000, 3 << 20, 16384, 7};
  std::string at_server, at_client;
  std::thread server_reads([&] { at_server = RecvAll(server, up.size(), sizes); });
  std::thread client_reads([&] { at_client = RecvAll(client, down.size(), {4 << 20, 3}); });
  std::thread server_writes([&] { EXPECT_TRUE(SendAll(server, down, 1 << 20)); });
  EXPECT_TRUE(SendAll(client, up, 300000));
  server_writes.join();
  server_reads.join();
  client_reads.join();
  EXPECT_TRUE(at_server == up) << "the server read " << at_server.size() << " bytes, not the sent";
  EXPECT_TRUE(at_client == down) << "the client read " << at_client.size() << " bytes, not the sent";
  EXPECT_FALSE(server.HasPending());
}

// A TlsIo client against a standard OpenSSL server, each cipher suite, with the records' AES-GCM
// from OpenSSL's EVP and from the CPU's vector instructions (server/aes_gcm.h; skipped where the
// CPU lacks them): what one writes the other reads; the server's session tickets (sent after the
// handshake) are passed over.
class TlsRecordSuiteTest : public TlsRecordTest,
                           public ::testing::WithParamInterface<std::tuple<const char*, bool>> {
 protected:
  void SetUp() override {
    TlsIo::SetVectorAes(std::get<1>(GetParam()));
    if (std::get<1>(GetParam()) && !TlsIo::UsesVectorAes()) {
      GTEST_SKIP() << "this CPU lacks VAES, VPCLMULQDQ or AVX-512";
    }
  }
  void TearDown() override { TlsIo::SetVectorAes(true); }
};

TEST_P(TlsRecordSuiteTest, AStandardOpenSslPeerReadsAndWritesTheRecords) {
  const char* suite = std::get<0>(GetParam());
  SSL_CTX* ctx = PlainOpenSslServer(suite);
  auto client_ctx = TlsContext::ForClient(ClientFiles(), "localhost");
  ASSERT_TRUE(client_ctx.ok());
  int fds[2];
  Pair(fds, /*nonblocking_second=*/false);
  TlsIo client(fds[0], **client_ctx, "localhost");
  const std::string up = Pattern((1 << 20) + 77, 3);
  const std::string down = Pattern((2 << 20) + 5, 4);
  std::string got_up, cipher;
  std::thread peer([&] {
    ShutDownAtExit guard{fds[1]};
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fds[1]);
    ASSERT_EQ(SSL_accept(ssl), 1) << ERR_error_string(ERR_get_error(), nullptr);
    cipher = SSL_CIPHER_get_name(SSL_get_current_cipher(ssl));
    got_up.resize(up.size());
    size_t got = 0;
    while (got < up.size()) {
      const int r = SSL_read(ssl, got_up.data() + got, static_cast<int>(up.size() - got));
      ASSERT_GT(r, 0) << "SSL_read: " << ERR_error_string(ERR_get_error(), nullptr);
      got += static_cast<size_t>(r);
    }
    for (size_t done = 0; done < down.size();) {
      const int r = SSL_write(ssl, down.data() + done,
                              static_cast<int>(std::min<size_t>(50000, down.size() - done)));
      ASSERT_GT(r, 0);
      done += static_cast<size_t>(r);
    }
    SSL_shutdown(ssl);  // close_notify
    SSL_free(ssl);
  });
  ASSERT_TRUE(client.Handshake(absl::Now() + absl::Seconds(20)).ok());
  EXPECT_TRUE(SendAll(client, up, 1 << 20));
  const std::string got_down = RecvAll(client, down.size(), {100000, 17});
  peer.join();
  EXPECT_EQ(cipher, suite);
  EXPECT_TRUE(got_up == up) << "OpenSSL read " << got_up.size() << " bytes, not the sent";
  EXPECT_TRUE(got_down == down) << "the TlsIo read " << got_down.size() << " bytes, not the sent";
  // Then the peer's close_notify: the end of the stream.
  char c;
  EXPECT_EQ(client.Recv(&c, 1, /*dontwait=*/false), 0);
  SSL_CTX_free(ctx);
  close(fds[0]);
  close(fds[1]);
}

INSTANTIATE_TEST_SUITE_P(
    Suites, TlsRecordSuiteTest,
    ::testing::Combine(::testing::Values("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384",
                                         "TLS_CHACHA20_POLY1305_SHA256"),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<const char*, bool>>& info) {
      std::string name = std::get<0>(info.param);
      name += std::get<1>(info.param) ? "_VectorAes" : "_OpenSsl";
      return name;
    });

TEST_F(TlsRecordTest, ATlsIoServerServesAStandardOpenSslClient) {
  auto server_ctx = TlsContext::ForServer(ServerFiles());
  ASSERT_TRUE(server_ctx.ok());
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_EQ(SSL_CTX_load_verify_locations(ctx, File("ca.pem").c_str(), nullptr), 1);
  ASSERT_EQ(SSL_CTX_use_certificate_chain_file(ctx, File("client.pem").c_str()), 1);
  ASSERT_EQ(SSL_CTX_use_PrivateKey_file(ctx, File("client.key").c_str(), SSL_FILETYPE_PEM), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  int fds[2];
  Pair(fds, /*nonblocking_second=*/false);
  TlsIo server(fds[0], **server_ctx, "");
  const std::string up = Pattern(3 << 20, 5);
  std::string echoed;
  std::thread peer([&] {
    ShutDownAtExit guard{fds[1]};
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fds[1]);
    SSL_set1_host(ssl, "localhost");
    ASSERT_EQ(SSL_connect(ssl), 1) << ERR_error_string(ERR_get_error(), nullptr);
    ASSERT_EQ(SSL_write(ssl, up.data(), static_cast<int>(up.size())), static_cast<int>(up.size()));
    echoed.resize(up.size());
    size_t got = 0;
    while (got < up.size()) {
      const int r = SSL_read(ssl, echoed.data() + got, static_cast<int>(up.size() - got));
      ASSERT_GT(r, 0) << "SSL_read: " << ERR_error_string(ERR_get_error(), nullptr);
      got += static_cast<size_t>(r);
    }
    SSL_free(ssl);
  });
  ASSERT_TRUE(server.Handshake(absl::Now() + absl::Seconds(20)).ok());
  const std::string got = RecvAll(server, up.size(), {65536, 1000});
  EXPECT_TRUE(got == up);
  EXPECT_TRUE(SendAll(server, got, 1 << 20));
  peer.join();
  EXPECT_TRUE(echoed == up) << "OpenSSL read back " << echoed.size() << " bytes, not the sent";
  SSL_CTX_free(ctx);
  close(fds[0]);
  close(fds[1]);
}

// The client's bytes to the server pass through a relay that can alter one of them.
class Relay {
 public:
  Relay(int from, int to) : from_(from), to_(to), thread_([this] { Run(); }) {}
  ~Relay() {
    stop_ = true;
    thread_.join();
  }
  // Flips a bit of the byte `offset` bytes after everything relayed so far.
  void FlipAfter(size_t offset) {
    flip_at_ = forwarded_.load() + offset;
  }

 private:
  void Run() {
    char buf[65536];
    while (!stop_) {
      pollfd p{from_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t r = recv(from_, buf, sizeof(buf), MSG_DONTWAIT);
      if (r <= 0) continue;
      // Counted before it goes on, so that once the peer has read it, FlipAfter counts from
      // after it.
      const size_t at = forwarded_.fetch_add(static_cast<size_t>(r));
      const size_t flip = flip_at_.load();
      if (flip >= at && flip < at + static_cast<size_t>(r)) buf[flip - at] ^= 0x10;
      for (ssize_t done = 0; done < r;) {
        const ssize_t w = send(to_, buf + done, static_cast<size_t>(r - done), MSG_NOSIGNAL);
        if (w <= 0) return;
        done += w;
      }
    }
  }
  const int from_, to_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> forwarded_{0};
  std::atomic<size_t> flip_at_{~size_t{0}};
  std::thread thread_;
};

TEST_F(TlsRecordTest, AByteAlteredOnTheWayEndsTheConnectionNamingTheCheck) {
  auto server_ctx = TlsContext::ForServer(ServerFiles());
  auto client_ctx = TlsContext::ForClient(ClientFiles(), "localhost");
  ASSERT_TRUE(server_ctx.ok() && client_ctx.ok());
  // client a[0] ~ a[1] relay b[0] ~ b[1] server: the relay's ends block, the TlsIos' do not.
  int a[2], b[2];
  Pair(a, /*nonblocking_second=*/false);
  Pair(b);
  fcntl(b[0], F_SETFL, fcntl(b[0], F_GETFL) & ~O_NONBLOCK);
  Relay up(a[1], b[0]);
  Relay down(b[0], a[1]);
  TlsIo client(a[0], **client_ctx, "localhost");
  TlsIo server(b[1], **server_ctx, "");
  Handshake(client, server);
  // One record passes untouched, the next has a bit of its sealed bytes flipped.
  const std::string first = Pattern(1000, 6);
  ASSERT_TRUE(SendAll(client, first, 1 << 20));
  EXPECT_EQ(RecvAll(server, first.size(), {4096}), first);
  up.FlipAfter(5 + 100);  // Inside the next record's body.
  ASSERT_TRUE(SendAll(client, Pattern(1000, 7), 1 << 20));
  char buf[4096];
  const ssize_t r = server.Recv(buf, sizeof(buf), /*dontwait=*/false);
  EXPECT_EQ(r, -1);
  EXPECT_TRUE(absl::StrContains(server.ErrorText(errno), "bad_record_mac"))
      << server.ErrorText(errno);
  // The stream stays failed.
  EXPECT_EQ(server.Recv(buf, sizeof(buf), /*dontwait=*/true), -1);
  for (int fd : {a[0], a[1], b[0], b[1]}) close(fd);
}

TEST_F(TlsRecordTest, ARecordInTheClearAndAnOversizedRecordAreRefusedNamingThem) {
  auto client_ctx = TlsContext::ForClient(ClientFiles(), "localhost");
  ASSERT_TRUE(client_ctx.ok());
  SSL_CTX* ctx = PlainOpenSslServer("TLS_AES_128_GCM_SHA256");
  struct Case {
    const char* name;
    std::function<void(SSL*, int)> act;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"a close_notify", [](SSL* ssl, int) { SSL_shutdown(ssl); }, ""},
      {"a record in the clear",
       [](SSL*, int fd) {
         const unsigned char alert[7] = {21, 3, 3, 0, 2, 2, 40};  // handshake_failure
         ASSERT_EQ(send(fd, alert, 7, MSG_NOSIGNAL), 7);
       },
       "a record of type 21 after the handshake"},
      {"an oversized record",
       [](SSL*, int fd) {
         const unsigned char header[5] = {23, 3, 3, 0x50, 0x00};  // 20480 bytes.
         ASSERT_EQ(send(fd, header, 5, MSG_NOSIGNAL), 5);
       },
       "record_overflow"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    int fds[2];
    Pair(fds, /*nonblocking_second=*/false);
    TlsIo client(fds[0], **client_ctx, "localhost");
    std::thread peer([&] {
      SSL* ssl = SSL_new(ctx);
      SSL_set_fd(ssl, fds[1]);
      ASSERT_EQ(SSL_accept(ssl), 1);
      ASSERT_EQ(SSL_write(ssl, "hello", 5), 5);
      c.act(ssl, fds[1]);
      SSL_free(ssl);
    });
    ASSERT_TRUE(client.Handshake(absl::Now() + absl::Seconds(20)).ok());
    EXPECT_EQ(RecvAll(client, 5, {64}), "hello");
    peer.join();
    char buf[64];
    const ssize_t r = client.Recv(buf, sizeof(buf), /*dontwait=*/false);
    if (c.expected[0] == '\0') {
      EXPECT_EQ(r, 0) << "a close_notify ends the stream";
    } else {
      EXPECT_EQ(r, -1);
      EXPECT_TRUE(absl::StrContains(client.ErrorText(errno), c.expected))
          << client.ErrorText(errno);
    }
    close(fds[0]);
    close(fds[1]);
  }
  SSL_CTX_free(ctx);
}

// Keys move on: every few records here (TlsIo::SetRecordsPerKeyForTesting), so a standard OpenSSL
// peer reads through this side's KeyUpdates, and this side follows the peer's, answering one that
// asks for an update with its own.
TEST_F(TlsRecordTest, BothSidesFollowEachOthersKeyUpdates) {
  TlsIo::SetRecordsPerKeyForTesting(5);
  SSL_CTX* ctx = PlainOpenSslServer("TLS_AES_128_GCM_SHA256");
  auto client_ctx = TlsContext::ForClient(ClientFiles(), "localhost");
  ASSERT_TRUE(client_ctx.ok());
  int fds[2];
  Pair(fds, /*nonblocking_second=*/false);
  TlsIo client(fds[0], **client_ctx, "localhost");
  const std::string up = Pattern((1 << 20) + 3, 8);  // 65 records: 13 keys.
  const std::string down = Pattern(300000, 9);
  std::string got_up, got_after;
  std::thread peer([&] {
    ShutDownAtExit guard{fds[1]};
    SSL* ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fds[1]);
    ASSERT_EQ(SSL_accept(ssl), 1);
    auto read_n = [&](std::string* into, size_t n) {
      into->resize(n);
      for (size_t got = 0; got < n;) {
        const int r = SSL_read(ssl, into->data() + got, static_cast<int>(n - got));
        ASSERT_GT(r, 0) << "SSL_read: " << ERR_error_string(ERR_get_error(), nullptr);
        got += static_cast<size_t>(r);
      }
    };
    read_n(&got_up, up.size());
    // The peer's own KeyUpdate, asking for one back, then data under its new keys.
    ASSERT_EQ(SSL_key_update(ssl, SSL_KEY_UPDATE_REQUESTED), 1);
    ASSERT_EQ(SSL_write(ssl, down.data(), static_cast<int>(down.size())),
              static_cast<int>(down.size()));
    read_n(&got_after, 10);
    SSL_free(ssl);
  });
  ASSERT_TRUE(client.Handshake(absl::Now() + absl::Seconds(20)).ok());
  EXPECT_TRUE(SendAll(client, up, 1 << 20));
  EXPECT_TRUE(RecvAll(client, down.size(), {70000}) == down);
  EXPECT_TRUE(SendAll(client, "after keys", 1 << 20));
  peer.join();
  EXPECT_TRUE(got_up == up) << "OpenSSL read " << got_up.size() << " bytes, not the sent";
  EXPECT_EQ(got_after, "after keys");
  TlsIo::SetRecordsPerKeyForTesting(uint64_t{1} << 20);
  SSL_CTX_free(ctx);
  close(fds[0]);
  close(fds[1]);
}

TEST_F(TlsRecordTest, TwoTlsIosMoveToNewKeysEveryFewRecords) {
  TlsIo::SetRecordsPerKeyForTesting(3);
  auto pair = Connected();
  ASSERT_NE(pair, nullptr);
  TlsIo& client = *pair->client;
  TlsIo& server = *pair->server;
  const std::string up = Pattern(2 << 20, 10);
  const std::string down = Pattern(1 << 20, 11);
  std::string at_server;
  std::thread server_reads([&] { at_server = RecvAll(server, up.size(), {100000}); });
  std::thread server_writes([&] { EXPECT_TRUE(SendAll(server, down, 1 << 20)); });
  EXPECT_TRUE(SendAll(client, up, 1 << 20));
  EXPECT_TRUE(RecvAll(client, down.size(), {1 << 20}) == down);
  server_writes.join();
  server_reads.join();
  EXPECT_TRUE(at_server == up);
  TlsIo::SetRecordsPerKeyForTesting(uint64_t{1} << 20);
}

// Random bytes where records should be, after a real handshake: never data, always the end of the
// stream or an error (a record in the clear, an oversized record, one that fails its check, one
// cut short by the end of the stream), and never a crash.
TEST_F(TlsRecordTest, RandomBytesAfterTheHandshakeNeverComeOutAsData) {
  uint32_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 1664525u + 1013904223u;
    return seed >> 8;
  };
  int errors = 0, ends = 0;
  for (int i = 0; i < 60; ++i) {
    auto pair = Connected();
    ASSERT_NE(pair, nullptr);
    TlsIo& server = *pair->server;
    const int* fds = pair->fds;
    std::string junk(next() % 40000, '\0');
    for (char& c : junk) c = static_cast<char>(next());
    if (i % 3 == 0 && junk.size() >= 5) {  // A plausible header: application data, a valid length.
      junk[0] = 23;
      junk[1] = 3;
      junk[2] = 3;
      const size_t len = std::min<size_t>(junk.size() - 5, 16384 + 256);
      junk[3] = static_cast<char>(len >> 8);
      junk[4] = static_cast<char>(len & 0xff);
    }
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) & ~O_NONBLOCK);
    ASSERT_EQ(send(fds[0], junk.data(), junk.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(junk.size()));
    shutdown(fds[0], SHUT_WR);
    std::vector<char> buf(1 << 16);
    const ssize_t r = server.Recv(buf.data(), buf.size(), /*dontwait=*/false);
    EXPECT_LE(r, 0) << "case " << i << ": " << junk.size() << " random bytes came out as data";
    (r < 0 ? errors : ends) += 1;
  }
  EXPECT_GT(errors, 50);  // The end of the stream only when no byte came.
}

}  // namespace
}  // namespace pscluster
