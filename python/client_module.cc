// _pscluster: the Python binding of PsClient (server/client/ps_client.h). The `pscluster` package
// (python/pscluster) wraps it; users do not import it directly.
//
// Buffers cross without copies: a pull writes straight into the caller's float32 array, a push
// reads straight from it (numpy arrays and anything else with the buffer protocol; pscluster
// hands torch tensors over as numpy views of their storage). Every buffer is checked first
// (dtype float32 or 8-byte integer keys, C-contiguous, writable for pulls, element count of the
// table) and refused with TypeError / ValueError naming the table; nothing is sent then.
// Errors from the servers raise the package's Error class with the status code's name (the gRPC
// code, e.g. "INVALID_ARGUMENT") and the message. Network waits release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/text_format.h"
#include "proto/worker.pb.h"
#include "server/client/ps_client.h"
#include "worker/scheduler_client.h"
#include "worker/standalone.h"

namespace py = pybind11;

namespace pscluster::python {
namespace {

// The package's Error class (set by pscluster/__init__.py); RuntimeError until then.
py::object& ErrorClass() {
  static py::object* cls = new py::object(py::reinterpret_borrow<py::object>(PyExc_RuntimeError));
  return *cls;
}

struct StatusError {
  std::string code;
  std::string message;
};

[[noreturn]] void Raise(const absl::Status& s) {
  throw StatusError{absl::StatusCodeToString(s.code()), std::string(s.message())};
}

template <typename T>
T Value(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *std::move(v);
}

std::string ToText(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(m, &out);
  return out;
}

template <typename M>
M FromText(const std::string& text, const char* what) {
  M m;
  if (!google::protobuf::TextFormat::ParseFromString(text, &m)) {
    throw py::value_error(absl::StrCat("not a valid ", what, " (protobuf text format): ", text));
  }
  return m;
}

uint64_t DenseElems(const v1::TableSpec& t) {
  uint64_t n = 1;
  for (uint64_t d : t.shape().dims()) n *= d;
  return n;
}

std::string ShapeText(const v1::TableSpec& t) {
  return absl::StrCat("(", absl::StrJoin(t.shape().dims(), ", "), ")");
}

std::string BufferShape(const py::buffer_info& b) {
  return absl::StrCat("(", absl::StrJoin(b.shape, ", "), ")");
}

bool CContiguous(const py::buffer_info& b) {
  py::ssize_t expect = b.itemsize;
  for (py::ssize_t i = b.ndim - 1; i >= 0; --i) {
    if (b.shape[i] != 1 && b.strides[i] != expect) return false;
    expect *= b.shape[i];
  }
  return true;
}

// A float32, C-contiguous buffer of `elems` elements (writable when `writable`), else TypeError
// or ValueError naming `table` and `role`.
py::buffer_info FloatBuffer(const py::handle& obj, bool writable, uint64_t elems,
                            const std::string& table, const std::string& role,
                            const std::string& expected_shape) {
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(absl::StrCat("table '", table, "': ", role, " must be a float32 array ",
                                      "(numpy array or CPU torch tensor), got ",
                                      std::string(py::str(obj.get_type()))));
  }
  py::buffer_info b;
  try {
    b = py::reinterpret_borrow<py::buffer>(obj).request(writable);
  } catch (const py::error_already_set& e) {
    throw py::value_error(absl::StrCat("table '", table, "': ", role,
                                       writable ? " is read-only or not a writable buffer: "
                                                : " is not a readable buffer: ",
                                       e.what()));
  }
  if (b.itemsize != 4 || (b.format != "f" && b.format != "<f" && b.format != "=f")) {
    throw py::type_error(absl::StrCat("table '", table, "': ", role, " must be float32, got dtype ",
                                      "format '", b.format, "' (", b.itemsize, " bytes) of shape ",
                                      BufferShape(b)));
  }
  if (!CContiguous(b)) {
    throw py::value_error(absl::StrCat("table '", table, "': ", role, " of shape ", BufferShape(b),
                                       " is not C-contiguous (copy it with numpy.ascontiguousarray "
                                       "or tensor.contiguous())"));
  }
  if (static_cast<uint64_t>(b.size) != elems) {
    throw py::value_error(absl::StrCat("table '", table, "': ", role, " has shape ", BufferShape(b),
                                       " (", b.size, " elements); the table needs ",
                                       expected_shape, " (", elems, " float32 elements)"));
  }
  return b;
}

// Keys: a C-contiguous 1-D buffer of 8-byte integers (uint64, or int64 >= 0).
py::buffer_info KeyBuffer(const py::handle& obj, const std::string& table) {
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(absl::StrCat("table '", table, "': keys must be a uint64 or int64 array, ",
                                      "got ", std::string(py::str(obj.get_type()))));
  }
  py::buffer_info b = py::reinterpret_borrow<py::buffer>(obj).request();
  std::string f = b.format;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f = f.substr(1);
  bool is_signed = f == "q" || f == "l";
  bool is_unsigned = f == "Q" || f == "L";
  if (b.itemsize != 8 || (!is_signed && !is_unsigned)) {
    throw py::type_error(absl::StrCat("table '", table, "': keys must be uint64 or int64, got ",
                                      "format '", b.format, "' (", b.itemsize, " bytes)"));
  }
  if (b.ndim != 1 || !CContiguous(b)) {
    throw py::value_error(absl::StrCat("table '", table, "': keys must be a C-contiguous 1-D ",
                                       "array, got shape ", BufferShape(b)));
  }
  if (is_signed) {
    const int64_t* k = static_cast<const int64_t*>(b.ptr);
    for (py::ssize_t i = 0; i < b.size; ++i) {
      if (k[i] < 0) {
        throw py::value_error(absl::StrCat("table '", table, "': key ", k[i], " at index ", i,
                                           " is negative"));
      }
    }
  }
  return b;
}

