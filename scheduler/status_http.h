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
// Thread-safe: Handle() runs on the HTTP server's threads.
#ifndef PSCLUSTER_SCHEDULER_STATUS_HTTP_H_
#define PSCLUSTER_SCHEDULER_STATUS_HTTP_H_

#include "common/authz.h"
#include "common/http_server.h"
#include "scheduler/scheduler.h"

namespace pscluster::scheduler {

class StatusHttp {
 public:
  // REQUIRES: `scheduler` and `authz` (nullptr: no checks) outlive this object.
  StatusHttp(Scheduler* scheduler, const Authorizer* authz)
      : scheduler_(scheduler), authz_(authz) {}

  HttpResponse Handle(const HttpRequest& req) const;

 private:
  HttpResponse Jobs() const;
  HttpResponse Nodes() const;
  HttpResponse Job(const std::string& job_id) const;

  Scheduler* const scheduler_;
  const Authorizer* const authz_;
};

// The page, embedded at build time from scheduler/status_page.html.
extern const char kStatusPageHtml[];

}  // namespace pscluster::scheduler

#endif  // PSCLUSTER_SCHEDULER_STATUS_HTTP_H_
