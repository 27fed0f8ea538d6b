#include "scheduler/status_http.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace pscluster::scheduler {
namespace {

// The page's scripts and styles are inline; nothing may be fetched from elsewhere.
constexpr char kPageSecurity[] =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'";

std::string Json(const google::protobuf::Message& m) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(m, &out, o).ok()) return "null";
  return out;
}

std::string Quoted(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(&out, "\\u00", c < 0x10 ? "0" : "1",
                          std::string(1, "0123456789abcdef"[c & 15]));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

HttpResponse JsonResponse(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = std::move(body);
  r.headers.push_back({"Cache-Control", "no-store"});
  return r;
}

HttpResponse ErrorResponse(const absl::Status& s) {
  int status = 500;
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
      status = 404;
      break;
    case absl::StatusCode::kInvalidArgument:
      status = 400;
      break;
    case absl::StatusCode::kUnauthenticated:
      status = 401;
      break;
    case absl::StatusCode::kPermissionDenied:
      status = 403;
      break;
    case absl::StatusCode::kUnavailable:
      status = 503;
      break;
    default:
      break;
  }
  HttpResponse r = JsonResponse(status, absl::StrCat("{\"error\": ", Quoted(s.message()), "}"));
  if (status == 401) r.headers.push_back({"WWW-Authenticate", "Bearer realm=\"pscluster\""});
  return r;
}

// The scheduler's own handlers (the caller was checked by Handle()).
class SchedulerStatusSource final : public StatusSource {
 public:
  explicit SchedulerStatusSource(Scheduler* scheduler) : scheduler_(scheduler) {}
  absl::Status ClusterStatus(const v1::ClusterStatusRequest& req, v1::ClusterStatusResponse* resp,
                             const std::string&) const override {
    return scheduler_->ClusterStatus(req, resp);
  }
  absl::Status GetShardMap(const v1::GetShardMapRequest& req, v1::ShardMap* resp,
                           const std::string&) const override {
    return scheduler_->GetShardMap(req, resp);
  }

 private:
  Scheduler* const scheduler_;
};

}  // namespace

StatusHttp::StatusHttp(Scheduler* scheduler, const Authorizer* authz)
    : source_(std::make_unique<SchedulerStatusSource>(scheduler)), authz_(authz) {}

HttpResponse StatusHttp::Handle(const HttpRequest& req) const {
  if (req.path == "/" || req.path == "/index.html") {
    HttpResponse r;
    r.content_type = "text/html; charset=utf-8";
    r.body = kStatusPageHtml;
    r.headers.push_back({"Content-Security-Policy", kPageSecurity});
    r.headers.push_back({"X-Frame-Options", "DENY"});
    r.headers.push_back({"Referrer-Policy", "no-referrer"});
    return r;
  }
  if (!absl::StartsWith(req.path, "/api/")) {
    HttpResponse r;
    r.status = 404;
    r.body = "not found: the status page is at /\n";
    return r;
  }
  auto header = req.headers.find("authorization");
  const std::string authorization = header == req.headers.end() ? "" : header->second;
  if (authz_ != nullptr) {
    absl::Status s = authz_->CheckBearer(authorization, "pscluster.v1.Scheduler.ClusterStatus");
    if (!s.ok()) return ErrorResponse(s);
  }
  if (req.path == "/api/jobs") return Jobs(authorization);
  if (req.path == "/api/nodes") return Nodes(authorization);
  constexpr absl::string_view kJob = "/api/jobs/";
  if (absl::StartsWith(req.path, kJob) && req.path.size() > kJob.size()) {
    return Job(req.path.substr(kJob.size()), authorization);
  }
  return ErrorResponse(absl::NotFoundError(
      absl::StrCat("no endpoint ", req.path, " (try /api/jobs, /api/jobs/JOB, /api/nodes)")));
}

HttpResponse StatusHttp::Jobs(const std::string& authorization) const {
  v1::ClusterStatusResponse st;
  absl::Status s = source_->ClusterStatus(v1::ClusterStatusRequest(), &st, authorization);
  if (!s.ok()) return ErrorResponse(s);
  v1::ClusterStatusResponse jobs;
  *jobs.mutable_jobs() = std::move(*st.mutable_jobs());
  jobs.set_now_unix_ms(st.now_unix_ms());
  jobs.set_scheduler_version(st.scheduler_version());
  return JsonResponse(200, Json(jobs));
}

HttpResponse StatusHttp::Nodes(const std::string& authorization) const {
  v1::ClusterStatusResponse st;
  absl::Status s = source_->ClusterStatus(v1::ClusterStatusRequest(), &st, authorization);
  if (!s.ok()) return ErrorResponse(s);
  v1::ClusterStatusResponse nodes;
  *nodes.mutable_nodes() = std::move(*st.mutable_nodes());
  nodes.set_now_unix_ms(st.now_unix_ms());
  nodes.set_scheduler_version(st.scheduler_version());
  return JsonResponse(200, Json(nodes));
}

HttpResponse StatusHttp::Job(const std::string& job_id,
                             const std::string& authorization) const {
  v1::ClusterStatusRequest req;
  req.set_job_id(job_id);
  req.set_include_history(true);
  v1::ClusterStatusResponse st;
  absl::Status s = source_->ClusterStatus(req, &st, authorization);
  if (!s.ok()) return ErrorResponse(s);
  if (st.jobs_size() != 1) {
    return ErrorResponse(absl::NotFoundError(absl::StrCat("job_id: no job '", job_id, "'")));
  }
  std::string body = absl::StrCat("{\"job\": ", Json(st.jobs(0)));
  v1::GetShardMapRequest map_req;
  map_req.set_job_id(job_id);
  v1::ShardMap map;
  if (source_->GetShardMap(map_req, &map, authorization).ok()) {
    absl::StrAppend(&body, ", \"shard_map\": ", Json(map));
  }
  v1::ClusterStatusResponse rest;  // Shard loads and nodes, as the proto maps them.
  *rest.mutable_shard_loads() = std::move(*st.mutable_shard_loads());
  *rest.mutable_nodes() = std::move(*st.mutable_nodes());
  rest.set_now_unix_ms(st.now_unix_ms());
  rest.set_scheduler_version(st.scheduler_version());
  std::string tail = Json(rest);  // {"nodes": [...], ...}
  absl::StrAppend(&body, ", ", tail.substr(1));
  return JsonResponse(200, std::move(body));
}

}  // namespace pscluster::scheduler
