// ReadScheduler (loader/reads/read_scheduler.h): tags counted per piece, the first failure of each
// tag kept, the smallest failed tag reported, drain and forget; inline (no workers) and threaded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "helper_files.h"
#include "io/fault_injection.h"
#include "io/io_setup.h"
#include "loader/reads/read_scheduler.h"
#include "loader/reads/read_tags.h"

namespace instanttensor::loader {
namespace {

using testing::TempDir;

struct OneFile {
  TempDir dir;
  std::string path = dir.file("bytes.bin");
  std::string bytes;
  int fd = -1;
  explicit OneFile(size_t size) {
    for (size_t i = 0; i < size; ++i) bytes.push_back(static_cast<char>(i * 7 + 3));
    testing::write_bytes(path, bytes);
    fd = ::open(path.c_str(), O_RDONLY);
  }
  ~OneFile() { ::close(fd); }
  std::vector<io::FileToRead> files() const { return {io::FileToRead{path, fd, bytes.size()}}; }
};

class ReadSchedulerTest : public ::testing::TestWithParam<int> {};

TEST_P(ReadSchedulerTest, TagsCompleteWhenEveryPieceHasLanded) {
  OneFile file(1 << 20);
  io::IoSetup io({"pread"}, file.files());
  Stats stats;
  ReadScheduler reads(io, /*threads=*/GetParam(), /*depth=*/4, /*chunk_size=*/64 << 10, stats);
  EXPECT_TRUE(reads.done(read_tags::group(7)));  // never submitted
  std::vector<uint8_t> a(300 << 10), b(100);
  size_t pieces = reads.submit(0, plan::align_range(0, a.size(), 1), a.data(), read_tags::group(0));
  EXPECT_EQ(pieces, 5u);  // 300 KiB in 64 KiB chunks
  reads.submit(0, plan::align_range(12345, b.size(), 1), b.data(), read_tags::share(0));
  while (!reads.done(read_tags::group(0)) || !reads.done(read_tags::share(0))) reads.wait_one();
  EXPECT_EQ(std::memcmp(a.data(), file.bytes.data(), a.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), file.bytes.data() + 12345, b.size()), 0);
  EXPECT_FALSE(reads.failure(read_tags::group(0)));
  EXPECT_FALSE(reads.first_failed_tag());
  EXPECT_TRUE(reads.succeeded(read_tags::group(0)));
  EXPECT_FALSE(reads.succeeded(read_tags::group(7)));  // unknown: not known to have succeeded
  reads.forget(read_tags::group(0));
  EXPECT_FALSE(reads.succeeded(read_tags::group(0)));  // forgotten: its bytes are the caller's
  reads.forget(read_tags::share(0));
  EXPECT_EQ(stats.bytes_read, a.size() + b.size());
  EXPECT_EQ(reads.in_flight(), 0u);
}

TEST_P(ReadSchedulerTest, AFailedReadIsReportedForItsTagAloneUntilForgotten) {
  OneFile file(1 << 20);
  io::IoSetup io({"pread"}, file.files());
  Stats stats;
  ReadScheduler reads(io, GetParam(), 4, 64 << 10, stats);
  std::vector<uint8_t> a(256 << 10), b(256 << 10);
  io::FaultPlan plan;
  plan.fail_read_number = 2;  // the second read call from now on fails with EIO
  plan.fail_errno = EIO;
  io::arm_faults(plan);
  reads.submit(0, plan::align_range(0, a.size(), 1), a.data(), read_tags::share(3));
  reads.submit(0, plan::align_range(0, b.size(), 1), b.data(), read_tags::group(5));
  while (!reads.done(read_tags::share(3)) || !reads.done(read_tags::group(5))) reads.wait_one();
  io::disarm_faults();
  auto failed = reads.first_failed_tag();
  ASSERT_TRUE(failed);
  ASSERT_TRUE(reads.failure(*failed));
  EXPECT_EQ(reads.failure(*failed)->error, EIO);
  // Exactly one tag failed; once forgotten, nothing is reported.
  const uint64_t other = *failed == read_tags::group(5) ? read_tags::share(3) : read_tags::group(5);
  EXPECT_FALSE(reads.failure(other));
  EXPECT_FALSE(reads.succeeded(*failed));
  EXPECT_TRUE(reads.succeeded(other));
  reads.forget(*failed);
  EXPECT_FALSE(reads.first_failed_tag());
}

TEST_P(ReadSchedulerTest, DrainWaitsForEveryReadAndForgetsEveryTag) {
  OneFile file(4 << 20);
  io::IoSetup io({"pread"}, file.files());
  Stats stats;
  ReadScheduler reads(io, GetParam(), 4, 64 << 10, stats);
  std::vector<uint8_t> a(file.bytes.size());
  reads.submit(0, plan::align_range(0, a.size(), 1), a.data(), read_tags::group(1));
  reads.drain();
  EXPECT_EQ(reads.in_flight(), 0u);
  EXPECT_TRUE(reads.done(read_tags::group(1)));
  EXPECT_EQ(std::memcmp(a.data(), file.bytes.data(), a.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(InlineAndWorkers, ReadSchedulerTest, ::testing::Values(0, 3));

TEST(ReadTags, KindsAreDisjointAndOnlyGroupsAndSharesBelongToThePass) {
  EXPECT_TRUE(read_tags::is_group(read_tags::group(42)));
  EXPECT_TRUE(read_tags::is_share(read_tags::share(42)));
  EXPECT_FALSE(read_tags::is_group(read_tags::share(42)));
  EXPECT_TRUE(read_tags::of_the_pass(read_tags::group(0)));
  EXPECT_TRUE(read_tags::of_the_pass(read_tags::share(0)));
  EXPECT_FALSE(read_tags::of_the_pass(read_tags::load_into(0)));
  EXPECT_FALSE(read_tags::of_the_pass(read_tags::kRandomAccess));
  EXPECT_NE(read_tags::load_into(5), read_tags::share(5));
}

}  // namespace
}  // namespace instanttensor::loader
