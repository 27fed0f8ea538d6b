#include "server/row_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/sst_file_writer.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"

namespace pscluster {
namespace {

std::string KeyBytes(uint64_t key) {
  std::string k(8, '\0');
  for (int i = 0; i < 8; ++i) k[i] = static_cast<char>(key >> (56 - 8 * i));
  return k;
}

uint64_t KeyOf(const rocksdb::Slice& s) {
  uint64_t k = 0;
  for (size_t i = 0; i < 8 && i < s.size(); ++i) k = (k << 8) | static_cast<uint8_t>(s[i]);
  return k;
}

absl::Status FromRocks(const rocksdb::Status& s, const std::string& path, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat("disk tier ", path, ": ", what, ": ", s.ToString());
  if (s.IsNoSpace() || s.subcode() == rocksdb::Status::kNoSpace) {
    return absl::ResourceExhaustedError(msg);
  }
  return s.IsIOError() ? absl::FailedPreconditionError(msg) : absl::InternalError(msg);
}

// Whether another process holds a lock on `lock_file` (a database's LOCK). Unknown (the file
// cannot be opened or queried) counts as held: nothing is removed on a guess.
bool LockHeld(const std::string& lock_file) {
  int fd = open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  struct flock f = {};
  f.l_type = F_WRLCK;
  f.l_whence = SEEK_SET;
  f.l_start = 0;
  f.l_len = 0;
  const bool held = fcntl(fd, F_GETLK, &f) != 0 || f.l_type != F_UNLCK;
  close(fd);
  return held;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> RowStore::RemoveAbandoned(const std::string& spill_dir) {
  DIR* d = opendir(spill_dir.c_str());
  if (d == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--spill_dir ", spill_dir, ": cannot list it (", std::strerror(errno), ")"));
  }
  std::vector<std::string> candidates;
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = absl::StrCat(spill_dir, "/", name);
    struct stat st;
    // Only RocksDB databases (a LOCK and a CURRENT file), nothing else that lives there.
    if (lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (access((path + "/LOCK").c_str(), F_OK) != 0 ||
        access((path + "/CURRENT").c_str(), F_OK) != 0) {
      continue;
    }
    // A process does not see its own locks: never touch this process's databases
    // (`<job>.<pid>.<job object>.<table>`, see Job).
    std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
    if (parts.size() >= 4 && parts[parts.size() - 3] == absl::StrCat(getpid())) continue;
    candidates.push_back(path);
  }
  closedir(d);
  std::vector<std::string> removed;
  for (const std::string& path : candidates) {
    if (LockHeld(path + "/LOCK")) continue;
    if (rocksdb::DestroyDB(path, rocksdb::Options()).ok()) {
      // A restore's table file not yet added (BulkLoad) is not the database's: DestroyDB leaves
      // it, and with it the directory.
      if (DIR* dd = opendir(path.c_str())) {
        std::vector<std::string> stray;
        while (struct dirent* e = readdir(dd)) {
          const std::string name = e->d_name;
          if (name.rfind("bulk-", 0) == 0) stray.push_back(absl::StrCat(path, "/", name));
        }
        closedir(dd);
        for (const std::string& f : stray) unlink(f.c_str());
      }
      rmdir(path.c_str());  // DestroyDB leaves the directory when it holds anything else.
      removed.push_back(path);
    }
  }
  return removed;
}

// One block cache for every disk tier of the process (32 MiB in all, however many tables spill):
// the hot rows read back from disk, whichever table they belong to.
static std::shared_ptr<rocksdb::Cache> SharedBlockCache() {
  static const std::shared_ptr<rocksdb::Cache> cache = rocksdb::NewLRUCache(32 << 20);
  return cache;
}

RowStore::RowStore(std::string path, rocksdb::DB* db, std::unique_ptr<rocksdb::Options> options)
    : path_(std::move(path)), db_(db), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<RowStore>> RowStore::Open(const std::string& path) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.error_if_exists = false;
  o.IncreaseParallelism(2);
  // Every table file stays open, its index and bloom filter read once (held by the file's table
  // reader, outside the block cache and the cap: about 15 bits a row). With a bound on open files
  // (256 before), a 10^8-row tier (13 GB, more files than that) closed and opened files all the
  // time, and every lookup in a file just opened read its whole index and filter again: 31% of
  // the server's time at 10^8 keys ("Every table file open" in docs/benchmarks.md). Files of
  // 128 MiB (64 by default) halve the descriptors this takes; ps_server raises its limit on
  // open files to the hard limit at start.
  o.max_open_files = -1;
  o.target_file_size_base = 128 << 20;
  // Rows are float32 weights and optimizer state: compression costs CPU and saves little.
  o.compression = rocksdb::kNoCompression;
  // A row that misses memory is looked up in the memtable first, and every spill and every row
  // coming back inserts into it: a smaller memtable (32 MiB, was 128) keeps those skiplist
  // searches short, and a bloom filter over its whole keys lets a lookup of a row that is not
  // there skip the search. Hot rows read back from the files come from the process's block
  // cache (SharedBlockCache) instead of a pread each. Measured in docs/benchmarks.md ("A memory cap with a
  // disk tier"): 1.5x the traffic, 2.4x the fill, 59 MiB less peak memory at 10^6 keys.
  o.write_buffer_size = 32 << 20;
  o.memtable_whole_key_filtering = true;
  o.memtable_prefix_bloom_size_ratio = 0.1;
  rocksdb::BlockBasedTableOptions t;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.block_cache = SharedBlockCache();
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  (void)rocksdb::DestroyDB(path, o);  // Rows of an earlier run are not this table's.
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, path, &db);
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier ", path, ": cannot open a database there: ", s.ToString()));
  }
  return std::unique_ptr<RowStore>(
      new RowStore(path, db, std::make_unique<rocksdb::Options>(o)));
}

