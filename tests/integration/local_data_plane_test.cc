// The TCP data plane's same-host paths: workers on the server's host use its abstract Unix
// socket (--data_unix) and, when offered, shared-memory rings, with the same values as TCP;
// sockets and memory not served by the server, or hostile, are refused and change nothing.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel.h"
#include "common/status_convert.h"
#include "server/client/tcp_conn.h"
#include "server/shm_ring.h"
#include "server/tcp_frame.h"
#include "server/testing/cluster.h"
#include "server/wire.h"
#include "tests/integration/raw_frames.h"
#include "tests/integration/data_plane_fixture.h"

namespace pscluster {
namespace {

using namespace ::pscluster::testing;  // NOLINT

TEST_F(TcpDataPlaneTest, WorkersOnTheSameHostUseTheUnixSocket) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  v1::ServerStatus st = StatusOf(cluster.addresses()[0]);
  EXPECT_FALSE(st.data_unix().empty());
  EXPECT_EQ(st.data_unix(), cluster.server(0)->data_unix());
  EXPECT_EQ(st.pid(), static_cast<uint32_t>(getpid()));

  auto w = DenseSpec("w", {1000}, kAdam, 256);
  v1::ConsistencySpec asp;
  asp.set_mode(v1::ConsistencySpec::ASP);
  auto client = cluster.Client("job", {w});  // auto
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->CreateTables(asp, 1).ok());
  std::vector<float> g(1000, 1.f), v(1000);
  ASSERT_TRUE((*client)->PushPull(0, {{{"w", g.data()}}, {}}, {{{"w", v.data()}}, {}}).ok());
  EXPECT_EQ(cluster.server(0)->data_unix_connections(), 1);
  EXPECT_EQ(cluster.server(0)->data_connections(), 1);

  PsClientOptions o;
  o.data_transport = DataTransport::kTcp;
  auto tcp = cluster.Client("job", {w}, 0, o);
  ASSERT_TRUE(tcp.ok());
  ASSERT_TRUE((*tcp)->Pull(1, {{{"w", v.data()}}, {}}).ok());
  EXPECT_EQ(cluster.server(0)->data_unix_connections(), 1) << "tcp must not use the Unix socket";
  EXPECT_EQ(cluster.server(0)->data_connections(), 2);

  bool ok_unix, ok_tcp;
  std::vector<float> over_unix = Train(DataTransport::kUnix, &ok_unix);
  std::vector<float> over_tcp = Train(DataTransport::kTcp, &ok_tcp);
  ASSERT_TRUE(ok_unix && ok_tcp);
  ASSERT_EQ(over_unix.size(), over_tcp.size());
  EXPECT_EQ(std::memcmp(over_unix.data(), over_tcp.data(), over_unix.size() * 4), 0);
}

// --data_unix=false: no socket advertised, auto uses TCP, `unix` fails naming the reason.
TEST_F(TcpDataPlaneTest, UnixSocketOffWithDataUnixFalse) {
  PsServerOptions so;
  so.data_unix = false;
  InProcessCluster cluster(1, so);
  ASSERT_TRUE(cluster.status().ok());
  EXPECT_TRUE(StatusOf(cluster.addresses()[0]).data_unix().empty());
  auto w = DenseSpec("w", {100}, kAdam, 100);
  AutoClientPulls(cluster, w);
  EXPECT_EQ(cluster.server(0)->data_connections(), 1);
  EXPECT_EQ(cluster.server(0)->data_unix_connections(), 0);
  RequiredTransportFails(cluster, w, DataTransport::kUnix, "offers no Unix data socket");
}

