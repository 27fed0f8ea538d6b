// The streaming readers' speed and memory (worker/data/streaming_dataset.h).
//
// Speed: for LibSVM, CSV and Criteo text, generated into a temporary file, three rates measured
// in the same run over the same file (hot in the page cache):
//   * read(): the file's bytes read through the readers' own file calls into a buffer, nothing
//     else (the baseline);
//   * parse: lines split and parsed on one thread, MB of text per CPU-second of that thread
//     (MB/s per core), and its ratio to the baseline;
//   * pipeline: a whole pass (reader thread, shuffle window of 10,000, prefetch queue, batches
//     of 1,024 copied out), MB/s of wall time and per CPU-second of the process.
// Each rate is the median of --runs runs.
//
// Memory (--rss_gb=N, a manual, slow run): writes an N GB Criteo file into --rss_dir, streams it
// through one pass with the default options and prints the process's peak RSS while reading
// (reset before the pass), then deletes the file.
#include <malloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/data/file_system.h"
#include "worker/data/line_reader.h"
#include "worker/data/streaming_dataset.h"

ABSL_FLAG(double, mb, 128, "Size of each generated text file, in MB (0: no speed runs).");
ABSL_FLAG(int, runs, 3, "Runs of each measurement (the median is reported).");
ABSL_FLAG(std::string, dir, "", "Where to write the files (default $TEST_TMPDIR or /tmp).");
ABSL_FLAG(double, rss_gb, 0,
          "If > 0: stream a generated Criteo file of this many GB and print "
          "the peak RSS (slow; not part of the default run).");
ABSL_FLAG(std::string, rss_dir, "/tmp", "Where to write the --rss_gb file (deleted afterwards).");

