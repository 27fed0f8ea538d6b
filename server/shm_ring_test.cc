#include "server/shm_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"

namespace pscluster {
namespace {

// A ring over plain memory, with its consumed counter.
struct Ring {
  explicit Ring(size_t size) : bytes(size), ring(bytes.data(), size, &consumed) {}
  std::vector<char> bytes;
  uint64_t consumed = 0;
  ShmRing ring;
};

TEST(ShmRingTest, ReservesInOrderOnCacheLinesUntilTheReaderFallsBehind) {
  Ring r(1024);
  auto a = r.ring.Reserve(100);
  auto b = r.ring.Reserve(100);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 128u);  // The next 64-byte boundary.
  auto c = r.ring.Reserve(700);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, 256u);
  EXPECT_FALSE(r.ring.Reserve(100).has_value()) << "would overwrite unread bytes";
  // The reader takes the first payload: a payload never wraps, so the next one skips the end
  // (956..1024) and reuses the start of the ring, which is free again ...
  ASSERT_TRUE(r.ring.Locate(*a, 100).ok());
  r.ring.Release(*a, 100);
  auto d = r.ring.Reserve(100);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, 1024u);
  // ... but not the second payload's bytes, still unread.
  EXPECT_FALSE(r.ring.Reserve(100).has_value());
  r.ring.Release(*b, 100);
  r.ring.Release(*c, 700);
  EXPECT_FALSE(r.ring.Reserve(1000).has_value()) << "d is unread";
  r.ring.Release(*d, 100);
  auto e = r.ring.Reserve(1000);  // Everything read: the whole ring, from its start.
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e, 2048u);
}

TEST(ShmRingTest, StartsOverAtTheBeginningWhenEverythingWasRead) {
  Ring r(1 << 20);
  for (int round = 0; round < 5; ++round) {
    std::vector<uint64_t> got;
    for (int i = 0; i < 4; ++i) {
      auto p = r.ring.Reserve(64 << 10);
      ASSERT_TRUE(p.has_value());
      got.push_back(*p);
    }
    EXPECT_EQ(got[0] % (1 << 20), 0u) << "round " << round;
    for (uint64_t p : got) r.ring.Release(p, 64 << 10);
  }
}

TEST(ShmRingTest, TheRestSkippedAtARestartCountsAsRead) {
  Ring r(1024);
  auto a = r.ring.Reserve(100);
  ASSERT_TRUE(a.has_value());
  r.ring.Release(*a, 100);
  auto b = r.ring.Reserve(100);  // Everything read: back to the start (1024), skipping 100..1024.
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*b, 1024u);
  // With b unread, the rest of the ring is free: the skipped bytes were never written.
  auto c = r.ring.Reserve(800);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, 1152u);
  EXPECT_FALSE(r.ring.Reserve(100).has_value());
}

TEST(ShmRingTest, RefusesWhatCannotFitAndClampsABogusCounter) {
  Ring r(4096);
  EXPECT_FALSE(r.ring.Reserve(0).has_value());
  EXPECT_FALSE(r.ring.Reserve(4097).has_value());
  auto a = r.ring.Reserve(4096);
  ASSERT_TRUE(a.has_value());
  // A reader claiming to have consumed far more than was written cannot make the writer
  // overwrite the unread payload: the counter is clamped to what was written.
  r.consumed = 1ull << 40;
  auto b = r.ring.Reserve(64);
  ASSERT_TRUE(b.has_value());  // Treated as "everything read".
  r.consumed = 0;              // And one going backwards only makes the ring look full.
  EXPECT_FALSE(r.ring.Reserve(64).has_value());
}

TEST(ShmRingTest, LocateRejectsPayloadsOutsideTheRing) {
  Ring r(4096);
  EXPECT_TRUE(r.ring.Locate(0, 4096).ok());
  EXPECT_TRUE(r.ring.Locate(4096 * 7 + 64, 100).ok());
  auto past_end = r.ring.Locate(4000, 200);
  EXPECT_TRUE(absl::IsInvalidArgument(past_end.status()));
  EXPECT_TRUE(absl::StrContains(past_end.status().message(), "does not lie in the ring"));
  EXPECT_FALSE(r.ring.Locate(0, 4097).ok());
  EXPECT_FALSE(r.ring.Locate(~0ull, 4096).ok());
}

TEST(ShmAreaTest, BothSidesSeeTheSameBytes) {
  auto worker = ShmArea::Create(100 << 10, 64 << 10);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->request_bytes(), 128u << 10);  // Rounded up to 64 KiB.
  EXPECT_EQ((*worker)->reply_bytes(), 64u << 10);
  auto server = ShmArea::Attach(dup((*worker)->fd()), 128 << 10, 64 << 10, 1 << 20);
  ASSERT_TRUE(server.ok()) << server.status();

  auto p = (*worker)->request().Reserve(5000);
  ASSERT_TRUE(p.has_value());
  std::memset((*worker)->request().At(*p), 7, 5000);
  auto src = (*server)->request().Locate(*p, 5000);
  ASSERT_TRUE(src.ok());
  EXPECT_EQ((*src)[0], 7);
  EXPECT_EQ((*src)[4999], 7);
  (*server)->request().Release(*p, 5000);

  auto q = (*server)->reply().Reserve(64 << 10);
  ASSERT_TRUE(q.has_value());
  std::memset((*server)->reply().At(*q), 9, 64 << 10);
  auto back = (*worker)->reply().Locate(*q, 64 << 10);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)[(64 << 10) - 1], 9);
  // The worker's request ring sees the server's release: the whole ring is free again.
  EXPECT_TRUE((*worker)->request().Reserve(128 << 10).has_value());
}

TEST(ShmAreaTest, AttachRefusesMemoryThatCouldShrinkOrDoesNotMatch) {
  // Not sealed: a worker could truncate it under the server, which would then fault.
  int fd = memfd_create("test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096 + 2 * 65536), 0);
  auto unsealed = ShmArea::Attach(fd, 65536, 65536, 1 << 20);
  EXPECT_TRUE(absl::IsInvalidArgument(unsealed.status()));
  EXPECT_TRUE(absl::StrContains(unsealed.status().message(), "not sealed")) << unsealed.status();

  auto area = ShmArea::Create(65536, 65536);
  ASSERT_TRUE(area.ok());
  auto wrong_size = ShmArea::Attach(dup((*area)->fd()), 65536, 131072, 1 << 20);
  EXPECT_TRUE(absl::StrContains(wrong_size.status().message(), "not 200704"))
      << wrong_size.status();
  auto too_big = ShmArea::Attach(dup((*area)->fd()), 65536, 65536, 100000);
  EXPECT_TRUE(absl::StrContains(too_big.status().message(), "the limit is 100000"))
      << too_big.status();
  auto unaligned = ShmArea::Attach(dup((*area)->fd()), 65535, 65537, 1 << 20);
  EXPECT_FALSE(unaligned.ok());

  // Sealed and the right size, but not a pscluster area.
  int other = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(other, 0);
  ASSERT_EQ(ftruncate(other, 4096 + 2 * 65536), 0);
  ASSERT_EQ(fcntl(other, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto foreign = ShmArea::Attach(other, 65536, 65536, 1 << 20);
  EXPECT_TRUE(absl::StrContains(foreign.status().message(), "control page")) << foreign.status();

  // A descriptor that is not memory at all.
  int pipes[2];
  ASSERT_EQ(pipe(pipes), 0);
  close(pipes[1]);
  EXPECT_FALSE(ShmArea::Attach(pipes[0], 65536, 65536, 1 << 20).ok());
}

}  // namespace
}  // namespace pscluster