class Client {
 public:
  Client(const std::string& job_id, uint32_t rank, uint32_t attempt, const py::bytes& shard_map,
         const std::string& scheduler, const std::string& tls_ca, const std::string& tls_cert,
         const std::string& tls_key, const std::string& token, double call_timeout_sec,
         const std::string& data_transport, const py::bytes& data_secret) {
    if (!map_.ParseFromString(std::string(shard_map))) {
      throw py::value_error("shard_map: not a serialized pscluster.v1.ShardMap");
    }
    if (call_timeout_sec <= 0) throw py::value_error("call_timeout_sec: must be > 0");
    options_.job_id = job_id;
    options_.worker = rank;
    options_.attempt = attempt;
    options_.data_secret = std::string(data_secret);
    options_.channel.tls.ca = tls_ca;
    options_.channel.tls.cert = tls_cert;
    options_.channel.tls.key = tls_key;
    options_.channel.bearer_token = token;
    options_.call_timeout = absl::Seconds(call_timeout_sec);
    options_.data_transport = Value(ParseDataTransport(data_transport));
    if (!scheduler.empty()) {
      scheduler_ = std::shared_ptr<worker::SchedulerClient>(Value(
          worker::SchedulerClient::Create(scheduler, options_.channel, options_.call_timeout)));
      std::shared_ptr<worker::SchedulerClient> sched = scheduler_;
      options_.refresh_shard_map = [sched, job_id]() { return sched->GetShardMap(job_id); };
    }
  }

  // Adds a table (protobuf text of a TableSpec); the same spec again is a no-op.
  void Declare(const std::string& text) {
    v1::TableSpec t = FromText<v1::TableSpec>(text, "TableSpec");
    if (t.name().empty()) throw py::value_error("TableSpec: name is empty");
    if (t.kind() == v1::DENSE) {
      if (t.shape().dims_size() == 0 || DenseElems(t) == 0) {
        throw py::value_error(absl::StrCat("table '", t.name(), "': a dense table needs a shape ",
                                           "of dimensions > 0"));
      }
    } else if (t.kind() == v1::SPARSE) {
      if (t.row_width() == 0) {
        throw py::value_error(absl::StrCat("table '", t.name(), "': row_width must be > 0"));
      }
    } else {
      throw py::value_error(absl::StrCat("table '", t.name(), "': kind must be DENSE or SPARSE"));
    }
    absl::MutexLock l(&mu_);
    for (const v1::TableSpec& old : tables_) {
      if (old.name() != t.name()) continue;
      if (old.SerializeAsString() == t.SerializeAsString()) return;
      throw py::value_error(absl::StrCat("table '", t.name(), "' is already declared with ",
                                         "another spec"));
    }
    tables_.push_back(t);
    client_.reset();  // Recreated with the new table list at the next call.
  }

  std::vector<std::string> Tables() {
    absl::MutexLock l(&mu_);
    std::vector<std::string> out;
    for (const v1::TableSpec& t : tables_) out.push_back(ToText(t));
    return out;
  }

