#include "server/backup_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pscluster {
namespace {

// A transport that runs `send` (the backup's side of each call, in this test).
class FnTransport final : public BackupTransport {
 public:
  using Fn = std::function<absl::Status(const std::string&, const v1::ReplicateRequest&,
                                        const Payload&)>;
  explicit FnTransport(Fn fn) : fn_(std::move(fn)) {}
  absl::Status Send(const std::string& address, const v1::ReplicateRequest& req,
                    const Payload& values) override {
    return fn_(address, req, values);
  }

 private:
  const Fn fn_;
};

v1::ReplicateRequest Chunk(int step, int block) {
  v1::ReplicateRequest r;
  r.mutable_chunk()->mutable_tag()->set_step(step);
  r.mutable_chunk()->mutable_slice()->set_block(block);
  return r;
}

v1::ReplicateRequest EndOfStep(int step) {
  v1::ReplicateRequest r;
  r.mutable_chunk()->mutable_tag()->set_step(step);
  r.mutable_chunk()->set_end_of_step(true);
  return r;
}

// Several calls travel at once, but an end-of-step marker starts only once every chunk queued
// before it has arrived, and Flush() returns only once everything queued before it has.
TEST(BackupQueueTest, MarkersWaitForTheChunksBeforeThemAndFlushWaitsForAll) {
  absl::Mutex mu;
  std::set<std::pair<int, int>> arrived;  // (step, block)
  std::vector<std::string> violations;
  std::atomic<int> in_flight{0}, most_in_flight{0};
  std::mt19937 rng(7);
  std::vector<int> delays(1000);
  for (int& d : delays) d = static_cast<int>(rng() % 3);
  std::atomic<int> call{0};
  auto send = [&](const std::string&, const v1::ReplicateRequest& r, const Payload&) {
    const int now = ++in_flight;
    for (int m = most_in_flight.load(); now > m && !most_in_flight.compare_exchange_weak(m, now);) {
    }
    absl::SleepFor(absl::Milliseconds(delays[call++ % delays.size()]));
    absl::MutexLock l(&mu);
    const int step = static_cast<int>(r.chunk().tag().step());
    if (r.chunk().end_of_step()) {
      for (int b = 0; b < 8; ++b) {
        if (!arrived.count({step, b})) {
          violations.push_back("end of step " + std::to_string(step) + " before block " +
                               std::to_string(b));
        }
      }
    } else {
      arrived.insert({step, static_cast<int>(r.chunk().slice().block())});
    }
    --in_flight;
    return absl::OkStatus();
  };
  BackupQueue q("backup:1", std::make_shared<FnTransport>(send));
  for (int step = 0; step < 20; ++step) {
    for (int b = 0; b < 8; ++b) q.Enqueue(Chunk(step, b));
    q.Enqueue(EndOfStep(step));
    if (step % 5 == 4) {
      ASSERT_TRUE(q.Flush(absl::Seconds(30)).ok());
      absl::MutexLock l(&mu);
      EXPECT_EQ(arrived.size(), static_cast<size_t>(8 * (step + 1)));
    }
  }
  ASSERT_TRUE(q.Flush(absl::Seconds(30)).ok());
  absl::MutexLock l(&mu);
  EXPECT_EQ(arrived.size(), 160u);
  EXPECT_TRUE(violations.empty()) << violations.front();
  EXPECT_GT(most_in_flight.load(), 1) << "chunks travel several at a time";
}

// A call that keeps failing breaks the queue: the flush waiting for it fails naming the backup,
// and so does every later one; a failure that clears within the retry window is no failure.
TEST(BackupQueueTest, ACallThatKeepsFailingBreaksTheQueue) {
  std::atomic<int> fails_left{3};
  std::atomic<bool> down{false};
  BackupQueue q("10.0.0.9:7100",
                std::make_shared<FnTransport>(
                    [&](const std::string&, const v1::ReplicateRequest&, const Payload&) {
                      if (down.load() || fails_left.fetch_sub(1) > 0) {
                        return absl::UnavailableError("connection refused");
                      }
                      return absl::OkStatus();
                    }),
                absl::Milliseconds(400));
  q.Enqueue(Chunk(0, 0));
  EXPECT_TRUE(q.Flush(absl::Seconds(10)).ok()) << "three failures, then delivered";
  down = true;
  q.Enqueue(Chunk(0, 1));
  q.Enqueue(EndOfStep(0));
  absl::Status st = q.Flush(absl::Seconds(10));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("replicating to the backup at 10.0.0.9:7100: connection refused"),
            std::string::npos)
      << st;
  down = false;
  q.Enqueue(Chunk(1, 0));
  EXPECT_EQ(q.Flush(absl::Seconds(10)).code(), absl::StatusCode::kUnavailable)
      << "broken until the shard map replaces the queue";
}

}  // namespace
}  // namespace pscluster
