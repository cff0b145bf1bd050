// The host policy (plan/host_policy.h) as a table: checkpoint size against memory, cached or not,
// alone on the host or not, an explicit worker count, against what the views pass then does.
#include <gtest/gtest.h>

#include "plan/defaults.h"
#include "plan/host_policy.h"

namespace instanttensor::plan {
namespace {

constexpr uint64_t MiB = 1ull << 20;
constexpr uint64_t GiB = 1ull << 30;

struct Row {
  const char* what;
  uint64_t bytes;
  uint64_t memory;
  bool cached;
  bool alone;
  int concurrency;
  int workers;
  bool advise_inline;
  bool advise;
  CacheUse cache_use;
};

TEST(HostPolicy, EveryCaseOfTheTable) {
  const int d = defaults::kConcurrency;
  const Row rows[] = {
      {"small, cold: the consumer advises, no worker", 4 * MiB, 24 * GiB, false, true, 0, 0, true,
       false, CacheUse::Keep},
      {"small, cached: nothing to do", 4 * MiB, 24 * GiB, true, true, 0, 0, false, false,
       CacheUse::Keep},
      {"small, explicit workers: they are started", 4 * MiB, 24 * GiB, false, true, 3, 3, false,
       false, CacheUse::Keep},
      {"at the inline limit: still inline", defaults::kInlineReadBytes, 8 * MiB, false, true, 0, 0,
       true, false, CacheUse::Keep},
      {"1 GB cold: workers populate, kept cached", GiB, 24 * GiB, false, true, 0, d, false, false,
       CacheUse::Keep},
      {"1 GB cached: no workers", GiB, 24 * GiB, true, true, 0, 0, false, false, CacheUse::Keep},
      {"half of memory exactly: kept", 12 * GiB, 24 * GiB, false, true, 0, d, false, false,
       CacheUse::Keep},
      {"over half of memory: read once, advised", 15 * GiB, 24 * GiB, false, true, 0, d, false,
       true, CacheUse::ReadOnce},
      {"over half, cached: read once, no workers", 15 * GiB, 24 * GiB, true, true, 0, 0, false,
       true, CacheUse::ReadOnce},
      {"over memory, alone: dropped behind, populated", 30 * GiB, 24 * GiB, false, true, 0, d,
       false, false, CacheUse::ReadOnceAndDrop},
      {"over memory, other ranks here: read once only", 30 * GiB, 24 * GiB, false, false, 0, d,
       false, true, CacheUse::ReadOnce},
      {"over memory, explicit workers", 30 * GiB, 24 * GiB, true, true, 2, 2, false, false,
       CacheUse::ReadOnceAndDrop},
      {"a cgroup's small limit counts as memory", 64 * MiB, 96 * MiB, false, true, 0, d, false,
       true, CacheUse::ReadOnce},
  };
  for (const auto& row : rows) {
    HostPolicyInputs in;
    in.selected_bytes = row.bytes;
    in.memory_bytes = row.memory;
    in.mostly_cached = row.cached;
    in.alone_on_host = row.alone;
    in.concurrency = row.concurrency;
    const HostPolicy policy = choose_host_policy(in);
    EXPECT_EQ(policy.workers, row.workers) << row.what;
    EXPECT_EQ(policy.advise_inline, row.advise_inline) << row.what;
    EXPECT_EQ(policy.advise, row.advise) << row.what;
    EXPECT_EQ(policy.cache_use, row.cache_use) << row.what;
  }
}

TEST(ReadThreads, EveryCaseOfTheTable) {
  const int d = defaults::kConcurrency;
  struct ThreadRow {
    const char* what;
    uint64_t bytes;
    bool direct, cached, exchanging;
    int concurrency, cores, threads;
  };
  const ThreadRow rows[] = {
      {"cold buffered: the default depth", GiB, false, false, false, 0, 2, d},
      {"O_DIRECT: the default depth", GiB, true, true, false, 0, 2, d},
      {"cached buffered: at most the cores", GiB, false, true, false, 0, 2, 2},
      {"cached buffered, cores unknown: the default", GiB, false, true, false, 0, 0, d},
      {"cached buffered, more cores than the default", GiB, false, true, false, 0, 64, d},
      {"small: the consumer's thread", 4 * MiB, false, false, false, 0, 2, 0},
      {"small but exchanging: workers", 4 * MiB, false, false, true, 0, 2, d},
      {"explicit: as asked", 4 * MiB, false, true, false, 7, 2, 7},
  };
  for (const auto& row : rows) {
    ReadThreadInputs in;
    in.selected_bytes = row.bytes;
    in.direct = row.direct;
    in.mostly_cached = row.cached;
    in.exchanging = row.exchanging;
    in.concurrency = row.concurrency;
    in.cores = row.cores;
    EXPECT_EQ(choose_read_threads(in), row.threads) << row.what;
  }
}

TEST(WorkerSpin, EveryCaseOfTheTable) {
  struct SpinRow {
    const char* what;
    bool staged, cached, alone, within_cores;
    uint32_t micros;
  };
  const SpinRow rows[] = {
      {"staged, cached, alone: spin", true, true, true, true, 300},
      {"staged, cold: the disk's wait, sleep", true, false, true, true, 0},
      {"staged, cached, other loads on the host: the cores are shared, sleep", true, true, false,
       true, 0},
      {"staged, cached, more workers than cores: sleep", true, true, true, false, 0},
      {"host target, cached: sleep", false, true, true, true, 0},
  };
  for (const auto& row : rows) {
    WorkerSpinInputs in;
    in.staged = row.staged;
    in.mostly_cached = row.cached;
    in.alone = row.alone;
    in.within_cores = row.within_cores;
    EXPECT_EQ(choose_worker_spin_us(in), row.micros) << row.what;
  }
}

TEST(StagedReadBytes, EveryCaseOfTheTable) {
  const uint64_t chunk = defaults::kChunkBytes;
  struct SliceRow {
    const char* what;
    uint64_t requested;
    bool cached, alone;
    int reads, processes;
    uint64_t cache, slice;
  };
  const SliceRow rows[] = {
      {"asked: as asked", 3 * MiB, true, true, 2, 1, 32 * MiB, 3 * MiB},
      {"cold: the chunk", 0, false, true, 2, 1, 32 * MiB, chunk},
      {"ranks planning alike: the chunk", 0, true, false, 2, 1, 32 * MiB, chunk},
      {"cache unknown: the chunk", 0, true, true, 2, 1, 0, chunk},
      // 6 slots (2 reads, one queued behind each, 2 under copy) of a slice and its O_DIRECT
      // widening in 16 MiB: 2 MiB slices.
      {"warm, 2 reads, 32 MiB cache: 2 MiB", 0, true, true, 2, 1, 32 * MiB, 2 * MiB},
      {"warm, 2 reads, 56 MiB cache: 4 MiB", 0, true, true, 2, 1, 56 * MiB, 4 * MiB},
      {"warm, 2 reads, 48 MiB: 6 x 4 MiB and widening is over 24", 0, true, true, 2, 1, 48 * MiB,
       2 * MiB},
      {"warm, 4 reads, 32 MiB cache: 2 MiB at least", 0, true, true, 4, 1, 32 * MiB, 2 * MiB},
      {"warm, 2 reads, 128 MiB cache: 8 MiB", 0, true, true, 2, 1, 128 * MiB, 8 * MiB},
      {"warm, a cache that holds more: the chunk at most", 0, true, true, 4, 1, GiB, chunk},
      {"warm, 4 processes share 256 MiB: 2 MiB", 0, true, true, 4, 4, 256 * MiB, 2 * MiB},
      {"warm, a small cache: 2 MiB at least", 0, true, true, 2, 1, 4 * MiB, 2 * MiB},
      {"warm, no reads known: counted as one", 0, true, true, 0, 1, 40 * MiB, 4 * MiB},
  };
  for (const auto& row : rows) {
    StagedReadInputs in;
    in.requested = row.requested;
    in.mostly_cached = row.cached;
    in.alone = row.alone;
    in.reads_at_once = row.reads;
    in.processes_on_host = row.processes;
    in.last_level_cache = row.cache;
    EXPECT_EQ(choose_staged_read_bytes(in), row.slice) << row.what;
  }
}

TEST(LoadFilePath, SmallHostFilesOfFewTensorsAreReadAndTheRestTakeOnePass) {
  const auto read = LoadFilePath::EachTensorRead;
  const auto pass = LoadFilePath::OnePass;
  struct PathRow {
    const char* what;
    uint64_t bytes, tensors;
    bool host, maps;
    LoadFilePath path;
  };
  const PathRow rows[] = {
      {"no tensors on the host: read (nothing to read)", 0, 0, true, false, read},
      {"64 KiB in 4 tensors on the host: read", 64 * 1024, 4, true, false, read},
      {"1 MiB in 32 tensors on the host: read", MiB, 32, true, false, read},
      {"a byte over 1 MiB on the host: a pass", MiB + 1, 4, true, false, pass},
      {"33 tensors on the host: a pass", 64 * 1024, 33, true, false, pass},
      {"1 GiB on the host: a pass", GiB, 4, true, false, pass},
      {"64 KiB to a device: its staged pass", 64 * 1024, 4, false, false, pass},
      {"64 KiB under mmap (random access maps): a pass", 64 * 1024, 4, true, true, pass},
  };
  for (const auto& row : rows) {
    LoadFileInputs in;
    in.selected_bytes = row.bytes;
    in.tensors = row.tensors;
    in.host_target = row.host;
    in.random_access_maps = row.maps;
    EXPECT_EQ(choose_load_file_path(in), row.path) << row.what;
  }
}

}  // namespace
}  // namespace instanttensor::plan
