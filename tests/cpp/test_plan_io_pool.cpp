// Plan, io and pool layers on their own (torch-free).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/userfaultfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>

#include "format/checkpoint.h"
#include "format/writer.h"
#include "helper_files.h"
#include "instanttensor/error.h"
#include "io/cache_size.h"
#include "io/direct_io.h"
#include "io/fault_free_copy.h"
#include "io/file_lease.h"
#include "io/mapped_files.h"
#include "io/memory_limit.h"
#include "io/page_cache_read_ahead.h"
#include "io/process_id.h"
#include "io/read_backend.h"
#include "io/read_method_probe.h"
#include "io/untouched_pages.h"
#include "plan/read_plan.h"
#include "pool/ring_allocator.h"

namespace instanttensor {
namespace {

using format::Dtype;
using testing::TempDir;

// Four U8 tensors of 10, 20, 30 and 40 bytes in one file: storage order a, b, c, d.
std::string write_four(const TempDir& dir) {
  static const std::string bytes(100, 'x');
  std::vector<format::WriterTensor> tensors;
  const char* names[] = {"a", "b", "c", "d"};
  for (int i = 0; i < 4; ++i) {
    uint64_t n = 10 * (i + 1);
    tensors.push_back(format::WriterTensor{names[i], Dtype::U8, {n}, bytes.data(), n});
  }
  std::string path = dir.file("four.safetensors");
  format::write_safetensors(path, tensors, nullptr);
  return path;
}

TEST(ReadPlan, GroupsNeighboursUpToTheLimitAndSplitsNothingElse) {
  TempDir dir;
  format::Checkpoint checkpoint({write_four(dir)});
  auto plan = plan::make_read_plan(checkpoint, {3, 0, 1, 2}, 35);
  EXPECT_EQ(plan.items, (std::vector<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(plan.total_bytes, 100u);
  EXPECT_EQ(plan.largest_tensor, 40u);
  ASSERT_EQ(plan.groups.size(), 3u);  // {a,b}=30, {c}=30, {d}=40 (alone, over the limit)
  EXPECT_EQ(plan.groups[0].item_count, 2u);
  EXPECT_EQ(plan.groups[0].length, 30u);
  EXPECT_EQ(plan.groups[2].length, 40u);
  EXPECT_EQ(plan.group_of, (std::vector<size_t>{0, 0, 1, 2}));
  auto single = plan::make_read_plan(checkpoint, {0, 1, 2, 3}, 0);
  EXPECT_EQ(single.groups.size(), 4u);
}

TEST(ReadPlan, SelectionReadsOnlySelectedRanges) {
  TempDir dir;
  format::Checkpoint checkpoint({write_four(dir)});
  auto plan = plan::make_read_plan(checkpoint, {0, 2}, 1 << 20);  // a and c do not touch
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].length + plan.groups[1].length, 40u);
  EXPECT_EQ(plan.groups[1].file_offset, checkpoint.tensors()[2].file_offset);
}

TEST(ReadPlan, PiecesCoverTheGroupExactly) {
  auto pieces = plan::split_into_pieces(plan::align_range(100, 25, 1), 10);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].offset, 20u);
  EXPECT_EQ(pieces[2].length, 5u);
  EXPECT_EQ(pieces[2].required, 5u);
  EXPECT_TRUE(plan::split_into_pieces(plan::align_range(7, 0, 512), 10).empty());
}

TEST(ReadPlan, AlignedRangesCoverTheWantedBytesForDirectIo) {
  auto range = plan::align_range(1000, 3000, 512);  // wanted [1000, 4000)
  EXPECT_EQ(range.begin, 512u);
  EXPECT_EQ(range.span, 3584u);  // [512, 4096)
  EXPECT_EQ(range.prefix, 488u);
  auto pieces = plan::split_into_pieces(range, 1024);
  ASSERT_EQ(pieces.size(), 4u);
  for (const auto& piece : pieces) EXPECT_EQ(piece.offset % 512, 0u);
  EXPECT_EQ(pieces[3].offset, 3072u);
  EXPECT_EQ(pieces[3].length, 512u);
  EXPECT_EQ(pieces[3].required, 488u + 3000u - 3072u);  // the rest may be past end of file
  EXPECT_EQ(pieces[0].required, 1024u);
}

TEST(ProcessId, IsThisProcessInAForkedChildAndItsChild) {
  EXPECT_EQ(io::current_process_id(), ::getpid());
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Exit codes: 0 right, 1 the child read its parent's id, 2 the grandchild did.
    if (io::current_process_id() != ::getpid()) ::_exit(1);
    pid_t grandchild = ::fork();
    if (grandchild == 0) ::_exit(io::current_process_id() == ::getpid() ? 0 : 2);
    int status = 0;
    ::waitpid(grandchild, &status, 0);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(io::current_process_id(), ::getpid());  // the parent's is unchanged
}

TEST(MemoryLimit, ACgroupsLimitFileIsACountOrNone) {
  EXPECT_EQ(io::parse_cgroup_memory_max("8589934592\n"), 8589934592ull);
  EXPECT_EQ(io::parse_cgroup_memory_max("1024"), 1024ull);
  EXPECT_EQ(io::parse_cgroup_memory_max("max\n"), UINT64_MAX);  // v2: no limit
  EXPECT_EQ(io::parse_cgroup_memory_max(""), UINT64_MAX);       // no such file
  EXPECT_EQ(io::parse_cgroup_memory_max("12 KiB\n"), UINT64_MAX);
  // v1 states "no limit" as a huge count, which the machine's memory then caps.
  EXPECT_EQ(io::parse_cgroup_memory_max("9223372036854771712\n"), 9223372036854771712ull);
}

