// The scheduler's web status page and the JSON it reads, over HTTP (--http_listen): read-only,
// built from the same handlers as the Scheduler gRPC service (ClusterStatus, GetShardMap).
//
//   /                  the page (HTML, CSS and JavaScript embedded in the binary; no outside
//                      fetch): nodes, jobs, a job's curves, events, waits and shard heat map
//   /api/jobs          {"jobs": [Job...], "now_unix_ms", "scheduler_version"} (no history)
//   /api/nodes         {"nodes": [NodeStatus...], "now_unix_ms", "scheduler_version"}
//   /api/jobs/JOB      {"job": Job with its history, "shard_map": ShardMap (absent until
//                      placed), "shard_loads": [ShardLoad...], "nodes": [...], "now_unix_ms"}
//
// JSON is protobuf's JSON mapping with the .proto field names (int64 fields are strings). With a
// token file the API answers only a bearer token whose identity may call ClusterStatus (viewer or
// admin): 401 without one, 403 for another role. The page itself holds no data and is served to
// anyone; it asks for a token when the API answers 401.
//
// Every scheduler of several (ha_scheduler.h) serves it: the leader from its own handlers, a
// follower from the leader's ClusterStatus (asked with the caller's token) and from its view of
// etcd (shard maps).
//
// Thread-safe: Handle() runs on the HTTP server's threads.
#ifndef PSCLUSTER_SCHEDULER_STATUS_HTTP_H_
#define PSCLUSTER_SCHEDULER_STATUS_HTTP_H_

#include "common/authz.h"
#include <memory>
#include <string>

#include "common/http_server.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

// Where the page's data comes from. `authorization` is the HTTP caller's Authorization header
// ("" = none), for a source that asks another scheduler on the caller's behalf.
class StatusSource {
 public:
  virtual ~StatusSource() = default;
  virtual absl::Status ClusterStatus(const v1::ClusterStatusRequest& req,
                                     v1::ClusterStatusResponse* resp,
                                     const std::string& authorization) const = 0;
  virtual absl::Status GetShardMap(const v1::GetShardMapRequest& req, v1::ShardMap* resp,
                                   const std::string& authorization) const = 0;
};

class StatusHttp {
 public:
  // The page of `scheduler` (its own handlers).
  // REQUIRES: `scheduler` and `authz` (nullptr: no checks) outlive this object.
  StatusHttp(Scheduler* scheduler, const Authorizer* authz);
  // The page of another source (a follower's). REQUIRES: `authz` outlives this object.
  StatusHttp(std::unique_ptr<StatusSource> source, const Authorizer* authz)
      : source_(std::move(source)), authz_(authz) {}

  HttpResponse Handle(const HttpRequest& req) const;

 private:
  HttpResponse Jobs(const std::string& authorization) const;
  HttpResponse Nodes(const std::string& authorization) const;
  HttpResponse Job(const std::string& job_id, const std::string& authorization) const;

  const std::unique_ptr<StatusSource> source_;
  const Authorizer* const authz_;
};

// The page, embedded at build time from scheduler/status_page.html.
extern const char kStatusPageHtml[];

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_STATUS_HTTP_H_