// Anyone on the host may bind an abstract name: a socket not served by the server's process is
// refused, and a name nobody serves is unavailable.
TEST_F(TcpDataPlaneTest, AUnixSocketNotServedByTheServerIsRefused) {
  const std::string name = absl::StrCat("pscluster-test-impostor/", getpid());
  int l = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), len), 0) << std::strerror(errno);
  ASSERT_EQ(listen(l, 4), 0);
  auto pool = BufferPool::Create();
  const uint32_t other_pid = static_cast<uint32_t>(getpid()) + 1;
  auto bad = TcpConn::OpenUnix(name, other_pid, "server-x", pool, absl::ZeroDuration());
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(bad.status())) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "not by the server")) << bad.status();
  // The process that serves the name passes; this one answers the authentication exchange as
  // a server would.
  std::thread serve([l] {
    int c = -1;
    while (true) {  // The refused connection above is still in the backlog: skip it.
      c = accept(l, nullptr, nullptr);
      if (c < 0) return;
      const std::string challenge =
          Header(kTcpFrameMagic, kFrameChallenge, 32, 0) + std::string(32, 'n');
      char auth[kFrameHeaderBytes + 8];  // No proof, no job: 8 bytes of body.
      if (send(c, challenge.data(), challenge.size(), MSG_NOSIGNAL) ==
              static_cast<ssize_t>(challenge.size()) &&
          ReadFull(c, auth, sizeof(auth)).ok()) {
        break;
      }
      close(c);
    }
    SendRaw(c, Header(kTcpFrameMagic, kFrameAuth, 0, 1));
    char sink[64];
    while (recv(c, sink, sizeof(sink), 0) > 0) {
    }
    close(c);
  });
  auto good = TcpConn::OpenUnix(name, static_cast<uint32_t>(getpid()), "server-x", pool,
                                absl::ZeroDuration());
  EXPECT_TRUE(good.ok()) << good.status();
  if (good.ok()) (*good)->Shutdown(absl::Seconds(1));
  good = absl::UnavailableError("closed");
  serve.join();
  close(l);
  auto none = TcpConn::OpenUnix(name + "-gone", static_cast<uint32_t>(getpid()), "server-x", pool,
                                absl::ZeroDuration());
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsUnavailable(none.status())) << none.status();
}

// A worker on the server's host passes payloads through shared memory (the default): the same
// values bit for bit as over TCP, with rings big enough for a whole round, with rings too small
// for one (the rest goes over the socket), and without shared memory.
TEST_F(TcpDataPlaneTest, SharedMemoryOnTheSameHostMatchesTcpBitForBit) {
  const uint64_t dense = 30000, block = 8192;  // 4 blocks of 32 KiB per round.
  const uint64_t pushed = 5 * dense * 4;       // Dense payload bytes over the 5 steps.
  bool ok_shm, ok_small, ok_sock, ok_tcp;
  ShmUse shm, small, sock;
  std::vector<float> over_shm =
      Train(DataTransport::kUnix, &ok_shm, 1, dense, block, nullptr, 16 << 20, &shm);
  std::vector<float> over_small =
      Train(DataTransport::kUnix, &ok_small, 1, dense, block, nullptr, 64 << 10, &small);
  std::vector<float> over_sock =
      Train(DataTransport::kUnix, &ok_sock, 1, dense, block, nullptr, 0, &sock);
  std::vector<float> over_tcp = Train(DataTransport::kTcp, &ok_tcp, 1, dense, block);
  ASSERT_TRUE(ok_shm && ok_small && ok_sock && ok_tcp);
  EXPECT_EQ(shm.connections, 1);
  EXPECT_EQ(shm.received, pushed) << "every dense gradient through the request ring";
  EXPECT_EQ(shm.sent, pushed) << "every dense reply through the reply ring";
  EXPECT_EQ(small.connections, 1);
  EXPECT_GT(small.received, 0u);
  EXPECT_LT(small.received, pushed) << "a 64 KiB ring cannot hold a 128 KiB round";
  EXPECT_EQ(sock.connections, 0);
  EXPECT_EQ(sock.received, 0u);
  for (const auto* v : {&over_shm, &over_small, &over_sock}) {
    ASSERT_EQ(v->size(), over_tcp.size());
    EXPECT_EQ(std::memcmp(v->data(), over_tcp.data(), over_tcp.size() * 4), 0);
  }
}

// --data_shm_mib=0 on the server: the offer is refused and the Unix socket carries the payloads.
TEST_F(TcpDataPlaneTest, SharedMemoryRefusedByTheServerFallsBackToTheSocket) {
  PsServerOptions so;
  so.data_shm_max_bytes = 0;
  InProcessCluster cluster(1, so);
  ASSERT_TRUE(cluster.status().ok());
  auto w = DenseSpec("w", {100000}, kAdam, 25000);
  AutoClientPulls(cluster, w);  // 100 KB blocks: through the ring, had it been attached.
  EXPECT_EQ(cluster.server(0)->data_shm_bytes_sent(), 0u);
  auto conn = TcpConn::OpenUnix(cluster.server(0)->data_unix(), static_cast<uint32_t>(getpid()),
                                "server-0", BufferPool::Create(), absl::ZeroDuration(), 1 << 20);
  ASSERT_TRUE(conn.ok()) << conn.status();
  EXPECT_FALSE((*conn)->shared_memory());
  EXPECT_STREQ((*conn)->transport(), "unix");
}