TEST(CacheSize, ASysfsSizeIsBytesInItsUnitOrNone) {
  EXPECT_EQ(io::parse_cache_size("32768K\n"), 32ull << 20);
  EXPECT_EQ(io::parse_cache_size("2M"), 2ull << 20);
  EXPECT_EQ(io::parse_cache_size("1G\n"), 1ull << 30);
  EXPECT_EQ(io::parse_cache_size("512"), 512u);
  EXPECT_EQ(io::parse_cache_size(""), 0u);  // no such file
  EXPECT_EQ(io::parse_cache_size("32 MiB"), 0u);
  EXPECT_EQ(io::parse_cache_size("K"), 0u);
}

TEST(CacheSize, TheLastLevelIsTheHighestUnifiedCacheSysfsStates) {
  unsetenv("INSTANTTENSOR_TESTING_LLC_BYTES");  // the measured size, not a test's
  int highest = 0;
  uint64_t bytes = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string folder =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream type_file(folder + "type"), size_file(folder + "size"),
        level_file(folder + "level");
    std::string type, size;
    int level = 0;
    if (!(type_file >> type)) break;
    if (type == "Unified" && (size_file >> size) && (level_file >> level) && level > highest) {
      highest = level;
      bytes = io::parse_cache_size(size);
    }
  }
  EXPECT_EQ(io::last_level_cache_bytes(), bytes);  // 0: none stated
}

TEST(LargestFolio, IsAWholeNumberOfPagesAndWhatTheKernelStates) {
  const uint64_t unit = io::largest_folio_bytes();
  EXPECT_GE(unit, io::page_size());
  EXPECT_EQ(unit % io::page_size(), 0u);
  std::ifstream stated("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  uint64_t bytes = 0;
  if (stated >> bytes) {
    EXPECT_EQ(unit, bytes);  // a kernel with THP states it
  }
}

TEST(MemoryLimit, IsAtMostThePhysicalMemory) {
  const uint64_t physical = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<uint64_t>(::sysconf(_SC_PAGE_SIZE));
  const uint64_t limit = io::memory_limit_bytes();
  EXPECT_GT(limit, 0u);
  EXPECT_LE(limit, physical);
  EXPECT_EQ(io::memory_limit_bytes(), limit);  // read once
}

TEST(PageCacheReadAhead, PopulatesWithinTheWindowAheadOfTheConsumerOnly) {
  TempDir dir;
  const uint64_t mib = 1 << 20;
  std::string path = dir.file("eight");
  testing::write_bytes(path, std::string(8 * mib, 'x'));
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto files = std::make_shared<const io::MappedFiles>(
      std::vector<io::FileToRead>{io::FileToRead{path, fd, 8 * mib}});
  {
    // Two spans, the second starting mid-page: chunks are page-aligned and cover both.
    io::PageCacheReadAhead ahead(files, {{0, 0, 3 * mib}, {0, 3 * mib + 100, 8 * mib}},
                                 /*window=*/2 * mib, /*chunk=*/mib, io::ReadAheadPolicy{2});
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), 0u);  // nothing before a pass begins
    ahead.restart();
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), 2u);  // chunks at 0 and 1 MiB: none past the window
    // The consumer jumps to 5 MiB: chunks behind it are skipped (they would map pages it passed),
    // the three within the window ahead of it populated.
    ahead.advance(5 * mib);
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), 5u);
    EXPECT_EQ(ahead.bytes_populated(), 5 * mib);
    EXPECT_NE(ahead.description().find("2 workers"), std::string::npos);
    ahead.restart();  // a new pass populates from the start again
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), 7u);
  }
  {
    // The consumer unmaps what lies before a position: chunks starting before it are skipped
    // from then on, and settle_before returns only once none of them is being populated.
    io::PageCacheReadAhead ahead(files, {{0, 0, 8 * mib}}, 2 * mib, mib, io::ReadAheadPolicy{2});
    ahead.restart();
    ahead.settle_before(UINT64_MAX);  // the pass ends at once
    const uint64_t settled = ahead.chunks_populated();
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), settled);  // none was still in flight
    ahead.restart();                               // a new pass: no floor
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), settled + 2);
    ahead.settle_before(5 * mib);
    ahead.advance(3 * mib);  // 3 and 4 MiB within the window, but before the floor
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), settled + 2);
    ahead.advance(5 * mib);  // 5 and 6 MiB
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), settled + 4);
  }
  {
    // A chunk the floor cuts is populated from the floor's page on, not skipped whole: the
    // consumer's next tensor starts inside it.
    io::PageCacheReadAhead ahead(files, {{0, 0, 8 * mib}}, 8 * mib, 4 * mib,
                                 io::ReadAheadPolicy{1});
    ahead.settle_before(5 * mib + 100);
    ahead.advance(5 * mib);  // the chunk at 0 is passed; the one at 4 MiB is cut at 5 MiB
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.bytes_populated(), 3 * mib);  // 5 to 8 MiB, in two slices
    EXPECT_EQ(ahead.chunks_populated(), 1u);
  }
  {
    // The same cut in a chunk whose span starts mid-page: position 2 MiB - 100 is the byte at
    // 2 MiB, so the first chunk is populated from 2 MiB, the second whole (a cut that forgot
    // the 100 bytes before the span would start a page early: 6 MiB + 4 KiB).
    io::PageCacheReadAhead ahead(files, {{0, 100, 8 * mib}}, 8 * mib, 4 * mib,
                                 io::ReadAheadPolicy{1});
    ahead.settle_before(2 * mib - 100);
    ahead.advance(2 * mib - 100);
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(), 2u);
    EXPECT_EQ(ahead.bytes_populated(), 6 * mib);
  }
  {
    io::PageCacheReadAhead none(files, {{0, 0, 8 * mib}}, 8 * mib, mib, io::ReadAheadPolicy{});
    none.advance(mib);
    EXPECT_EQ(none.chunks_populated(), 0u);
    EXPECT_EQ(none.description(), "no read-ahead");
  }
  {
    // No workers, advice on the consumer's thread: done when advance() returns, within the
    // window only, each chunk once per pass.
    io::PageCacheReadAhead advised(files, {{0, 0, 8 * mib}}, 2 * mib, mib,
                                   io::ReadAheadPolicy{0, /*advise_inline=*/true});
    EXPECT_EQ(advised.chunks_populated(), 0u);
    advised.restart();
    EXPECT_EQ(advised.chunks_populated(), 2u);
    advised.advance(mib / 2);
    EXPECT_EQ(advised.chunks_populated(), 3u);  // 2 MiB now within; 0 and 1 MiB not again
    advised.advance(5 * mib);
    EXPECT_EQ(advised.chunks_populated(), 5u);  // 5 and 6 MiB; 3 and 4 MiB, passed, skipped
    EXPECT_EQ(advised.description(), "MADV_WILLNEED on the consumer's thread");
  }
  {
    // A file truncated under the mapping: population is advice, never SIGBUS in a worker; the
    // chunks past the new end are not populated (MADV_POPULATE_READ refuses them: EFAULT).
    ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(mib)), 0);
    io::PageCacheReadAhead ahead(files, {{0, 0, 8 * mib}}, 8 * mib, mib, io::ReadAheadPolicy{2});
    ahead.restart();
    ahead.wait_until_idle();
    EXPECT_EQ(ahead.chunks_populated(),
              ahead.method() == io::PopulateMethod::PopulateRead ? 1u : 8u);
  }
  ::close(fd);
}