  void CreateTables(const std::string& consistency_text, uint32_t num_workers,
                    uint32_t checkpoint_every_steps, const std::string& checkpoint_dir) {
    v1::ConsistencySpec c = FromText<v1::ConsistencySpec>(consistency_text, "ConsistencySpec");
    std::shared_ptr<PsClient> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client->CreateTables(c, num_workers, checkpoint_every_steps, checkpoint_dir);
    }
    if (!s.ok()) Raise(s);
  }

  void InstallShardMap() { Call([](PsClient* c) { return c->InstallShardMap(); }); }
  void DropJob() { Call([](PsClient* c) { return c->DropJob(); }); }

  std::vector<std::string> Checkpoint(const std::string& dir) {
    std::shared_ptr<PsClient> client = Get();
    absl::StatusOr<std::vector<v1::CheckpointResponse>> r;
    {
      py::gil_scoped_release nogil;
      r = client->Checkpoint(dir);
    }
    std::vector<std::string> out;
    for (const v1::CheckpointResponse& c : Value(std::move(r))) out.push_back(ToText(c));
    return out;
  }

  std::vector<std::string> ServerStatuses() {
    std::shared_ptr<PsClient> client = Get();
    absl::StatusOr<std::vector<v1::ServerStatus>> r;
    {
      py::gil_scoped_release nogil;
      r = client->ServerStatuses();
    }
    std::vector<std::string> out;
    for (const v1::ServerStatus& s : Value(std::move(r))) out.push_back(ToText(s));
    return out;
  }

  // dense: [(table, array)]; sparse: [(table, keys, rows)].
  void Pull(int64_t clock, const py::list& dense, const py::list& sparse) {
    std::vector<py::buffer_info> keep;
    PullTargets t = Targets(dense, sparse, &keep);
    std::shared_ptr<PsClient> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client->Pull(clock, t);
    }
    if (!s.ok()) Raise(s);
  }

  void Push(int64_t step, const py::list& dense, const py::list& sparse, bool end_of_step) {
    std::vector<py::buffer_info> keep;
    PushSources src = Sources(dense, sparse, &keep);
    std::shared_ptr<PsClient> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client->Push(step, src, end_of_step);
    }
    if (!s.ok()) Raise(s);
  }

  void PushPull(int64_t step, const py::list& push_dense, const py::list& push_sparse,
                const py::list& pull_dense, const py::list& pull_sparse) {
    std::vector<py::buffer_info> keep;
    PushSources src = Sources(push_dense, push_sparse, &keep);
    PullTargets t = Targets(pull_dense, pull_sparse, &keep);
    std::shared_ptr<PsClient> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = client->PushPull(step, src, t);
    }
    if (!s.ok()) Raise(s);
  }

  void Close() {
    std::shared_ptr<PsClient> c;
    {
      absl::MutexLock l(&mu_);
      closed_ = true;
      c = client_;
    }
    if (c != nullptr) c->Cancel();
  }

  py::bytes ShardMap() {
    absl::MutexLock l(&mu_);
    return py::bytes((client_ != nullptr ? client_->shard_map() : map_).SerializeAsString());
  }

  int64_t LastMinClock() {
    absl::MutexLock l(&mu_);
    return client_ != nullptr ? client_->last_min_clock() : -1;
  }

  py::dict Stats() {
    std::shared_ptr<PsClient> c;
    {
      absl::MutexLock l(&mu_);
      c = client_;
    }
    PsClient::Stats s = c != nullptr ? c->stats() : PsClient::Stats{};
    py::dict d;
    d["plan_sec"] = s.plan_sec;
    d["send_sec"] = s.send_sec;
    d["wait_sec"] = s.wait_sec;
    d["copy_sec"] = s.copy_sec;
    d["calls"] = s.calls;
    d["retries"] = s.retries;
    return d;
  }

 private:
  template <typename F>
  void Call(F f) {
    std::shared_ptr<PsClient> client = Get();
    absl::Status s;
    {
      py::gil_scoped_release nogil;
      s = f(client.get());
    }
    if (!s.ok()) Raise(s);
  }

  // The PsClient for the current table list (created on first use after a Declare).
  std::shared_ptr<PsClient> Get() {
    absl::MutexLock l(&mu_);
    if (closed_) Raise(absl::CancelledError("the client is closed"));
    if (client_ == nullptr) {
      if (tables_.empty()) {
        Raise(absl::FailedPreconditionError("no table declared: declare the job's tables first"));
      }
      // A map the previous client learned (from the scheduler) carries on.
      client_ = std::shared_ptr<PsClient>(Value(PsClient::Create(options_, map_, tables_)));
    }
    return client_;
  }

  v1::TableSpec Find(const std::string& name) {
    absl::MutexLock l(&mu_);
    for (const v1::TableSpec& t : tables_) {
      if (t.name() == name) return t;
    }
    Raise(absl::NotFoundError(absl::StrCat("table '", name, "' is not declared on this client")));
  }

  void AddDense(const py::handle& item, bool writable, std::vector<py::buffer_info>* keep,
                std::string* name, const float** data) {
    auto tup = item.cast<py::tuple>();
    if (tup.size() != 2) throw py::value_error("dense entries are (table, array)");
    *name = tup[0].cast<std::string>();
    const v1::TableSpec t = Find(*name);
    if (t.kind() != v1::DENSE) {
      throw py::value_error(absl::StrCat("table '", *name, "' is sparse: give keys and rows"));
    }
    keep->push_back(FloatBuffer(tup[1], writable, DenseElems(t), *name,
                                writable ? "pull target" : "gradient", ShapeText(t)));
    *data = static_cast<const float*>(keep->back().ptr);
  }

  void AddSparse(const py::handle& item, bool writable, std::vector<py::buffer_info>* keep,
                 std::string* name, absl::Span<const uint64_t>* keys, const float** rows) {
    auto tup = item.cast<py::tuple>();
    if (tup.size() != 3) throw py::value_error("sparse entries are (table, keys, rows)");
    *name = tup[0].cast<std::string>();
    const v1::TableSpec t = Find(*name);
    if (t.kind() != v1::SPARSE) {
      throw py::value_error(absl::StrCat("table '", *name, "' is dense: give one array"));
    }
    keep->push_back(KeyBuffer(tup[1], *name));
    const py::buffer_info& k = keep->back();
    *keys = absl::Span<const uint64_t>(static_cast<const uint64_t*>(k.ptr), k.size);
    uint64_t n = keys->size();
    keep->push_back(FloatBuffer(tup[2], writable, n * t.row_width(), *name,
                                writable ? "rows" : "gradient rows",
                                absl::StrCat("(", n, ", ", t.row_width(), ") for ", n, " keys")));
    *rows = static_cast<const float*>(keep->back().ptr);
  }

  PullTargets Targets(const py::list& dense, const py::list& sparse,
                      std::vector<py::buffer_info>* keep) {
    keep->reserve(keep->size() + dense.size() + 2 * sparse.size());
    PullTargets t;
    for (const py::handle& item : dense) {
      DenseTarget d;
      const float* p;
      AddDense(item, true, keep, &d.table, &p);
      d.data = const_cast<float*>(p);
      t.dense.push_back(std::move(d));
    }
    for (const py::handle& item : sparse) {
      SparseTarget s;
      const float* p;
      AddSparse(item, true, keep, &s.table, &s.keys, &p);
      s.rows = const_cast<float*>(p);
      t.sparse.push_back(std::move(s));
    }
    return t;
  }

  PushSources Sources(const py::list& dense, const py::list& sparse,
                      std::vector<py::buffer_info>* keep) {
    keep->reserve(keep->size() + dense.size() + 2 * sparse.size());
    PushSources src;
    for (const py::handle& item : dense) {
      DenseSource d;
      AddDense(item, false, keep, &d.table, &d.grad);
      src.dense.push_back(std::move(d));
    }
    for (const py::handle& item : sparse) {
      SparseSource s;
      AddSparse(item, false, keep, &s.table, &s.keys, &s.grads);
      src.sparse.push_back(std::move(s));
    }
    return src;
  }

  PsClientOptions options_;
  std::shared_ptr<worker::SchedulerClient> scheduler_;
  absl::Mutex mu_;
  v1::ShardMap map_;
  std::vector<v1::TableSpec> tables_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<PsClient> client_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

