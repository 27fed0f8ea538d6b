#include "tests/cluster/exactly_once.h"

#include <dirent.h>

#include <cstdlib>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "common/checkpoint_file.h"

namespace pscluster::testing {

std::string NewestCheckpoint(const std::string& dir, const std::string& server) {
  std::string best;
  int64_t best_step = -1;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return best;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    const std::string head = server + "-step";
    // Not a file being written (NAME.ckpt.tmp.*).
    if (name.rfind(head, 0) != 0 || name.size() < 5 || name.substr(name.size() - 5) != ".ckpt") {
      continue;
    }
    int64_t step = std::atoll(name.c_str() + head.size());
    if (step > best_step) {
      best_step = step;
      best = dir + "/" + name;
    }
  }
  closedir(d);
  return best;
}

void ExpectEveryUpdateAppliedOnce(const std::string& dir, const v1::Job& job) {
  int blocks = 0;
  for (const std::string& s : job.servers()) {
    // A server writes its periodic checkpoints in the background: the last one may land a
    // moment after the job was reported done.
    std::string path = NewestCheckpoint(dir, s);
    absl::StatusOr<v1::CheckpointHeader> h = ReadCheckpointHeader(path);
    for (const absl::Time end = absl::Now() + absl::Seconds(30);
         absl::Now() < end && (!h.ok() || h->step() < job.progress().total_steps());
         absl::SleepFor(absl::Milliseconds(50))) {
      path = NewestCheckpoint(dir, s);
      h = ReadCheckpointHeader(path);
    }
    ASSERT_FALSE(path.empty()) << s;
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->step(), job.progress().total_steps()) << path;
    for (const auto& t : h->tables()) {
      for (const auto& b : t.blocks()) {
        EXPECT_EQ(b.updates(), 2 * h->step()) << path << " " << t.spec().name() << " " << b.block();
        ++blocks;
      }
    }
  }
  EXPECT_GE(blocks, 4);  // fc1 and out, weights and biases.
}

}  // namespace pscluster::testing
