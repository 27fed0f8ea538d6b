#include "scheduler/store.h"

#include <sqlite3.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/data_auth.h"

namespace pscluster::scheduler {
namespace {

// 2: jobs.owner.
constexpr int kSchemaVersion = 2;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (node_id TEXT PRIMARY KEY, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  job_id TEXT PRIMARY KEY,
  submitted_ms INTEGER NOT NULL,
  client_token TEXT NOT NULL DEFAULT '',
  record BLOB NOT NULL,
  owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS shard_maps (
  job_id TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  map BLOB NOT NULL,
  PRIMARY KEY (job_id, epoch));
)sql";

// A prepared statement, finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void Text(int i, absl::string_view s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Blob(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Int(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  int Step() { return sqlite3_step(stmt_); }
  std::string ColumnText(int i) {
    const unsigned char* p = sqlite3_column_text(stmt_, i);
    return p == nullptr ? "" : std::string(reinterpret_cast<const char*>(p),
                                           sqlite3_column_bytes(stmt_, i));
  }
  std::string ColumnBlob(int i) {
    const void* p = sqlite3_column_blob(stmt_, i);
    return p == nullptr ? "" : std::string(static_cast<const char*>(p),
                                           sqlite3_column_bytes(stmt_, i));
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

// The SQLite implementation: WAL mode, one connection behind a mutex, every write one
// transaction.
class SqliteStore final : public Store {
 public:
  static absl::StatusOr<std::unique_ptr<Store>> Open(const StoreOptions& options);
  ~SqliteStore() override;

  absl::StatusOr<uint64_t> NextId(absl::string_view counter) override;
  absl::StatusOr<std::string> ClusterKey() override;
  absl::Status PutNode(const v1::NodeStatus& node) override;
  absl::StatusOr<std::vector<v1::NodeStatus>> LoadNodes() override;
  absl::Status PutJob(const v1::Job& job, absl::string_view client_token,
                      const v1::ShardMap* map, absl::string_view owner) override;
  absl::StatusOr<std::vector<StoredJob>> LoadJobs() override;
  const std::string& path() const override { return path_; }

 private:
  SqliteStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(absl::string_view what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  const std::string path_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  return SqliteStore::Open(options);
}

absl::StatusOr<std::unique_ptr<Store>> SqliteStore::Open(const StoreOptions& options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("--db: a database path is required");
  }
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(options.path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot open the scheduler database ", options.path, ": ", msg,
        " (does the directory exist and is it writable?)"));
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db, options.path));
  absl::MutexLock l(&store->mu_);
  sqlite3_busy_timeout(db, 2000);
  // The first statement that reads the file tells a database from anything else.
  absl::Status s = store->Exec("PRAGMA locking_mode=EXCLUSIVE");
  if (s.ok()) s = store->Exec("PRAGMA journal_mode=WAL");
  if (!s.ok()) return s;
  s = store->Exec(options.full_sync ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
  if (!s.ok()) return s;
  // Takes the exclusive lock now, so that a second scheduler fails here and not later.
  rc = sqlite3_exec(db, "BEGIN EXCLUSIVE; COMMIT;", nullptr, nullptr, nullptr);
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the scheduler database ", options.path,
        " is locked by another process (is another ps_scheduler using it?)"));
  }
  if (rc != SQLITE_OK) return store->Error("lock");
  int version = 0;
  {
    Stmt q(db, "PRAGMA user_version");
    if (!q.ok() || q.Step() != SQLITE_ROW) return store->Error("read the schema version");
    version = sqlite3_column_int(q.get(), 0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the scheduler database ", options.path, " has schema version ", version,
        "; this ps_scheduler understands up to ", kSchemaVersion, " (a newer build wrote it)"));
  }
  s = store->Exec(kSchema);
  if (s.ok() && version == 1) {
    // Written by a build before job owners (its jobs have none): the column and the version
    // change in one transaction.
    s = store->Exec(
        "BEGIN; ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT ''; "
        "PRAGMA user_version=2; COMMIT;");
    if (!s.ok()) sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  if (s.ok()) s = store->Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str());
  if (!s.ok()) return s;
  return std::unique_ptr<Store>(std::move(store));
}