RowStore::~RowStore() {
  db_.reset();
  (void)rocksdb::DestroyDB(path_, rocksdb::Options());  // A cache of this process only.
}

absl::Status RowStore::PutAll(const std::vector<std::pair<uint64_t, std::string>>& rows) {
  rocksdb::WriteBatch batch;
  for (const auto& [k, v] : rows) batch.Put(KeyBytes(k), v);
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  return FromRocks(db_->Write(w, &batch), path_, "writing spilled rows");
}

bool RowStore::Get(uint64_t key, std::string* value, absl::Status* error) {
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), KeyBytes(key), value);
  if (s.ok()) return true;
  if (!s.IsNotFound() && error != nullptr) *error = FromRocks(s, path_, "reading a row");
  return false;
}

absl::Status RowStore::GetMany(absl::Span<const uint64_t> keys,
                                std::vector<std::string>* values) {
  const size_t n = keys.size();
  values->assign(n, std::string());
  if (n == 0) return absl::OkStatus();
  std::vector<std::string> bytes(n);
  std::vector<rocksdb::Slice> slices(n);
  for (size_t i = 0; i < n; ++i) {
    bytes[i] = KeyBytes(keys[i]);
    slices[i] = bytes[i];
  }
  std::vector<rocksdb::PinnableSlice> got(n);
  std::vector<rocksdb::Status> statuses(n);
  db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), n, slices.data(), got.data(),
                statuses.data());
  absl::Status first_error;
  for (size_t i = 0; i < n; ++i) {
    if (statuses[i].ok()) {
      (*values)[i].assign(got[i].data(), got[i].size());
    } else if (!statuses[i].IsNotFound() && first_error.ok()) {
      first_error = FromRocks(statuses[i], path_, "reading rows");
    }
  }
  return first_error;
}

absl::Status RowStore::Delete(uint64_t key) {
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  return FromRocks(db_->Delete(w, KeyBytes(key)), path_, "deleting a row");
}

void RowStore::ForEach(absl::FunctionRef<void(uint64_t, absl::string_view)> f) {
  // A scan of everything (a checkpoint, a drop) leaves the block cache to the rows being served.
  rocksdb::ReadOptions scan;
  scan.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(scan));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    f(KeyOf(it->key()), absl::string_view(it->value().data(), it->value().size()));
  }
}

void RowStore::ForEachFrom(uint64_t start, absl::FunctionRef<bool(uint64_t, absl::string_view)> f) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  const std::string from = KeyBytes(start);
  for (it->Seek(rocksdb::Slice(from.data(), from.size())); it->Valid(); it->Next()) {
    if (!f(KeyOf(it->key()), absl::string_view(it->value().data(), it->value().size()))) return;
  }
}

}  // namespace pscluster

namespace pscluster {

RowStore::BulkLoad::BulkLoad(RowStore* store) : store_(store) {}

RowStore::BulkLoad::~BulkLoad() {
  if (!file_.empty()) {
    writer_.reset();
    unlink(file_.c_str());
  }
}

absl::Status RowStore::BulkLoad::Add(uint64_t key, absl::string_view value, uint64_t* added) {
  *added = 0;
  if (!file_.empty() && (key <= last_key_ || bytes_ >= kFileBytes)) {
    absl::Status s = AddFile(added);
    if (!s.ok()) return s;
  }
  if (file_.empty()) {
    file_ = absl::StrCat(store_->path_, "/bulk-", store_->bulk_loads_.fetch_add(1), ".sst");
    writer_ = std::make_unique<rocksdb::SstFileWriter>(rocksdb::EnvOptions(), *store_->options_);
    absl::Status s = FromRocks(writer_->Open(file_), store_->path_, "writing a table file");
    if (!s.ok()) {
      writer_.reset();
      unlink(file_.c_str());
      file_.clear();
      return s;
    }
  }
  absl::Status s = FromRocks(
      writer_->Put(KeyBytes(key), rocksdb::Slice(value.data(), value.size())), store_->path_,
      "writing a table file");
  if (!s.ok()) return s;
  last_key_ = key;
  ++rows_;
  bytes_ += 8 + value.size();
  return absl::OkStatus();
}

absl::Status RowStore::BulkLoad::AddFile(uint64_t* added) {
  absl::Status s = FromRocks(writer_->Finish(), store_->path_, "writing a table file");
  writer_.reset();
  if (s.ok()) {
    rocksdb::IngestExternalFileOptions o;
    o.move_files = true;  // Linked into the database, not copied.
    o.write_global_seqno = false;
    s = FromRocks(store_->db_->IngestExternalFile({file_}, o), store_->path_,
                  "adding a table file");
  }
  unlink(file_.c_str());  // Gone already once moved in.
  file_.clear();
  if (s.ok()) *added += rows_;
  rows_ = 0;
  bytes_ = 0;
  return s;
}

absl::Status RowStore::BulkLoad::Finish(uint64_t* added) {
  *added = 0;
  return file_.empty() ? absl::OkStatus() : AddFile(added);
}

}  // namespace pscluster