// The task file of an entrypoint task (PSCLUSTER_TASK_FILE): a serialized AssignTaskRequest.
py::dict ReadTask(const std::string& path) {
  std::string data;
  {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      Raise(absl::NotFoundError(absl::StrCat("task file ", path, ": ", std::strerror(errno))));
    }
    char buf[1 << 16];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
    std::fclose(f);
  }
  v1::AssignTaskRequest task;
  if (!task.ParseFromString(data)) {
    Raise(absl::InvalidArgumentError(
        absl::StrCat("task file ", path, ": not a serialized pscluster.v1.AssignTaskRequest")));
  }
  const v1::JobSpec& spec = task.spec();
  py::dict d;
  d["job_id"] = task.job_id();
  d["rank"] = task.rank();
  d["num_workers"] = task.num_workers();
  d["start_step"] = task.start_step();
  d["attempt"] = task.attempt();
  d["data_secret"] = py::bytes(task.data_secret());
  d["lead_rank"] = task.lead_rank();
  d["training_ranks"] = task.training_ranks() > 0 ? task.training_ranks() : task.num_workers();
  d["shard_map"] = py::bytes(task.shard_map().SerializeAsString());
  d["spec"] = ToText(spec);
  d["name"] = spec.name();
  d["epochs"] = spec.epochs();
  d["batch_size"] = spec.batch_size();
  d["seed"] = spec.seed();
  d["checkpoint_every_steps"] = spec.checkpoint_every_steps();
  d["checkpoint_dir"] = spec.checkpoint_dir();
  d["consistency"] = ToText(spec.consistency());
  d["optimizer"] = ToText(spec.optimizer());
  py::dict per_table;
  for (const auto& [name, o] : spec.table_optimizers()) per_table[py::str(name)] = ToText(o);
  d["table_optimizers"] = per_table;
  py::dict compression;
  for (const auto& [name, c] : spec.table_compression()) compression[py::str(name)] = ToText(c);
  d["table_compression"] = compression;
  return d;
}

}  // namespace
}  // namespace pscluster::python