SqliteStore::~SqliteStore() {
  absl::MutexLock l(&mu_);
  sqlite3_close(db_);
}

absl::Status SqliteStore::Exec(const char* sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  if (rc == SQLITE_OK) return absl::OkStatus();
  std::string msg = err ? err : sqlite3_errstr(rc);
  sqlite3_free(err);
  if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT) {
    return absl::DataLossError(
        absl::StrCat("the scheduler database ", path_, " is not a valid database: ", msg));
  }
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the scheduler database ", path_,
        " is locked by another process (is another ps_scheduler using it?)"));
  }
  return absl::InternalError(absl::StrCat("scheduler database ", path_, ": ", msg));
}

absl::Status SqliteStore::Error(absl::string_view what) const {
  int rc = sqlite3_errcode(db_);
  std::string msg = absl::StrCat("scheduler database ", path_, ": cannot ", what, ": ",
                                 sqlite3_errmsg(db_));
  if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT) return absl::DataLossError(msg);
  if (rc == SQLITE_FULL || rc == SQLITE_IOERR) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

absl::StatusOr<std::string> SqliteStore::ClusterKey() {
  absl::StatusOr<std::string> fresh = RandomBytes(kDataSecretBytes);
  if (!fresh.ok()) return fresh.status();
  absl::MutexLock l(&mu_);
  Stmt ins(db_, "INSERT OR IGNORE INTO secrets(name, value) VALUES('cluster_key', ?1)");
  if (!ins.ok()) return Error("prepare the cluster key's insert");
  ins.Blob(1, *fresh);
  if (ins.Step() != SQLITE_DONE) return Error("store the cluster key");
  Stmt q(db_, "SELECT value FROM secrets WHERE name = 'cluster_key'");
  if (!q.ok() || q.Step() != SQLITE_ROW) return Error("read the cluster key");
  std::string key = q.ColumnBlob(0);
  if (key.size() != kDataSecretBytes) {
    return absl::DataLossError(absl::StrCat("the cluster key in ", path_, " has ", key.size(),
                                            " bytes (", kDataSecretBytes, " expected)"));
  }
  return key;
}

absl::StatusOr<uint64_t> SqliteStore::NextId(absl::string_view counter) {
  absl::MutexLock l(&mu_);
  Stmt up(db_,
          "INSERT INTO counters(name, value) VALUES(?1, 1) "
          "ON CONFLICT(name) DO UPDATE SET value = value + 1 RETURNING value");
  if (!up.ok()) return Error("prepare a counter update");
  up.Text(1, counter);
  if (up.Step() != SQLITE_ROW) return Error(absl::StrCat("advance counter ", counter));
  uint64_t v = sqlite3_column_int64(up.get(), 0);
  if (up.Step() != SQLITE_DONE) return Error(absl::StrCat("advance counter ", counter));
  return v;
}

absl::Status SqliteStore::PutNode(const v1::NodeStatus& node) {
  absl::MutexLock l(&mu_);
  Stmt st(db_, "INSERT OR REPLACE INTO nodes(node_id, record) VALUES(?1, ?2)");
  if (!st.ok()) return Error("prepare a node write");
  st.Text(1, node.info().node_id());
  st.Blob(2, node.SerializeAsString());
  if (st.Step() != SQLITE_DONE) return Error(absl::StrCat("write node ", node.info().node_id()));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::NodeStatus>> SqliteStore::LoadNodes() {
  absl::MutexLock l(&mu_);
  Stmt q(db_, "SELECT node_id, record FROM nodes ORDER BY node_id");
  if (!q.ok()) return Error("prepare a node read");
  std::vector<v1::NodeStatus> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    v1::NodeStatus n;
    if (!n.ParseFromString(q.ColumnBlob(1))) {
      return absl::DataLossError(absl::StrCat("scheduler database ", path_, ": the record of node ",
                                              q.ColumnText(0), " cannot be parsed"));
    }
    out.push_back(std::move(n));
  }
  if (rc != SQLITE_DONE) return Error("read nodes");
  return out;
}

