// Heartbeats for scheduler tests that drive the control loop on fake time.
#ifndef PSCLUSTER_SCHEDULER_TESTING_HEARTBEATS_H_
#define PSCLUSTER_SCHEDULER_TESTING_HEARTBEATS_H_

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "scheduler/scheduler.h"

namespace pscluster::scheduler::testing {

// Every node of `ids` but `silent` ("" = none) heartbeats once; a refused heartbeat is a test
// failure.
inline void HeartbeatAllBut(Scheduler& sched, const std::vector<std::string>& ids,
                            const std::string& silent) {
  for (const std::string& n : ids) {
    if (n == silent) continue;
    v1::HeartbeatRequest hb;
    hb.set_node_id(n);
    v1::HeartbeatResponse r;
    absl::Status s = sched.Heartbeat(hb, &r);
    ASSERT_TRUE(s.ok()) << n << ": " << s;
  }
}

}  // namespace pscluster::scheduler::testing

#endif  // PSCLUSTER_SCHEDULER_TESTING_HEARTBEATS_H_