TEST(ResidentFraction, CountsCachedPagesExactlyOrBySampling) {
  TempDir dir;
  // Counted exactly (1 MiB), sampled just past that, and sampled over a larger file.
  for (uint64_t size : {uint64_t{1} << 20, (uint64_t{1} << 20) + 4096, uint64_t{64} << 20}) {
    std::string path = dir.file("resident-" + std::to_string(size));
    testing::write_bytes(path, std::string(size, 'x'));
    int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fsync(fd), 0);
    std::string sink(size, '\0');
    ASSERT_EQ(::pread(fd, sink.data(), size, 0), static_cast<ssize_t>(size));
    for (bool cachestat : {true, false}) {
      EXPECT_GE(io::resident_fraction(fd, size, cachestat), 0.99) << size << " " << cachestat;
    }
    // Drop it all, then read the first half back without readahead (dropping only the second
    // half would keep large folios that straddle the middle).
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    if (io::resident_fraction(fd, size, false) > 0.1) {  // tmpfs keeps its pages
      ::close(fd);
      GTEST_SKIP() << "the page cache of " << dir.path() << " cannot be dropped";
    }
    ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM), 0);
    ASSERT_EQ(::pread(fd, sink.data(), size / 2, 0), static_cast<ssize_t>(size / 2));
    for (bool cachestat : {true, false}) {
      double fraction = io::resident_fraction(fd, size, cachestat);
      EXPECT_GT(fraction, 0.4) << size << " " << cachestat;
      EXPECT_LT(fraction, 0.6) << size << " " << cachestat;
    }
    ::close(fd);
  }
  EXPECT_EQ(io::resident_fraction(-1, 4096), 0.0);
  EXPECT_EQ(io::resident_fraction(0, 0), 0.0);
}

TEST(ReadMethodProbe, TheFasterMethodWinsAndAMethodNotTimedLoses) {
  auto slower_direct = io::decide_read_method(0.9e9, 2.3e9, 32 << 20);
  EXPECT_FALSE(slower_direct.direct);
  EXPECT_EQ(slower_direct.reason,
            "auto: buffered 2.30 GB/s against O_DIRECT 0.90 GB/s over 32 MiB each");
  auto faster_direct = io::decide_read_method(3.1e9, 2.3e9, 32 << 20);
  EXPECT_TRUE(faster_direct.direct);
  EXPECT_EQ(faster_direct.direct_rate, 3.1e9);
  EXPECT_EQ(faster_direct.buffered_rate, 2.3e9);
  // O_DIRECT must be a quarter faster: buffered reads share the page cache.
  EXPECT_FALSE(io::decide_read_method(2e9, 2e9, 1 << 20).direct);
  EXPECT_FALSE(io::decide_read_method(2.4e9, 2e9, 1 << 20).direct);
  EXPECT_TRUE(io::decide_read_method(2.5e9, 2e9, 1 << 20).direct);
  auto refused = io::decide_read_method(0, 1e9, 1 << 20);
  EXPECT_FALSE(refused.direct);
  EXPECT_EQ(refused.reason, "auto: buffered 1.00 GB/s, O_DIRECT could not be timed");
  EXPECT_TRUE(io::decide_read_method(1e9, 0, 1 << 20).direct);
  EXPECT_FALSE(io::decide_read_method(0, 0, 1 << 20).direct);
}

TEST(ReadMethodProbe, ProbesASixtyFourthOfTheCheckpointWithinBounds) {
  EXPECT_EQ(io::probe_bytes_for(0), io::kLeastProbeBytes);
  EXPECT_EQ(io::probe_bytes_for(512ull << 20), io::kLeastProbeBytes);
  EXPECT_EQ(io::probe_bytes_for(1ull << 30), 16ull << 20);
  EXPECT_EQ(io::probe_bytes_for(2ull << 30), io::kProbeBytes);
  EXPECT_EQ(io::probe_bytes_for(100ull << 30), io::kProbeBytes);
}

