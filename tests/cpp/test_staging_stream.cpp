// DeviceStage and the StagingStream (loader/transfer/device_stage.h,
// loader/transfer/staging_stream.h) with a CPU target, the same code an accelerator runs: slices
// read into a small staging ring reach their destinations and are taken in submission order; a
// slice whose read is done is copied ahead of an older one still reading and its memory reused;
// a full ring of waiting slices refuses more; a dropped slice is never copied.
#include <c10/util/ScopeExit.h>
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
#include "loader/transfer/device_stage.h"
#include "loader/transfer/staging_stream.h"

namespace instanttensor::loader {
namespace {

struct Fixture {
  testing::TempDir dir;
  std::string path = dir.file("bytes.bin");
  std::string bytes;
  int fd = -1;
  std::unique_ptr<io::IoSetup> io;
  Stats stats;
  std::unique_ptr<ReadScheduler> reads;
  Fixture() {
    for (int i = 0; i < (128 << 10); ++i) bytes.push_back(static_cast<char>(i * 13 + 1));
    testing::write_bytes(path, bytes);
    fd = ::open(path.c_str(), O_RDONLY);
    io = std::make_unique<io::IoSetup>(std::vector<std::string>{"pread"},
                                       std::vector<io::FileToRead>{{path, fd, bytes.size()}});
    reads = std::make_unique<ReadScheduler>(*io, 2, 4, 4096, stats);
  }
  ~Fixture() {
    reads.reset();
    io.reset();
    ::close(fd);
  }
  void land(StagingStream& stream) {
    while (!reads->done(stream.oldest_tag())) reads->wait_one();
    reads->forget(stream.oldest_tag());
    stream.copy_oldest();
  }
};

TEST(DeviceStage, CopiesAndOwnedAllocationsOnTheTarget) {
  DeviceStage stage(c10::Device(c10::DeviceType::CPU), 4096, 64, 0);
  std::vector<uint8_t> from(100, 7), to(100, 0);
  stage.copy_to_device(from.data(), to.data(), from.size()).wait("staging_reuse");
  EXPECT_EQ(to, from);
  c10::DataPtr owned = stage.allocate_owned(256);
  ASSERT_NE(owned.get(), nullptr);
  EXPECT_TRUE(owned.device().is_cpu());
  c10::DataPtr copy = stage.copy_on_device(from.data(), from.size());
  EXPECT_EQ(std::memcmp(copy.get(), from.data(), from.size()), 0);
  EXPECT_EQ(stage.close(), 0u);
}

TEST(StagingStream, SlicesLandInOrderThroughARingThatWraps) {
  Fixture f;
  DeviceStage stage(c10::Device(c10::DeviceType::CPU), 8192, 64, 0);  // two 4 KiB slices
  StagingStream stream(stage, *f.reads);
  std::vector<uint8_t> destination(f.bytes.size(), 0);
  uint64_t sequence = 0;
  for (uint64_t offset = 0; offset < f.bytes.size(); offset += 4096) {
    auto range = plan::align_range(offset, 4096, 1);
    while (!stream.submit(0, range, destination.data() + offset, read_tags::load_into(sequence))) {
      ASSERT_GT(stream.waiting(), 0u);  // refused only while every slice waits for its copy
      f.land(stream);
    }
    ++sequence;
    EXPECT_LE(stream.waiting(), 2u);
  }
  while (stream.waiting() > 0) f.land(stream);
  stream.release_all();
  EXPECT_EQ(std::memcmp(destination.data(), f.bytes.data(), f.bytes.size()), 0);
  EXPECT_TRUE(stage.staging().regions().empty());
}

TEST(StagingStream, ADroppedSliceIsNeverCopiedAndItsSpaceIsFreed) {
  Fixture f;
  DeviceStage stage(c10::Device(c10::DeviceType::CPU), 8192, 64, 0);
  StagingStream stream(stage, *f.reads);
  std::vector<uint8_t> destination(8192, 0);
  ASSERT_TRUE(stream.submit(0, plan::align_range(0, 4096, 1), destination.data(), 1));
  ASSERT_TRUE(stream.submit(0, plan::align_range(4096, 4096, 1), destination.data() + 4096, 2));
  EXPECT_FALSE(stream.submit(0, plan::align_range(0, 4096, 1), destination.data(), 3));
  f.reads->drain();  // an abandoned pass: its reads are waited for, nothing is copied
  stream.forget_waiting();
  EXPECT_EQ(stream.waiting(), 0u);
  EXPECT_TRUE(stream.submit(0, plan::align_range(0, 4096, 1), destination.data(), 4));
  while (!f.reads->done(4)) f.reads->wait_one();
  stream.drop_oldest();
  stream.release_all();
  EXPECT_EQ(destination, std::vector<uint8_t>(8192, 0));
}

TEST(StagingStream, SlicesStayUnderTheLimitTheBackendNeedsAndALargerReadTakesTheRing) {
  Fixture f;
  const uint64_t capacity = 256 << 10;
  DeviceStage stage(c10::Device(c10::DeviceType::CPU), capacity, 64, 0);
  // Slices of 4 KiB: a slot of 16 KiB with the O_DIRECT room; 2 workers, one read queued
  // behind each, and 2 slots under copy = 96 KiB.
  StagingStream stream(stage, *f.reads, 4096);
  const uint64_t limit = 96 << 10;
  EXPECT_EQ(stage.staging().limit(), limit);
  std::vector<uint8_t> destination(f.bytes.size(), 0);
  // A consumer that lands nothing: the ring refuses once 96 KiB are waiting, not at 256 KiB.
  uint64_t offset = 0;
  while (stream.submit(0, plan::align_range(offset, 4096, 1), destination.data() + offset,
                       read_tags::load_into(offset))) {
    offset += 4096;
  }
  EXPECT_EQ(offset, limit);
  EXPECT_EQ(stage.staging().bytes_in_use(), limit);
  EXPECT_EQ(stage.staging().limit(), limit);
  while (stream.waiting() > 0) f.land(stream);
  stream.release_all();
  EXPECT_EQ(std::memcmp(destination.data(), f.bytes.data(), limit), 0);
  // A read larger than the limit, into an empty ring, takes the whole ring.
  std::vector<uint8_t> large(128 << 10, 0);
  ASSERT_TRUE(stream.submit(0, plan::align_range(0, large.size(), 1), large.data(), 1 << 20));
  EXPECT_EQ(stage.staging().limit(), capacity);
  f.land(stream);
  stream.release_all();
  EXPECT_EQ(std::memcmp(large.data(), f.bytes.data(), large.size()), 0);
}

TEST(StagingStream, ASlowReadHoldsOnlyItsOwnSliceNotTheOnesBehindIt) {
  Fixture f;
  DeviceStage stage(c10::Device(c10::DeviceType::CPU), 3 * 4096, 64, 0);  // three slices
  StagingStream stream(stage, *f.reads);
  io::FaultPlan plan;
  plan.hold_read_number = 1;  // the first read call waits at a gate the test opens
  io::arm_faults(plan);
  auto disarm = c10::make_scope_exit([] { io::disarm_faults(); });
  std::vector<uint8_t> destination(4 * 4096, 0);
  auto submit = [&](uint64_t slice) {
    return stream.submit(0, plan::align_range(slice * 4096, 4096, 1),
                         destination.data() + slice * 4096, read_tags::load_into(slice));
  };
  ASSERT_TRUE(submit(0));
  io::wait_for_held_read();  // slice 0's read is the one held
  ASSERT_TRUE(submit(1));
  ASSERT_TRUE(submit(2));
  EXPECT_FALSE(submit(3));  // every slice is taken
  f.reads->wait_one();      // slices 1 and 2, read by the other worker
  f.reads->wait_one();
  ASSERT_TRUE(f.reads->done(read_tags::load_into(1)) && f.reads->done(read_tags::load_into(2)));
  ASSERT_FALSE(f.reads->done(read_tags::load_into(0)));
  // Copied ahead of slice 0, their memory is free at once (a CPU copy has ended when queued):
  // the slow read holds its own slice only. A ring freed oldest first refused here.
  stream.copy_ready();
  ASSERT_TRUE(submit(3));
  // Taking them in order later does not copy them again: bytes changed since stay changed.
  std::memset(destination.data() + 4096, 0xEE, 4096);
  io::release_held_reads();
  for (int slice = 0; slice < 4; ++slice) f.land(stream);
  stream.release_all();
  EXPECT_EQ(std::memcmp(destination.data(), f.bytes.data(), 4096), 0);
  EXPECT_EQ(destination[4096], 0xEE);
  EXPECT_EQ(destination[2 * 4096 - 1], 0xEE);
  EXPECT_EQ(std::memcmp(destination.data() + 2 * 4096, f.bytes.data() + 2 * 4096, 2 * 4096), 0);
  EXPECT_TRUE(stage.staging().regions().empty());
}

TEST(StagingStream, AConsumerFreesRoomFirstOnlyForAnIdleWorkerAndAQueuedCopy) {
  // refused, reads in flight, reads at once, copy queued -> wait for the copy first
  struct Row {
    bool refused;
    size_t in_flight;
    size_t at_once;
    bool copy_queued;
    bool expected;
  };
  const Row rows[] = {
      {true, 1, 2, true, true},     // a worker idle for want of room: free it
      {true, 0, 2, true, true},     // both idle
      {true, 2, 2, true, false},    // every worker busy: the read's copy is the engine's next work
      {true, 3, 2, true, false},    // reads queued behind them too
      {false, 1, 2, true, false},   // nothing was refused: the idle worker has nothing to read
      {true, 1, 2, false, false},   // no copy to wait for (every slice waits for its read)
      {false, 0, 1, false, false},  // nothing at all
      {true, 3, 4, true, true},     // io_uring's depth: one of four idle
  };
  for (const Row& row : rows) {
    EXPECT_EQ(free_room_first(row.refused, row.in_flight, row.at_once, row.copy_queued),
              row.expected)
        << row.refused << " " << row.in_flight << "/" << row.at_once << " " << row.copy_queued;
  }
}

TEST(StagingStream, ARefusalWithEveryPieceWaitingForItsReadFreesNothingFirst) {
  // On the CPU target a copy has finished when it returns, so the stream frees copied slices in
  // submit itself: a refusal finds every slice waiting for its read, never a copy to wait for.
  Fixture f;
  DeviceStage stage(c10::Device(c10::DeviceType::CPU), 8192, 64, 0);
  StagingStream stream(stage, *f.reads);
  std::vector<uint8_t> destination(3 * 4096, 0);
  EXPECT_FALSE(stream.idle_reader_waits_for_room());
  ASSERT_TRUE(stream.submit(0, plan::align_range(0, 4096, 1), destination.data(), 1));
  ASSERT_TRUE(stream.submit(0, plan::align_range(4096, 4096, 1), destination.data() + 4096, 2));
  ASSERT_FALSE(stream.submit(0, plan::align_range(8192, 4096, 1), destination.data() + 8192, 3));
  EXPECT_FALSE(stream.idle_reader_waits_for_room());
  f.land(stream);  // its copy is done: the next submit reuses its slice
  ASSERT_TRUE(stream.submit(0, plan::align_range(8192, 4096, 1), destination.data() + 8192, 3));
  EXPECT_FALSE(stream.idle_reader_waits_for_room());
  while (stream.waiting() > 0) f.land(stream);
  stream.release_all();
  EXPECT_EQ(std::memcmp(destination.data(), f.bytes.data(), destination.size()), 0);
}

}  // namespace
}  // namespace instanttensor::loader
