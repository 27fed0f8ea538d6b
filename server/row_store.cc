#include "server/row_store.h"

#include "absl/strings/str_cat.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
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

}  // namespace

RowStore::RowStore(std::string path, rocksdb::DB* db) : path_(std::move(path)), db_(db) {}

absl::StatusOr<std::unique_ptr<RowStore>> RowStore::Open(const std::string& path) {
  rocksdb::Options o;
  o.create_if_missing = true;
  o.error_if_exists = false;
  o.IncreaseParallelism(2);
  o.max_open_files = 256;
  // Rows are float32 weights and optimizer state: compression costs CPU and saves little.
  o.compression = rocksdb::kNoCompression;
  o.write_buffer_size = 128 << 20;
  rocksdb::BlockBasedTableOptions t;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  (void)rocksdb::DestroyDB(path, o);  // Rows of an earlier run are not this table's.
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, path, &db);
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier ", path, ": cannot open a database there: ", s.ToString()));
  }
  return std::unique_ptr<RowStore>(new RowStore(path, db));
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

absl::Status RowStore::Delete(uint64_t key) {
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  return FromRocks(db_->Delete(w, KeyBytes(key)), path_, "deleting a row");
}

void RowStore::ForEach(absl::FunctionRef<void(uint64_t, absl::string_view)> f) {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    f(KeyOf(it->key()), absl::string_view(it->value().data(), it->value().size()));
  }
}

}  // namespace pscluster
