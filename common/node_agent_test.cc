#include "common/node_agent.h"

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace pscluster {
namespace {

// A scheduler that answers registrations from a script and records every call.
class FakeScheduler {
 public:
  NodeAgentCalls Calls() {
    NodeAgentCalls c;
    c.register_node = [this](const std::string& id) -> absl::StatusOr<v1::RegisterNodeResponse> {
      absl::MutexLock l(&mu_);
      register_ids_.push_back(id);
      if (!register_script_.empty()) {
        absl::Status s = register_script_.front();
        register_script_.pop_front();
        if (!s.ok()) return s;
      }
      v1::RegisterNodeResponse r;
      r.set_node_id(id.empty() ? "node-7" : id);
      r.set_lease_ms(600);
      r.set_heartbeat_interval_ms(heartbeat_ms_);
      return r;
    };
    c.heartbeat = [this](const std::string& id) {
      absl::MutexLock l(&mu_);
      heartbeat_ids_.push_back(id);
      if (!heartbeat_script_.empty()) {
        absl::Status s = heartbeat_script_.front();
        heartbeat_script_.pop_front();
        return s;
      }
      return absl::OkStatus();
    };
    c.deregister = [this](const std::string& id) {
      absl::MutexLock l(&mu_);
      deregistered_.push_back(id);
      return absl::OkStatus();
    };
    return c;
  }

  absl::Mutex mu_;
  std::deque<absl::Status> register_script_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> heartbeat_script_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> register_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> heartbeat_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> deregistered_ ABSL_GUARDED_BY(mu_);
  uint32_t heartbeat_ms_ = 10;
};

NodeAgentOptions Options() {
  NodeAgentOptions o;
  o.component = "test";
  o.scheduler = "sched:7070";
  o.register_timeout = absl::Seconds(5);
  o.initial_backoff = absl::Milliseconds(1);
  o.max_backoff = absl::Milliseconds(4);
  return o;
}

TEST(NodeAgentTest, RetriesAnUnreachableSchedulerThenHeartbeatsAtItsInterval) {
  FakeScheduler s;
  {
    absl::MutexLock l(&s.mu_);
    s.register_script_ = {absl::UnavailableError("connect failed"),
                          absl::DeadlineExceededError("slow")};
  }
  NodeAgent agent(Options(), s.Calls());
  ASSERT_TRUE(agent.Register().ok());
  EXPECT_EQ(agent.node_id(), "node-7");
  EXPECT_EQ(agent.heartbeat_interval(), absl::Milliseconds(10));
  agent.StartHeartbeats();
  absl::SleepFor(absl::Milliseconds(200));
  agent.Stop();
  absl::MutexLock l(&s.mu_);
  EXPECT_EQ(s.register_ids_.size(), 3u);
  EXPECT_GE(s.heartbeat_ids_.size(), 3u);
  for (const std::string& id : s.heartbeat_ids_) EXPECT_EQ(id, "node-7");
  EXPECT_EQ(s.deregistered_, std::vector<std::string>{"node-7"});
}

// A refusal that retrying does not change ends registration at once, with the scheduler's words.
TEST(NodeAgentTest, ARefusalIsNotRetried) {
  FakeScheduler s;
  {
    absl::MutexLock l(&s.mu_);
    s.register_script_ = {absl::PermissionDeniedError("role node needed")};
  }
  NodeAgent agent(Options(), s.Calls());
  absl::Status st = agent.Register();
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(st.message(), "role node needed");
  absl::MutexLock l(&s.mu_);
  EXPECT_EQ(s.register_ids_.size(), 1u);
}

TEST(NodeAgentTest, GivesUpAfterTheTimeoutNamingTheScheduler) {
  FakeScheduler s;
  {
    absl::MutexLock l(&s.mu_);
    for (int i = 0; i < 1000; ++i) s.register_script_.push_back(absl::UnavailableError("refused"));
  }
  NodeAgentOptions o = Options();
  o.register_timeout = absl::Milliseconds(50);
  NodeAgent agent(o, s.Calls());
  absl::Status st = agent.Register();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("could not register with scheduler sched:7070 within 50ms"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("refused"), std::string::npos);
  // Backoff: far fewer attempts than a busy loop would make.
  absl::MutexLock l(&s.mu_);
  EXPECT_LT(s.register_ids_.size(), 40u);
  EXPECT_GE(s.register_ids_.size(), 3u);
}

// NOT_FOUND on a heartbeat (the scheduler forgot the node) registers again with the same id.
TEST(NodeAgentTest, ANodeTheSchedulerForgotRegistersAgainWithItsId) {
  FakeScheduler s;
  {
    absl::MutexLock l(&s.mu_);
    s.heartbeat_script_ = {absl::OkStatus(), absl::NotFoundError("unknown node")};
  }
  NodeAgent agent(Options(), s.Calls());
  std::atomic<bool> fatal{false};
  agent.StartAsync([&](absl::Status) { fatal = true; });
  for (int i = 0; i < 500; ++i) {
    {
      absl::MutexLock l(&s.mu_);
      if (s.register_ids_.size() >= 2 && s.heartbeat_ids_.size() >= 3) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  agent.Stop();
  EXPECT_FALSE(fatal);
  absl::MutexLock l(&s.mu_);
  ASSERT_GE(s.register_ids_.size(), 2u);
  EXPECT_EQ(s.register_ids_[0], "");
  EXPECT_EQ(s.register_ids_[1], "node-7");
}

TEST(NodeAgentTest, StartAsyncReportsAFatalRegistrationOnce) {
  FakeScheduler s;
  {
    absl::MutexLock l(&s.mu_);
    s.register_script_ = {absl::InvalidArgumentError("address: empty")};
  }
  NodeAgent agent(Options(), s.Calls());
  absl::Notification done;
  absl::Status got;
  agent.StartAsync([&](absl::Status st) {
    got = st;
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  agent.Stop();
  EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument);
  absl::MutexLock l(&s.mu_);
  EXPECT_TRUE(s.deregistered_.empty()) << "never registered, nothing to deregister";
}

// Stop() during the backoff of an unreachable scheduler returns promptly, without on_fatal.
TEST(NodeAgentTest, StopEndsARegistrationUnderWay) {
  FakeScheduler s;
  {
    absl::MutexLock l(&s.mu_);
    for (int i = 0; i < 1000; ++i) s.register_script_.push_back(absl::UnavailableError("down"));
  }
  NodeAgentOptions o = Options();
  o.register_timeout = absl::Hours(1);
  o.initial_backoff = o.max_backoff = absl::Seconds(30);
  NodeAgent agent(o, s.Calls());
  std::atomic<bool> fatal{false};
  agent.StartAsync([&](absl::Status) { fatal = true; });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time t0 = absl::Now();
  agent.Stop();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  EXPECT_FALSE(fatal);
}

}  // namespace
}  // namespace pscluster
