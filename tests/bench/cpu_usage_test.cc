#include "tests/bench/cpu_usage.h"

#include <fstream>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pscluster::bench {
namespace {

TEST(MachineBusyTicksTest, SumsTheBusyColumnsOfTheCpuLine) {
  // user nice system idle iowait irq softirq steal guest guest_nice
  EXPECT_EQ(MachineBusyTicks("cpu  100 2 30 5000 7 1 4 9 0 0\ncpu0 50 1 15 2500 3 0 2 4 0 0\n"),
            100 + 2 + 30 + 1 + 4);
}

TEST(MachineBusyTicksTest, RefusesOtherLines) {
  EXPECT_FALSE(MachineBusyTicks("cpu0 50 1 15 2500 3 0 2 4 0 0").has_value());
  EXPECT_FALSE(MachineBusyTicks("cpu 1 2 3").has_value());
  EXPECT_FALSE(MachineBusyTicks("cpu 1 2 x 4 5 6 7 8").has_value());
  EXPECT_FALSE(MachineBusyTicks("").has_value());
}

TEST(ProcessTicksTest, ReadsUtimeAndStimeAfterACommandNameWithSpacesAndParens) {
  const std::string line =
      "4242 (ps (server) x) S 1 4242 4242 0 -1 4194560 1200 0 0 0 321 45 0 0 20 0 9 0 777 "
      "123456789 2345 18446744073709551615";
  EXPECT_EQ(ProcessTicks(line), 321 + 45);
}

TEST(ProcessTicksTest, RefusesMalformedLines) {
  EXPECT_FALSE(ProcessTicks("4242 ps S 1").has_value());
  EXPECT_FALSE(ProcessTicks("4242 (ps) S 1 2 3").has_value());
  EXPECT_FALSE(ProcessTicks("4242 (ps) S 1 4242 4242 0 -1 4194560 1200 0 0 0 u 45").has_value());
}

TEST(ProcfsTest, ThisMachinesFilesParse) {
  std::ifstream stat("/proc/stat"), self("/proc/self/stat");
  std::string a, b;
  std::getline(stat, a);
  std::getline(self, b);
  EXPECT_TRUE(MachineBusyTicks(a).has_value()) << a;
  EXPECT_TRUE(ProcessTicks(b).has_value()) << b;
}

TEST(CpuSamplerTest, ASpinningThreadShowsAsThisProcessesCpuTime) {
  CpuSampler sampler({0, 0});  // This process, twice: the columns follow the pids given.
  absl::SleepFor(absl::Milliseconds(30));
  const absl::Time from = absl::Now();
  volatile double x = 0;
  while (absl::Now() - from < absl::Milliseconds(400)) x = x + 1;
  const absl::Time to = absl::Now();
  CpuSampler::Usage u = sampler.Between(from, to);
  ASSERT_EQ(u.process_sec.size(), 2u);
  EXPECT_NEAR(u.wall_sec, absl::ToDoubleSeconds(to - from), 1e-9);
  // Even on a crowded machine a spinning thread gets some of 400 ms; it cannot use more than
  // the window (plus a clock tick either side).
  EXPECT_GT(u.process_sec[0], 0.02);
  EXPECT_LT(u.process_sec[0], u.wall_sec + 0.05);
  EXPECT_DOUBLE_EQ(u.process_sec[0], u.process_sec[1]);
  EXPECT_GT(u.machine_busy_sec, 0.02);
  EXPECT_LE(u.cores_busy(), std::thread::hardware_concurrency() + 0.5);
}

TEST(CpuSamplerTest, AnUnreadableProcessCountsAsZero) {
  CpuSampler sampler({0x7ffffff0});  // No such pid.
  const absl::Time from = absl::Now();
  absl::SleepFor(absl::Milliseconds(50));
  CpuSampler::Usage u = sampler.Between(from, absl::Now());
  ASSERT_EQ(u.process_sec.size(), 1u);
  EXPECT_EQ(u.process_sec[0], 0);
}

}  // namespace
}  // namespace pscluster::bench
