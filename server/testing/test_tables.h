// Table and job specs shared by the server's tests.
#ifndef PSCLUSTER_SERVER_TESTING_TEST_TABLES_H_
#define PSCLUSTER_SERVER_TESTING_TEST_TABLES_H_

#include <cstdlib>
#include <string>
#include <vector>

#include "proto/ps.pb.h"
#include "server/initializer.h"

namespace pscluster {
namespace testing {

inline v1::OptimizerSpec Optimizer(v1::OptimizerSpec::Kind kind, float lr) {
  v1::OptimizerSpec o;
  o.set_kind(kind);
  o.set_learning_rate(lr);
  return o;
}

inline v1::ConsistencySpec Mode(v1::ConsistencySpec::Mode mode, uint32_t staleness = 0) {
  v1::ConsistencySpec c;
  c.set_mode(mode);
  c.set_staleness(staleness);
  return c;
}

// The first `n` initial values of a dense table (what a server holds before any push).
inline std::vector<float> InitialDense(const v1::TableSpec& spec, uint64_t n) {
  std::vector<float> v(n);
  Initializer(spec).FillDense(0, n, v.data());
  return v;
}

// The initial rows of `keys` of a sparse table, one after the other.
inline std::vector<float> InitialRows(const v1::TableSpec& spec,
                                      const std::vector<uint64_t>& keys) {
  std::vector<float> v(keys.size() * spec.row_width());
  Initializer init(spec);
  for (size_t i = 0; i < keys.size(); ++i) {
    init.FillRow(keys[i], spec.row_width(), v.data() + i * spec.row_width());
  }
  return v;
}

inline v1::TableSpec DenseSpec(const std::string& name, std::vector<uint64_t> dims,
                               v1::OptimizerSpec opt, uint64_t block_elems = 0) {
  v1::TableSpec t;
  t.set_name(name);
  t.set_kind(v1::DENSE);
  for (auto d : dims) t.mutable_shape()->add_dims(d);
  t.set_block_elems(block_elems);
  t.mutable_init()->set_kind(v1::InitializerSpec::UNIFORM);
  t.mutable_init()->set_low(-0.5f);
  t.mutable_init()->set_high(0.5f);
  t.mutable_init()->set_seed(7);
  *t.mutable_optimizer() = opt;
  return t;
}

inline v1::TableSpec SparseSpec(const std::string& name, uint32_t width, uint64_t key_space,
                                v1::OptimizerSpec opt) {
  v1::TableSpec t;
  t.set_name(name);
  t.set_kind(v1::SPARSE);
  t.set_row_width(width);
  t.set_key_space(key_space);
  t.mutable_init()->set_kind(v1::InitializerSpec::NORMAL);
  t.mutable_init()->set_stddev(0.1f);
  t.mutable_init()->set_seed(3);
  *t.mutable_optimizer() = opt;
  return t;
}

inline v1::CreateTablesRequest CreateRequest(const std::string& job,
                                             std::vector<v1::TableSpec> tables,
                                             v1::ConsistencySpec::Mode mode, uint32_t workers,
                                             uint32_t staleness = 0, bool aggregate = false) {
  v1::CreateTablesRequest r;
  r.set_job_id(job);
  for (auto& t : tables) *r.add_tables() = t;
  r.mutable_consistency()->set_mode(mode);
  r.mutable_consistency()->set_staleness(staleness);
  r.mutable_consistency()->set_aggregate(aggregate);
  r.set_num_workers(workers);
  r.set_num_virtual_shards(16);
  return r;
}

// A shard map of `job` spreading 16 virtual shards round-robin over servers s0..s{n-1}.
inline v1::ShardMap RoundRobinMap(const std::string& job, uint64_t epoch,
                                  const std::vector<std::string>& addresses,
                                  uint32_t shards = 16) {
  v1::ShardMap m;
  m.set_job_id(job);
  m.set_epoch(epoch);
  m.set_num_virtual_shards(shards);
  for (uint32_t s = 0; s < shards; ++s) {
    auto* a = m.add_assignments();
    a->set_shard(s);
    a->set_primary("s" + std::to_string(s % addresses.size()));
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    auto* e = m.add_servers();
    e->set_node_id("s" + std::to_string(i));
    e->set_address(addresses[i]);
  }
  return m;
}

inline std::string TempDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  return std::string(t ? t : "/tmp") + "/" + name;
}

// RoundRobinMap over two servers, each shard backed up on the other one.
inline v1::ShardMap ReplicatedMap(const std::string& job, uint64_t epoch,
                                  const std::vector<std::string>& addresses) {
  v1::ShardMap m = RoundRobinMap(job, epoch, addresses);
  for (auto& a : *m.mutable_assignments()) a.add_backups(a.primary() == "s0" ? "s1" : "s0");
  return m;
}

}  // namespace testing
}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_TESTING_TEST_TABLES_H_
