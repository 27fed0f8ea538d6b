// The disk tier of a sparse table (see SparseTable): rows spilled out of memory, kept in an
// embedded RocksDB database in a directory of their own. Keys are stored big-endian, so that an
// iteration visits them in ascending order. Not durable across a crash on purpose (no
// write-ahead log, no fsync): checkpoints are what survive a crash, and they cover both tiers.
//
// Thread-safe (RocksDB's own locking).
#ifndef PSCLUSTER_SERVER_ROW_STORE_H_
#define PSCLUSTER_SERVER_ROW_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace rocksdb {
class DB;
class SstFileWriter;
struct Options;
}  // namespace rocksdb

namespace pscluster {

class RowStore {
 public:
  // Creates (or empties) the database directory `path`, whose parent must exist and be
  // writable. FAILED_PRECONDITION names the directory and RocksDB's reason.
  static absl::StatusOr<std::unique_ptr<RowStore>> Open(const std::string& path);
  // Closes the database and removes its directory.
  ~RowStore();

  // Writes the rows (key, value) in one batch: all or nothing. RESOURCE_EXHAUSTED (disk full) or
  // INTERNAL names the directory.
  absl::Status PutAll(const std::vector<std::pair<uint64_t, std::string>>& rows);
  // false when `key` is absent (an error reading counts as absent and is returned in *error).
  bool Get(uint64_t key, std::string* value, absl::Status* error = nullptr);
  // Reads the rows of several keys in one batched lookup (RocksDB's MultiGet: one pass over
  // each level for all of them). (*values)[i] is keys[i]'s row, or empty when it has none; an
  // error reading any of them is returned (the others are still read).
  absl::Status GetMany(absl::Span<const uint64_t> keys, std::vector<std::string>* values);
  absl::Status Delete(uint64_t key);
  // Visits every row in ascending key order.
  void ForEach(absl::FunctionRef<void(uint64_t key, absl::string_view value)> f);
  // Visits the rows of keys >= start in ascending key order while f returns true.
  void ForEachFrom(uint64_t start,
                   absl::FunctionRef<bool(uint64_t key, absl::string_view value)> f);
  const std::string& path() const { return path_; }

  // Rows written as whole table files and added to the database (RocksDB's SstFileWriter and
  // IngestExternalFile), for a restore: no memtable, no write-ahead log, and no compaction of
  // what it writes where its keys do not overlap rows already there. Rows come in ascending key
  // order where the caller can: a key not above the one before starts another file, so that any
  // order is still right (a later row of a key replaces an earlier one), only slower. Rows are
  // in the database once their file is: when it reaches kFileBytes, or at Finish().
  class BulkLoad {
   public:
    static constexpr uint64_t kFileBytes = 64 << 20;
    ~BulkLoad();  // Removes a file not added.
    // *added: how many rows (of this and earlier calls) this call put into the database.
    absl::Status Add(uint64_t key, absl::string_view value, uint64_t* added);
    absl::Status Finish(uint64_t* added);

   private:
    friend class RowStore;
    explicit BulkLoad(RowStore* store);
    absl::Status AddFile(uint64_t* added);
    RowStore* const store_;
    std::unique_ptr<rocksdb::SstFileWriter> writer_;
    std::string file_;  // The file being written ("" when none).
    uint64_t rows_ = 0, bytes_ = 0, last_key_ = 0;
    int files_ = 0;
  };
  std::unique_ptr<BulkLoad> StartBulkLoad() {
    return std::unique_ptr<BulkLoad>(new BulkLoad(this));
  }

  // Removes the databases directly under `spill_dir` that no live process holds open (RocksDB
  // keeps an fcntl lock on each database's LOCK file while it is open): the disk tiers of
  // servers that were killed. A process does not see its own locks, so this process's own
  // databases (named with its pid, see Job) are skipped. Returns the directories removed; an
  // unreadable `spill_dir` is an error.
  static absl::StatusOr<std::vector<std::string>> RemoveAbandoned(const std::string& spill_dir);

 private:
  RowStore(std::string path, rocksdb::DB* db, std::unique_ptr<rocksdb::Options> options);
  std::string path_;
  std::unique_ptr<rocksdb::DB> db_;
  std::unique_ptr<rocksdb::Options> options_;  // The database's, for the files of a BulkLoad.
  std::atomic<int> bulk_loads_{0};              // Names their files apart.
};

}  // namespace pscluster

#endif  // PSCLUSTER_SERVER_ROW_STORE_H_