// Shared-memory frames a client has no right to send, or that point outside its ring, and
// memory the server must not map: refused with a status naming the fault (or, for the memory,
// an answer that the connection goes on without it); nothing changes and the server serves on.
TEST_F(TcpDataPlaneTest, HostileSharedMemoryIsRefusedAndChangesNothing) {
  InProcessCluster cluster(1);
  ASSERT_TRUE(cluster.status().ok());
  std::vector<float> before;
  auto client = VictimClient(cluster, &before);
  ASSERT_NE(client, nullptr);
  const std::string name = cluster.server(0)->data_unix();
  auto position = [](uint64_t p) {
    std::string s(8, '\0');
    PutU64(s.data(), p);
    return s;
  };
  // The attach answer: kind 4, aux 1 (attached) or 0 (refused).
  auto answer = [](int fd) -> int {
    auto h = ReadFrameHeader(fd);
    if (!h.ok() || h->kind != kFrameAttach) return -1;
    return static_cast<int>(h->aux);
  };

  {  // A payload in shared memory with none attached.
    int fd = ConnectUnix(name);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameShmMessage, 5 + 8, 100) + "junk!" + position(0));
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "none is attached")) << st;
    close(fd);
  }
  {  // Memory that is not sealed (it could shrink under the server): refused, and the
     // connection goes on without it.
    int memfd = memfd_create("hostile", MFD_CLOEXEC);
    ASSERT_EQ(ftruncate(memfd, 4096 + 2 * 65536), 0);
    int fd = ConnectUnix(name);
    SendAttach(fd, memfd, 65536, 65536);
    close(memfd);
    EXPECT_EQ(answer(fd), 0);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameShmMessage, 5 + 8, 100) + "junk!" + position(0));
    EXPECT_TRUE(absl::StrContains(ReadUntilStatus(fd).message(), "none is attached"));
    close(fd);
  }
  {  // An attach frame without memory, and one whose sizes disagree with the memory.
    int fd = ConnectUnix(name);
    SendAttach(fd, -1, 65536, 65536);
    EXPECT_EQ(answer(fd), 0);
    close(fd);
    auto area = ShmArea::Create(65536, 65536);
    ASSERT_TRUE(area.ok());
    fd = ConnectUnix(name);
    SendAttach(fd, (*area)->fd(), 65536, 1 << 20);
    EXPECT_EQ(answer(fd), 0);
    close(fd);
  }
  {  // Attached, then a payload that does not lie in the ring.
    auto area = ShmArea::Create(65536, 65536);
    ASSERT_TRUE(area.ok());
    int fd = ConnectUnix(name);
    SendAttach(fd, (*area)->fd(), 65536, 65536);
    EXPECT_EQ(answer(fd), 1);
    EXPECT_EQ(cluster.server(0)->data_shm_connections(), 1);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameShmMessage, 5 + 8, 40000) + "junk!" +
                    position(30000));
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "does not lie in the ring")) << st;
    close(fd);
  }
  {  // A malformed attach frame, and one on the TCP port (not the first frame of a Unix socket).
    int fd = ConnectUnix(name);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameAttach, 3, 0) + "abc");
    absl::Status st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::StrContains(st.message(), "attach frame of 3 bytes")) << st;
    close(fd);
    fd = Connect(cluster.server(0)->data_port());
    SendRaw(fd, Header(kTcpFrameMagic, kFrameAttach, 16, 0) + std::string(16, '\0'));
    st = ReadUntilStatus(fd);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "not the first after authentication")) << st;
    close(fd);
  }
  {  // A shared-memory frame announcing more than a frame may hold.
    int fd = ConnectUnix(name);
    SendRaw(fd, Header(kTcpFrameMagic, kFrameShmMessage, 8, 0xfffffff0u) + position(0));
    EXPECT_TRUE(absl::IsInvalidArgument(ReadUntilStatus(fd)));
    close(fd);
  }
  // Nothing changed, and the server still serves, shared memory included.
  std::vector<float> after(1000);
  ASSERT_TRUE(client->Pull(0, {{{"w", after.data()}}, {}}).ok());
  EXPECT_EQ(before, after);
  auto w = DenseSpec("w2", {100000}, kAdam, 25000);
  AutoClientPulls(cluster, w);
  EXPECT_GT(cluster.server(0)->data_shm_bytes_sent(), 0u);
}

}  // namespace
}  // namespace pscluster