TEST(ReadMethodProbe, TimesBothMethodsOnTheLargestFileOnlyWhenTheCheckpointIsLargeEnough) {
  TempDir dir;
  const uint64_t probe = 256 << 10;
  std::string small_path = dir.file("small.bin");
  std::string large_path = dir.file("large.bin");
  testing::write_bytes(small_path, std::string(64 << 10, 's'));
  testing::write_bytes(large_path, std::string(4 * probe, 'l'));
  int small_fd = ::open(small_path.c_str(), O_RDONLY);
  int large_fd = ::open(large_path.c_str(), O_RDONLY);
  ASSERT_GE(small_fd, 0);
  ASSERT_GE(large_fd, 0);
  std::vector<io::FileToRead> files{{small_path, small_fd, 64 << 10},
                                    {large_path, large_fd, 4 * probe}};
  const int fds_before = testing::open_fd_count();
  const int threads_before = testing::thread_count();

  auto timed = io::measure_read_methods(files, probe, /*smallest_timed=*/1 << 20);
  EXPECT_GT(timed.buffered_rate, 0);
  io::DirectIoAlignment alignment;
  int direct_fd = io::open_direct(large_path, &alignment);
  if (direct_fd >= 0) {
    ::close(direct_fd);
    EXPECT_GT(timed.direct_rate, 0) << timed.reason;
    EXPECT_NE(timed.reason.find("against"), std::string::npos) << timed.reason;
  } else {
    EXPECT_EQ(timed.direct_rate, 0);  // tmpfs: buffered, and said
    EXPECT_NE(timed.reason.find("O_DIRECT could not be timed"), std::string::npos);
  }
  EXPECT_EQ(timed.direct,
            timed.direct_rate >= io::kDirectMargin * timed.buffered_rate && timed.direct_rate > 0);
  EXPECT_EQ(testing::open_fd_count(), fds_before);  // its O_DIRECT fd closed
  EXPECT_EQ(testing::thread_count(), threads_before);

  // Under the smallest timed size, or a largest file under two probes: buffered, not timed.
  auto small = io::measure_read_methods(files, probe, /*smallest_timed=*/64 << 20);
  EXPECT_FALSE(small.direct);
  EXPECT_EQ(small.buffered_rate, 0);
  EXPECT_EQ(small.reason, "auto: buffered, not timed (under 64 MiB)");
  auto short_file = io::measure_read_methods(files, 4 * probe, 1 << 20);
  EXPECT_EQ(short_file.buffered_rate, 0);

  // A file shorter than it claims (truncated since open): the short reads time nothing.
  ASSERT_EQ(::truncate(large_path.c_str(), probe / 2), 0);
  auto truncated = io::measure_read_methods(files, probe, 1 << 20);
  EXPECT_FALSE(truncated.direct);
  EXPECT_EQ(truncated.reason, "auto: buffered, neither read method could be timed");
  ::close(small_fd);
  ::close(large_fd);
}

// Whether this process may open a userfaultfd for user-mode faults (seccomp may refuse it).
bool userfaultfd_permitted() {
  int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

std::string pattern_bytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + i / 4099) & 0xff);
  return bytes;
}