PYBIND11_MODULE(_pscluster, m) {
  using pscluster::python::Client;
  m.doc() = "Binding of the pscluster parameter client (use the pscluster package).";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const pscluster::python::StatusError& e) {
      py::object err = pscluster::python::ErrorClass()(e.code, e.message);
      PyErr_SetObject(err.get_type().ptr(), err.ptr());
    }
  });
  m.def("_set_error_class", [](py::object cls) { pscluster::python::ErrorClass() = cls; });
  m.def("round_robin_shard_map",
        [](const std::string& job_id, const std::vector<std::string>& servers,
           uint32_t num_virtual_shards) {
          return py::bytes(pscluster::python::Value(
              pscluster::worker::RoundRobinShardMap(job_id, servers, num_virtual_shards))
                               .SerializeAsString());
        },
        py::arg("job_id"), py::arg("servers"), py::arg("num_virtual_shards") = 0);
  m.def("read_task", &pscluster::python::ReadTask, py::arg("path"));
  py::class_<Client>(m, "Client")
      .def(py::init<const std::string&, uint32_t, uint32_t, const py::bytes&, const std::string&,
                    const std::string&, const std::string&, const std::string&,
                    const std::string&, double, const std::string&, const py::bytes&>(),
           py::arg("job_id"), py::arg("rank"), py::arg("attempt"), py::arg("shard_map"),
           py::arg("scheduler") = "", py::arg("tls_ca") = "", py::arg("tls_cert") = "",
           py::arg("tls_key") = "", py::arg("token") = "", py::arg("call_timeout_sec") = 60.0,
           py::arg("data_transport") = "auto", py::arg("data_secret") = py::bytes())
      .def("declare", &Client::Declare, py::arg("table_spec"))
      .def("tables", &Client::Tables)
      .def("create_tables", &Client::CreateTables, py::arg("consistency"), py::arg("num_workers"),
           py::arg("checkpoint_every_steps") = 0, py::arg("checkpoint_dir") = "")
      .def("install_shard_map", &Client::InstallShardMap)
      .def("drop_job", &Client::DropJob)
      .def("checkpoint", &Client::Checkpoint, py::arg("dir") = "")
      .def("server_statuses", &Client::ServerStatuses)
      .def("pull", &Client::Pull, py::arg("clock"), py::arg("dense"), py::arg("sparse"))
      .def("push", &Client::Push, py::arg("step"), py::arg("dense"), py::arg("sparse"),
           py::arg("end_of_step") = true)
      .def("push_pull", &Client::PushPull, py::arg("step"), py::arg("push_dense"),
           py::arg("push_sparse"), py::arg("pull_dense"), py::arg("pull_sparse"))
      .def("close", &Client::Close)
      .def("shard_map", &Client::ShardMap)
      .def("last_min_clock", &Client::LastMinClock)
      .def("stats", &Client::Stats);
}