namespace pscluster::data {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double ThreadCpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double ProcessCpu() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- Text generators (random lines shaped like each format's usual data) ----

std::string LibSvmLine(std::mt19937_64& rng) {
  // 40 features, sorted indices below 2^20, half binary and half 4-decimal values.
  std::string s = rng() % 4 == 0 ? "+1" : "-1";
  uint64_t idx = 0;
  for (int i = 0; i < 40; ++i) {
    idx += 1 + rng() % 25000;
    if (i % 2 == 0) {
      absl::StrAppend(&s, " ", idx, ":1");
    } else {
      absl::StrAppend(&s, " ", idx, ":0.", 1000 + rng() % 9000);
    }
  }
  return s + "\n";
}

std::string CsvHeader() {
  std::string s = "label";
  for (int i = 0; i < 20; ++i) absl::StrAppend(&s, ",x", i);
  for (int i = 0; i < 10; ++i) absl::StrAppend(&s, ",c", i);
  return s + "\n";
}

std::string CsvLine(std::mt19937_64& rng) {
  // 20 dense columns (some empty), 10 categorical columns of short strings.
  std::string s = rng() % 4 == 0 ? "1" : "0";
  for (int i = 0; i < 20; ++i) {
    if (rng() % 20 == 0) {
      s += ",";
    } else {
      absl::StrAppend(&s, ",", rng() % 1000, ".", rng() % 1000);
    }
  }
  for (int i = 0; i < 10; ++i) absl::StrAppend(&s, ",v", absl::Hex(rng() % 100000));
  return s + "\n";
}

std::string CriteoLine(std::mt19937_64& rng) {
  std::string s = rng() % 4 == 0 ? "1" : "0";
  for (int i = 0; i < 13; ++i) {
    s += "\t";
    if (rng() % 5 != 0) absl::StrAppend(&s, rng() % (i < 4 ? 100 : 10000));
  }
  for (int i = 0; i < 26; ++i) {
    s += "\t";
    if (rng() % 20 != 0) absl::StrAppend(&s, absl::Hex(rng() & 0xffffffffu, absl::kZeroPad8));
  }
  return s + "\n";
}

// Writes about `bytes` of lines drawn from a pool of distinct random lines.
bool WriteFile(const std::string& path, double bytes, std::string header,
               std::string (*line)(std::mt19937_64&)) {
  std::mt19937_64 rng(1);
  std::vector<std::string> pool;
  for (int i = 0; i < 65536; ++i) pool.push_back(line(rng));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::string buf = std::move(header);
  double written = 0;
  while (written < bytes) {
    while (buf.size() < (4 << 20)) buf += pool[rng() % pool.size()];
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    written += static_cast<double>(buf.size());
    buf.clear();
  }
  out.close();
  return static_cast<bool>(out);
}

// ---- Measurements ----

struct Rates {
  double read_mbs = 0, parse_mbs_core = 0, pipeline_mbs = 0, pipeline_mbs_core = 0;
  uint64_t lines = 0, examples = 0;
};

double ReadBytes(FileSystem* fs, const std::string& path, uint64_t size) {
  auto file = fs->Open(path);
  if (!file.ok()) return 0;
  std::vector<char> buf(1 << 20);
  const auto t0 = Clock::now();
  uint64_t sum = 0;
  for (uint64_t pos = 0; pos < size;) {
    auto n = (*file)->Read(pos, buf.size(), buf.data());
    if (!n.ok() || *n == 0) break;
    sum += static_cast<unsigned char>(buf[*n - 1]);  // Touch the bytes read.
    pos += *n;
  }
  const double s = Seconds(t0, Clock::now());
  if (sum == 1) std::fputs("", stdout);
  return size / 1e6 / s;
}

double ParseOneThread(FileSystem* fs, const StreamingDataset& ds, uint64_t* lines_out) {
  const DataFile& f = ds.layout(Split::kTrain).files[0];
  auto file = fs->Open(f.path);
  LineReaderOptions lo;
  LineReader lines(file->get(), f, 0, f.size, lo);
  Example e;
  ParseError err;
  absl::string_view line;
  uint64_t n = 0, bad = 0;
  auto created = CreateParser(ds.options(), ds.layout(Split::kTrain), fs);
  if (!created.ok()) return 0;
  const LineParser* parser = created->get();
  const double c0 = ThreadCpu();
  bool header = parser->has_header();
  while (lines.Next(&line)) {
    if (header) {
      header = false;
      continue;
    }
    if (parser->Parse(line, &e, &err) == ParseOutcome::kError) ++bad;
    ++n;
  }
  const double cpu = ThreadCpu() - c0;
  if (bad > 0) {
    std::fprintf(stderr, "%lu malformed lines in %s\n", static_cast<unsigned long>(bad),
                 f.path.c_str());
    std::exit(1);
  }
  *lines_out = n;
  return f.size / 1e6 / cpu;
}

void Pipeline(const StreamingDataset& ds, double* mbs, double* mbs_core, uint64_t* examples) {
  ReadRequest req;
  auto reader = ds.Read(req);
  ExampleBatch b;
  uint64_t n = 0;
  const double c0 = ProcessCpu();
  const auto t0 = Clock::now();
  while (true) {
    auto got = (*reader)->Next(1024, &b);
    if (!got.ok() || *got == 0) break;
    n += *got;
  }
  const double wall = Seconds(t0, Clock::now());
  const double cpu = ProcessCpu() - c0;
  const double mb = ds.layout(Split::kTrain).total_bytes / 1e6;
  *mbs = mb / wall;
  *mbs_core = mb / cpu;
  *examples = n;
}

Rates Measure(FileSystem* fs, const DatasetOptions& o, int runs) {
  Rates r;
  auto ds = StreamingDataset::Open(o, fs);
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", ds.status().ToString().c_str());
    std::exit(1);
  }
  const uint64_t size = (*ds)->layout(Split::kTrain).total_bytes;
  ReadBytes(fs, o.train, size);  // Into the page cache.
  std::vector<double> read, parse, pipe, pipe_core;
  for (int i = 0; i < runs; ++i) {
    read.push_back(ReadBytes(fs, o.train, size));
    parse.push_back(ParseOneThread(fs, **ds, &r.lines));
    double a = 0, b = 0;
    Pipeline(**ds, &a, &b, &r.examples);
    pipe.push_back(a);
    pipe_core.push_back(b);
  }
  r.read_mbs = Median(read);
  r.parse_mbs_core = Median(parse);
  r.pipeline_mbs = Median(pipe);
  r.pipeline_mbs_core = Median(pipe_core);
  return r;
}

// VmHWM / VmRSS of this process, in MB.
double StatusMb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::strlen(key)) / 1024.0;
  }
  return -1;
}