TEST(UntouchedPages, ReadsEveryByteWithWholePagesPlacedByUserfaultfd) {
  TempDir dir;
  // Over two 4 MiB rounds of the bounce buffer, from an offset and to a length off any page.
  const std::string bytes = pattern_bytes((9 << 20) + 777);
  testing::write_bytes(dir.file("f.bin"), bytes);
  int fd = ::open(dir.file("f.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const uint64_t offset = 123;
  const uint64_t nbytes = bytes.size() - offset - 5;
  const int fds_before = testing::open_fd_count();
  auto memory = io::map_untouched_pages(nbytes);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(memory.get()) % io::page_size(), 0u);
  auto read = io::read_into_untouched_pages(fd, offset, memory.get(), nbytes);
  EXPECT_EQ(read.bytes, nbytes);
  EXPECT_EQ(read.error, 0);
  EXPECT_EQ(std::memcmp(memory.get(), bytes.data() + offset, nbytes), 0);
  if (userfaultfd_permitted()) {
    EXPECT_EQ(read.userfaultfd_error, 0);
    EXPECT_EQ(read.copied_pages, nbytes / io::page_size() * io::page_size());
  } else {
    EXPECT_NE(read.userfaultfd_error, 0);  // refused here: ordinary preads read it all
    EXPECT_EQ(read.copied_pages, 0u);
  }
  EXPECT_EQ(testing::open_fd_count(), fds_before);  // the userfaultfd closed
  // The memory is ordinary afterwards: writable, and a second read into other fresh pages too.
  memory.get()[nbytes - 1] = 'x';
  auto again = io::map_untouched_pages(4 << 20);
  EXPECT_EQ(io::read_into_untouched_pages(fd, 0, again.get(), 4 << 20).bytes, 4u << 20);
  EXPECT_EQ(std::memcmp(again.get(), bytes.data(), 4 << 20), 0);
  ::close(fd);
}

TEST(UntouchedPages, StopsAtTheEndOfTheFileAndSaysAFailedRead) {
  TempDir dir;
  const std::string bytes = pattern_bytes((5 << 20) + 100);
  testing::write_bytes(dir.file("f.bin"), bytes);
  int fd = ::open(dir.file("f.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  // Asked for more than the file holds (it shrank since open): the bytes there, no error.
  auto memory = io::map_untouched_pages(8 << 20);
  auto shorter = io::read_into_untouched_pages(fd, 4096, memory.get(), 8 << 20);
  EXPECT_EQ(shorter.bytes, bytes.size() - 4096);
  EXPECT_EQ(shorter.error, 0);
  EXPECT_EQ(std::memcmp(memory.get(), bytes.data() + 4096, shorter.bytes), 0);
  // Under a page: nothing for userfaultfd, an ordinary pread.
  auto small = io::map_untouched_pages(100);
  auto tiny = io::read_into_untouched_pages(fd, 7, small.get(), 100);
  EXPECT_EQ(tiny.bytes, 100u);
  EXPECT_EQ(tiny.copied_pages, 0u);
  EXPECT_EQ(std::memcmp(small.get(), bytes.data() + 7, 100), 0);
  ::close(fd);
  // A read that fails: its errno, nothing read (-1: a closed fd's number would be the
  // userfaultfd's own).
  auto failed = io::map_untouched_pages(1 << 20);
  auto bad = io::read_into_untouched_pages(-1, 0, failed.get(), 1 << 20);
  EXPECT_EQ(bad.bytes, 0u);
  EXPECT_EQ(bad.error, EBADF);
}

// A copy out of a private mapping whose file shrank stops at the first page past the new end
// (a memcpy there would raise SIGBUS and end the test binary); the consumer's in-place writes
// into the mapping are copied as written.
TEST(FaultFreeCopy, StopsAtAPagePastATruncationAndKeepsInPlaceWrites) {
  ASSERT_TRUE(io::fault_free_copy_available());
  TempDir dir;
  const uint64_t page = io::page_size();
  const std::string bytes = pattern_bytes(8 * page);
  const std::string path = dir.file("shrinks.bin");
  testing::write_bytes(path, bytes);
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* mapped = ::mmap(nullptr, 8 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  auto* view = static_cast<uint8_t*>(mapped);
  view[5] = static_cast<uint8_t>(~bytes[5]);  // the consumer's write: a private page now
  std::string out(8 * page, '\0');
  EXPECT_EQ(io::copy_without_faults(out.data(), view + 3, 8 * page - 3), 8 * page - 3);
  EXPECT_EQ(static_cast<uint8_t>(out[2]), view[5]);
  EXPECT_EQ(std::memcmp(out.data() + 3, bytes.data() + 6, 8 * page - 6), 0);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(3 * page + 10)), 0);
  // Pages 0-3 hold file bytes (the last one in part); from page 4 on, nothing can be read.
  EXPECT_EQ(io::copy_without_faults(out.data(), view + page, 7 * page), 3 * page);
  EXPECT_EQ(std::memcmp(out.data(), bytes.data() + page, 2 * page + 10), 0);
  EXPECT_EQ(io::copy_without_faults(out.data(), view + 5 * page, page), 0u);
  ::munmap(mapped, 8 * page);
  ::close(fd);
}

namespace {
// A private, writable mapping of the file `fd` reads, as a views pass maps it; nullptr if none.
uint8_t* map_private(int fd, size_t bytes) {
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  return map == MAP_FAILED ? nullptr : static_cast<uint8_t*>(map);
}
}  // namespace

// A read lease over views of a private mapping: the writer's open waits until the protected
// pages are private copies; the bytes stay, a neighbour's protection outlives another's, and a
// file open for writing gets no lease. The watcher thread and the caller's meet under TSan here.
TEST(FileLease, AWriterWaitsUntilTheProtectedPagesAreCopies) {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  const std::string bytes = pattern_bytes(5 * 4096 + 100);
  testing::write_bytes(path, bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto lease = io::FileLease::take(fd);
  if (!lease) {
    ::close(fd);
    if (testing::leases_required()) FAIL() << "no lease on " << path << " where one is required";
    GTEST_SKIP() << "this filesystem or process gets no lease on " << path;
  }
  uint8_t* map = map_private(fd, bytes.size());
  ASSERT_NE(map, nullptr);
  ::close(fd);  // the lease lives on a description of its own
  // Two views sharing page 1; the second written in place during its step, before it is kept
  // (a write racing with the watcher's copy is the documented lost write, not tested).
  map[6000] = static_cast<uint8_t>(map[6000] + 1);
  auto first = lease->protect(map, 100, 5000);
  auto second = lease->protect(map, 5100, 9000);
  ASSERT_TRUE(first && second);
  std::string expected = bytes;
  expected[6000] = static_cast<char>(expected[6000] + 1);
  std::thread writer([&] {
    const int w = ::open(path.c_str(), O_WRONLY);  // waits for the watcher
    ASSERT_GE(w, 0);
    const std::string junk(bytes.size(), 'x');
    ASSERT_EQ(::pwrite(w, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    ASSERT_EQ(::ftruncate(w, 0), 0);
    ::close(w);
  });
  writer.join();
  EXPECT_EQ(std::memcmp(map + 100, expected.data() + 100, 14000), 0);  // no SIGBUS, no junk
  first.reset();  // its pages go back to the (now empty) file but for page 1, still needed
  EXPECT_EQ(std::memcmp(map + 5100, expected.data() + 5100, 9000), 0);
  EXPECT_EQ(lease->protect(map, 0, 10), nullptr);  // the writer came: no more views kept
  second.reset();
  lease.reset();
  ::munmap(map, bytes.size());
  // A file open for writing anywhere gets no lease.
  testing::write_bytes(path, bytes);
  const int writing = ::open(path.c_str(), O_WRONLY);
  const int reading = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(io::FileLease::take(reading), nullptr);
  ::close(reading);
  ::close(writing);
}

// Where the kernel refuses the lease (here: the file is open for writing), a holder copies a
// view where it is at once: a rewrite and a truncation of the file leave its bytes, with no
// SIGBUS; dropped, the file's pages are mapped there again; past the cap it copies nothing.
TEST(FileLease, AHolderWhereTheLeaseIsRefusedCopiesTheViewWhereItIs) {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  const std::string bytes = pattern_bytes(5 * 4096 + 100);
  testing::write_bytes(path, bytes);
  const int writing = ::open(path.c_str(), O_WRONLY);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(writing, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(io::FileLease::take(fd), nullptr);
  auto holder = io::FileLease::copying_at_once(fd);
  ASSERT_NE(holder, nullptr);
  uint8_t* map = map_private(fd, bytes.size());
  ASSERT_NE(map, nullptr);
  ::close(fd);  // the holder maps the file's pages back through a descriptor of its own
  auto view = holder->protect(map, 100, 5000);  // pages 0 and 1
  ASSERT_NE(view, nullptr);
  const std::string junk(bytes.size(), 'x');
  ASSERT_EQ(::pwrite(writing, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  EXPECT_EQ(std::memcmp(map + 100, bytes.data() + 100, 5000), 0);  // copies, not the file's
  EXPECT_EQ(map[3 * 4096], 'x');                                   // an unprotected page
  view.reset();
  EXPECT_EQ(map[100], 'x');  // the file's pages again: a later view shows the file
  view = holder->protect(map, 100, 5000);
  ASSERT_NE(view, nullptr);
  ASSERT_EQ(::ftruncate(writing, 0), 0);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(map) + 100, 5000), junk.substr(0, 5000));
  ::setenv("INSTANTTENSOR_TESTING_VIEWS_COPIED_AT_ONCE_MAX", "1", 1);
  EXPECT_EQ(holder->protect(map, 12000, 10), nullptr);  // one alive already: the caller copies
  ::unsetenv("INSTANTTENSOR_TESTING_VIEWS_COPIED_AT_ONCE_MAX");
  view.reset();  // maps the (now empty) file back: never read again here
  holder.reset();
  ::munmap(map, bytes.size());
  ::close(writing);
}

namespace {
// The kernel map areas of this process that meet [start, start + length).
size_t map_areas_within(const uint8_t* start, uint64_t length) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  size_t areas = 0;
  const auto begin = reinterpret_cast<uintptr_t>(start);
  while (std::getline(maps, line)) {
    const uintptr_t from = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    const uintptr_t to = std::stoull(line.substr(line.find('-') + 1), nullptr, 16);
    if (from < begin + length && to > begin) ++areas;
  }
  return areas;
}
}  // namespace

// Views of one file copied at once one after the other (load_file keeps them all): their copies
// merge into one map area, pages shared by neighbours are copied once and kept while either
// lives, and a view kept again after its copy went gets a copy of its own, right. With the
// kernel's copy, and with the loader's (userfaultfd on torch's threads, as KeptViews passes).
namespace {
// The loader's way of filling copies (loader/pass/owned_copy.h, torch's threads), on two
// threads of its own: whole pages placed by userfaultfd, the rest by the kernel's copy.
uint64_t placed_on_two_threads(uint8_t* to, const uint8_t* from, uint64_t nbytes) {
  io::UntouchedPagePlacer placer(to, nbytes);
  const uint64_t half = placer.registered_bytes() / 2 / io::page_size() * io::page_size();
  uint64_t placed[2] = {0, 0};
  std::thread first([&] { placed[0] = placer.place(0, from, half); });
  placed[1] = placer.place(half, from + half, placer.registered_bytes() - half);
  first.join();
  placer.close();
  if (placed[0] + placed[1] < placer.registered_bytes()) return 0;
  const uint64_t rest = nbytes - placer.registered_bytes();
  return placer.registered_bytes() + io::copy_without_faults(to + placer.registered_bytes(),
                                                             from + placer.registered_bytes(),
                                                             rest);
}
}  // namespace

class CopiesAtOnce : public ::testing::TestWithParam<io::PageCopier> {};
INSTANTIATE_TEST_SUITE_P(Copiers, CopiesAtOnce, ::testing::Values(nullptr, &placed_on_two_threads));

TEST_P(CopiesAtOnce, NeighbouringViewsMakeOneMapArea) {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  const uint64_t page = io::page_size();
  const std::string bytes = pattern_bytes(64 * page);
  testing::write_bytes(path, bytes);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto holder = io::FileLease::copying_at_once(fd, GetParam());
  ASSERT_NE(holder, nullptr);
  uint8_t* map = map_private(fd, bytes.size());
  ASSERT_NE(map, nullptr);
  ::close(fd);
  // 20 views of 2.5 pages each from page 2: neighbours share a page. Each is written in place
  // during its step, as a consumer may.
  const uint64_t size = page * 5 / 2;
  auto start_of = [&](uint64_t i) { return 2 * page + 100 + i * size; };
  std::string expected = bytes;
  std::vector<std::shared_ptr<io::ViewProtection>> views;
  for (uint64_t i = 0; i < 20; ++i) {
    map[start_of(i)] = static_cast<uint8_t>(map[start_of(i)] + 1);
    expected[start_of(i)] = static_cast<char>(expected[start_of(i)] + 1);
    views.push_back(holder->protect(map, start_of(i), size));
    ASSERT_NE(views.back(), nullptr) << i;
  }
  // The file before the copies, the copies, the file after them.
  EXPECT_EQ(map_areas_within(map, bytes.size()), 3u);
  EXPECT_EQ(std::memcmp(map, expected.data(), bytes.size()), 0);
  // View 3 goes: its own pages are the file's again, those it shares with views 2 and 4 stay.
  const uint64_t third = start_of(3);
  views[3].reset();
  EXPECT_EQ(map[third], static_cast<uint8_t>(expected[third]));  // its first page: view 2's
  EXPECT_EQ(map[third + page], static_cast<uint8_t>(bytes[third + page]));
  EXPECT_EQ(std::memcmp(map + start_of(4), expected.data() + start_of(4), 16 * size), 0);
  // Written in place and kept again: a copy of its own, where the first one was.
  map[third + page] = 7;
  views[3] = holder->protect(map, third, size);
  ASSERT_NE(views[3], nullptr);
  EXPECT_EQ(map[third + page], 7);
  views.clear();  // every page the file's again
  EXPECT_EQ(std::memcmp(map, bytes.data(), bytes.size()), 0);
  holder.reset();
  ::munmap(map, bytes.size());
}

namespace {
// A copier that runs `during_copy` first: the test's hook into a copy under way.
std::function<void()> during_copy;
uint64_t copy_calling_back(uint8_t* to, const uint8_t* from, uint64_t nbytes) {
  if (during_copy) during_copy();
  return io::copy_without_faults(to, from, nbytes);
}
}  // namespace

// A holder copies without the process's lease lock: a neighbour dropped on another thread
// during the copy goes at once (it used to wait for the whole copy, as a fork or another file's
// lease break did), and the page it shares with the view being copied stays a copy.
TEST(FileLease, AHolderCopiesWithoutTheLeaseLock) {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  const uint64_t page = io::page_size();
  const std::string bytes = pattern_bytes(8 * page);
  testing::write_bytes(path, bytes);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto holder = io::FileLease::copying_at_once(fd, &copy_calling_back);
  ASSERT_NE(holder, nullptr);
  uint8_t* map = map_private(fd, bytes.size());
  ASSERT_NE(map, nullptr);
  auto first = holder->protect(map, 100, 2 * page);  // pages 0-2
  ASSERT_NE(first, nullptr);
  std::mutex mutex;
  std::condition_variable changed;
  bool dropped = false;
  bool dropped_during_copy = false;
  std::thread dropper;
  during_copy = [&] {
    dropper = std::thread([&] {
      first.reset();  // waits for the lease lock if the copy holds it
      std::lock_guard<std::mutex> lock(mutex);
      dropped = true;
      changed.notify_one();
    });
    std::unique_lock<std::mutex> lock(mutex);
    dropped_during_copy = changed.wait_for(lock, std::chrono::seconds(10), [&] { return dropped; });
  };
  auto second = holder->protect(map, 100 + 2 * page, 2 * page);  // pages 2-4: shares page 2
  during_copy = nullptr;
  dropper.join();
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(dropped_during_copy) << "dropping a view waited for another view's copy";
  const std::string junk(bytes.size(), 'x');
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  EXPECT_EQ(map[page], 'x');  // the first's own: the file's
  EXPECT_EQ(map[2 * page + 50], static_cast<uint8_t>(bytes[2 * page + 50]));  // shared: a copy
  EXPECT_EQ(std::memcmp(map + 2 * page, bytes.data() + 2 * page, 2 * page), 0);
  second.reset();
  holder.reset();
  ::munmap(map, bytes.size());
  ::close(fd);
}

TEST(PreadPool, ReadsEveryRequestAndReportsTruncationAndErrors) {
  TempDir dir;
  std::string path = dir.file("data.bin");
  std::string content(1 << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 31 + 7);
  testing::write_bytes(path, content);
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string out(content.size(), '\0');
  {
    auto backend = io::make_pread_pool(3);
    for (uint64_t i = 0; i < 16; ++i) {
      backend->submit(io::ReadRequest{fd, i * 65536, 65536, out.data() + i * 65536, i});
    }
    std::set<uint64_t> tags;
    while (backend->in_flight() > 0) {
      auto done = backend->wait_completion();
      EXPECT_EQ(done.error, 0);
      EXPECT_FALSE(done.truncated);
      EXPECT_EQ(done.bytes, 65536u);
      tags.insert(done.tag);
    }
    EXPECT_EQ(tags.size(), 16u);
    EXPECT_EQ(out, content);

    std::string tail(100, '\0');
    backend->submit(io::ReadRequest{fd, content.size() - 10, 100, tail.data(), 99});
    auto short_read = backend->wait_completion();
    EXPECT_TRUE(short_read.truncated);
    EXPECT_EQ(short_read.bytes, 10u);

    backend->submit(io::ReadRequest{-1, 0, 10, tail.data(), 5});
    auto failed = backend->wait_completion();
    EXPECT_EQ(failed.error, EBADF);
  }
  ::close(fd);
}

TEST(PreadPool, SpinningWorkersServeEachRequestAndStopWithoutWaitingTheSpinOut) {
  TempDir dir;
  std::string path = dir.file("data.bin");
  std::string content(1 << 18, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 13 + 5);
  testing::write_bytes(path, content);
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string out(content.size(), '\0');
  std::chrono::steady_clock::time_point stopping;
  {
    // Idle workers spin for up to a minute: the requests below come one at a time, and the
    // destruction must end a spin rather than wait it out.
    auto backend = io::make_pread_pool(2, 60u * 1000 * 1000);
    for (uint64_t i = 0; i < 8; ++i) {  // one at a time: every worker idles in between
      backend->submit(io::ReadRequest{fd, i * 32768, 32768, out.data() + i * 32768, i});
      auto done = backend->wait_completion();
      EXPECT_EQ(done.tag, i);
      EXPECT_EQ(done.bytes, 32768u);
      EXPECT_EQ(done.error, 0);
    }
    stopping = std::chrono::steady_clock::now();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(30));
  EXPECT_EQ(out, content);
  ::close(fd);
}

TEST(PreadPool, AWorkerWhoseIdleSpellOutlastedTheSpinSleepsThroughTheNext) {
  TempDir dir;
  std::string path = dir.file("data.bin");
  testing::write_bytes(path, std::string(4096, 'q'));
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string out(4096, '\0');
  auto backend = io::make_pread_pool(1, 200u * 1000);  // spins 200 ms at most
  auto read_once = [&] {
    backend->submit(io::ReadRequest{fd, 0, 4096, out.data(), 0});
    EXPECT_EQ(backend->wait_completion().bytes, 4096u);
  };
  // The idle spell itself is the stimulus, so it is waited out here: 400 ms, longer than the
  // spin. The worker spins before the first request and in the first spell (it came from a
  // short one: the request followed the pool's start at once), which it counts as it begins;
  // the first outlasted the spin, so it sleeps through the second. A worker preempted past
  // the first spell's start is waited for; the second is given the time a spun spell would
  // need to be counted (a worker starved that long passes wrongly, never fails wrongly).
  read_once();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (backend->idle_spells_spun() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(backend->idle_spells_spun(), 2u) << "the first idle spell was not spun";
  read_once();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(backend->idle_spells_spun(), 2u) << "the second idle spell was spun too";
  EXPECT_EQ(out, std::string(4096, 'q'));
  backend.reset();
  ::close(fd);
}

TEST(InlineReader, WaitingWithNothingSubmittedIsAnError) {
  auto reader = io::make_inline_reader([](const io::ReadRequest&) { return io::ReadCompletion{}; });
  EXPECT_THROW(reader->wait_completion(), Error);
}

TEST(PreadPool, DestructionJoinsWorkersWithRequestsQueued) {
  int threads_before = testing::thread_count();
  TempDir dir;
  std::string path = dir.file("data.bin");
  testing::write_bytes(path, std::string(1 << 16, 'z'));
  int fd = ::open(path.c_str(), O_RDONLY);
  std::vector<std::string> out(64, std::string(1 << 16, '\0'));  // one destination per read
  {
    auto backend = io::make_pread_pool(4);
    EXPECT_EQ(testing::thread_count(), threads_before + 4);
    for (int i = 0; i < 64; ++i) {
      backend->submit(io::ReadRequest{fd, 0, 1 << 16, out[i].data(), 0});
    }
  }
  EXPECT_EQ(out[63], std::string(1 << 16, 'z'));  // queued reads finished before the join
  EXPECT_EQ(testing::thread_count(), threads_before);
  ::close(fd);
}

TEST(RingAllocator, FifoPlacementWrapsAndKeepsPhase) {
  pool::RingAllocator ring(1000, 64);
  auto a = ring.allocate(400, 0);
  ASSERT_TRUE(a);
  EXPECT_EQ(*a, 0u);
  auto b = ring.allocate(400, 3);  // phase 3: starts at 448 + 3 = 451
  ASSERT_TRUE(b);
  EXPECT_EQ(*b % 64, 3u);
  EXPECT_GE(*b, 400u);
  EXPECT_FALSE(ring.allocate(300, 0));  // neither after b nor before a
  ring.release_oldest();                // a goes
  auto c = ring.allocate(300, 0);       // wraps to the front
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, 0u);
  EXPECT_FALSE(ring.allocate(200, 0));  // between c's end (300) and b (451): 151 bytes only
  auto d = ring.allocate(100, 0);       // 320..420 fits before b
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, 320u);
  ring.release_oldest();
  ring.release_oldest();
  ring.release_oldest();
  EXPECT_TRUE(ring.empty());
  auto whole = ring.allocate(1000, 0);
  ASSERT_TRUE(whole);
  EXPECT_FALSE(ring.allocate(1, 0));
}

TEST(RingAllocator, PlacesBelowItsLimitUntilRaised) {
  pool::RingAllocator ring(1000, 1);
  ring.set_limit(300);
  EXPECT_EQ(ring.allocate(200, 0), 0u);
  EXPECT_EQ(ring.allocate(200, 0), std::nullopt);  // would end past the limit
  ring.set_limit(5000);                            // at most the capacity
  EXPECT_EQ(ring.limit(), 1000u);
  EXPECT_EQ(ring.allocate(200, 0), 200u);
  ring.release_oldest();
  ring.set_limit(450);  // lowered: what no longer fits below it wraps to the start
  EXPECT_EQ(ring.allocate(100, 0), 0u);
  EXPECT_EQ(ring.allocate(150, 0), std::nullopt);
}

TEST(RingAllocator, RandomizedNeverOverlapsLiveRegions) {
  pool::RingAllocator ring(4096, 64);
  std::deque<std::pair<uint64_t, uint64_t>> live;
  uint32_t seed = 12345;
  auto next_random = [&] { return seed = seed * 1664525u + 1013904223u; };
  for (int step = 0; step < 20000; ++step) {
    uint64_t size = 1 + next_random() % 900;
    auto at = ring.allocate(size, next_random() % 64);
    if (!at) {
      ASSERT_FALSE(live.empty()) << "an empty ring refused " << size << " bytes";
      ring.release_oldest();
      live.pop_front();
      continue;
    }
    ASSERT_LE(*at + size, 4096u);
    for (const auto& [begin, end] : live) {
      ASSERT_TRUE(*at + size <= begin || *at >= end) << "overlap at step " << step;
    }
    live.emplace_back(*at, *at + size);
  }
}

}  // namespace
}  // namespace instanttensor