absl::Status SqliteStore::PutJob(const v1::Job& job, absl::string_view client_token,
                                 const v1::ShardMap* map, absl::string_view owner) {
  absl::MutexLock l(&mu_);
  absl::Status s = Exec("BEGIN IMMEDIATE");
  if (!s.ok()) return s;
  auto fail = [&](absl::string_view what) {
    absl::Status e = Error(what);
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    return e;
  };
  {
    Stmt st(db_,
            // An upsert, not INSERT OR REPLACE: a replaced row would get a new rowid, and the
            // rowid orders jobs submitted in the same millisecond.
            // The owner is kept from the first write.
            "INSERT INTO jobs(job_id, submitted_ms, client_token, record, owner) "
            "VALUES(?1, ?2, ?3, ?4, ?5) "
            "ON CONFLICT(job_id) DO UPDATE SET submitted_ms = excluded.submitted_ms, "
            "client_token = excluded.client_token, record = excluded.record");
    if (!st.ok()) return fail("prepare a job write");
    st.Text(1, job.job_id());
    st.Int(2, job.submitted_unix_ms());
    st.Text(3, client_token);
    st.Blob(4, job.SerializeAsString());
    st.Text(5, owner);
    if (st.Step() != SQLITE_DONE) return fail(absl::StrCat("write job ", job.job_id()));
  }
  if (map != nullptr) {
    Stmt st(db_, "INSERT OR REPLACE INTO shard_maps(job_id, epoch, map) VALUES(?1, ?2, ?3)");
    if (!st.ok()) return fail("prepare a shard map write");
    st.Text(1, job.job_id());
    st.Int(2, static_cast<int64_t>(map->epoch()));
    st.Blob(3, map->SerializeAsString());
    if (st.Step() != SQLITE_DONE) {
      return fail(absl::StrCat("write the shard map of job ", job.job_id()));
    }
  }
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return fail(absl::StrCat("commit job ", job.job_id()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<StoredJob>> SqliteStore::LoadJobs() {
  absl::MutexLock l(&mu_);
  Stmt q(db_,
         "SELECT j.job_id, j.client_token, j.record, "
         "  (SELECT m.map FROM shard_maps m WHERE m.job_id = j.job_id "
         "   ORDER BY m.epoch DESC LIMIT 1), j.owner "
         // Submission order: by time, then by the id's sequence number ("job-N"; databases
         // written before the upsert above have rowids out of order).
         "FROM jobs j ORDER BY j.submitted_ms, "
         "  CAST(substr(j.job_id, instr(j.job_id, '-') + 1) AS INTEGER), j.rowid");
  if (!q.ok()) return Error("prepare a job read");
  std::vector<StoredJob> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    StoredJob j;
    std::string id = q.ColumnText(0);
    j.client_token = q.ColumnText(1);
    j.owner = q.ColumnText(4);
    if (!j.job.ParseFromString(q.ColumnBlob(2)) || j.job.job_id() != id) {
      return absl::DataLossError(absl::StrCat("scheduler database ", path_,
                                              ": the record of job ", id, " cannot be parsed"));
    }
    if (sqlite3_column_type(q.get(), 3) != SQLITE_NULL &&
        !j.shard_map.ParseFromString(q.ColumnBlob(3))) {
      return absl::DataLossError(absl::StrCat("scheduler database ", path_,
                                              ": the shard map of job ", id, " cannot be parsed"));
    }
    out.push_back(std::move(j));
  }
  if (rc != SQLITE_DONE) return Error("read jobs");
  return out;
}

}  // namespace pscluster::scheduler