int RssDemo(FileSystem* fs, double gb) {
  const std::string path =
      absl::StrCat(absl::GetFlag(FLAGS_rss_dir), "/pscluster_rss_", ::getpid(), ".criteo");
  std::printf("\nPeak RSS while streaming a %.1f GB Criteo file (%s)\n", gb, path.c_str());
  const auto g0 = Clock::now();
  if (!WriteFile(path, gb * 1e9, "", CriteoLine)) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::remove(path.c_str());
    return 1;
  }
  std::printf("  written in %.1f s (lines drawn from 65,536 random ones)\n",
              Seconds(g0, Clock::now()));
  DatasetOptions o;
  o.format = DataFormat::kCriteo;
  o.train = path;
  auto ds = StreamingDataset::Open(o, fs);
  if (!ds.ok()) {
    std::remove(path.c_str());
    return 1;
  }
  // Give the writer's freed memory back, then reset the peak (Linux: 5 to clear_refs resets
  // VmHWM to the current RSS), so that the peak covers the pass only.
  malloc_trim(0);
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const double before = StatusMb("VmRSS:");
  const bool reset = StatusMb("VmHWM:") <= before + 1;
  double mbs = 0, mbs_core = 0;
  uint64_t examples = 0;
  const auto t0 = Clock::now();
  Pipeline(**ds, &mbs, &mbs_core, &examples);
  const double secs = Seconds(t0, Clock::now());
  const double peak = StatusMb("VmHWM:");
  std::remove(path.c_str());
  std::printf("  | file | examples | pass | MB/s | RSS before | peak RSS during the pass |\n");
  std::printf("  |---|---|---|---|---|---|\n");
  std::printf("  | %.2f GB | %lu | %.1f s | %.0f | %.1f MB | %.1f MB%s |\n",
              (*ds)->layout(Split::kTrain).total_bytes / 1e9, static_cast<unsigned long>(examples),
              secs, mbs, before, peak, reset ? "" : " (not reset: the peak since the start)");
  std::printf(
      "  options: shuffle_window %u, prefetch_batches %u x %u examples, chunk_bytes %lu, "
      "max_line_bytes %u\n",
      o.shuffle_window, o.prefetch_batches, o.batch_examples,
      static_cast<unsigned long>(o.chunk_bytes), o.max_line_bytes);
  return examples > 0 ? 0 : 1;
}

int Main() {
  auto fs = NewPosixFileSystem();
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    const char* t = std::getenv("TEST_TMPDIR");
    dir = t != nullptr ? t : "/tmp";
  }
  const double mb = absl::GetFlag(FLAGS_mb);
  const double gb = absl::GetFlag(FLAGS_rss_gb);
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));
  struct Format {
    const char* name;
    DataFormat format;
    std::string header;
    std::string (*line)(std::mt19937_64&);
  };
  const std::vector<Format> formats = {
      {"LibSVM", DataFormat::kLibSvm, "", LibSvmLine},
      {"CSV", DataFormat::kCsv, CsvHeader(), CsvLine},
      {"Criteo", DataFormat::kCriteo, "", CriteoLine},
  };
  if (mb <= 0) return gb > 0 ? RssDemo(fs.get(), gb) : 0;
  std::printf("Streaming readers, %.0f MB files in %s, median of %d runs, %ld cores\n", mb,
              dir.c_str(), runs, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf(
      "| format | bytes/line | read() MB/s | parse MB/s per core | parse / read() | "
      "pipeline MB/s | pipeline MB/s per core | examples |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Format& f : formats) {
    const std::string path = absl::StrCat(dir, "/bench_", ::getpid(), "_", f.name);
    if (!WriteFile(path, mb * 1e6, f.header, f.line)) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
    DatasetOptions o;
    o.format = f.format;
    o.train = path;
    if (f.format == DataFormat::kCsv) {
      for (int i = 0; i < 10; ++i) {
        o.columns.push_back({absl::StrCat("c", i), ColumnKind::kCategorical});
      }
    }
    Rates r = Measure(fs.get(), o, runs);
    struct stat st;
    ::stat(path.c_str(), &st);
    std::remove(path.c_str());
    std::printf("| %s | %.0f | %.0f | %.1f | %.4f | %.1f | %.1f | %lu |\n", f.name,
                r.lines > 0 ? static_cast<double>(st.st_size) / r.lines : 0.0, r.read_mbs,
                r.parse_mbs_core, r.parse_mbs_core / r.read_mbs, r.pipeline_mbs,
                r.pipeline_mbs_core, static_cast<unsigned long>(r.examples));
  }
  std::printf("Target: parse >= 100 MB/s per core (LibSVM, CSV).\n");
  if (gb > 0) return RssDemo(fs.get(), gb);
  return 0;
}

}  // namespace
}  // namespace pscluster::data

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pscluster::data::Main();
}
