// The pass kinds and the walks, driven without SafeOpen: composed here from their parts as the
// Loader composes them at open, so each one's contract is tested on its own (placement and
// read-ahead, hand-out, a read failure mid-pass, views made owned, the mapped pass), and the
// walks of ranks over a fake group of threads (helper_thread_group.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "helper_files.h"
#include "helper_thread_group.h"
#include "io/fault_injection.h"
#include "io/file_lease.h"
#include "io/io_setup.h"
#include "loader/access/tensor_memory.h"
#include "loader/exchange/exchange_protocol.h"
#include "loader/pass/leased_views.h"
#include "loader/pass/mapped_pass.h"
#include "loader/pass/read_pass.h"
#include "loader/pass/view_pass.h"
#include "loader/reads/read_scheduler.h"
#include "loader/walk/alone_walk.h"
#include "loader/walk/exchanging_walk.h"
#include "loader/walk/in_step_walk.h"
#include "plan/defaults.h"

namespace instanttensor::loader {
namespace {

using testing::TempDir;

constexpr int kTensors = 6;
constexpr int kElements = 4096;  // 16 KiB each

// t0..t5, float32, t<i>[j] == i * 100000 + j.
std::string write_checkpoint(const TempDir& dir) {
  std::string header = "{", data;
  for (int i = 0; i < kTensors; ++i) {
    size_t begin = data.size();
    for (int j = 0; j < kElements; ++j) {
      float value = static_cast<float>(i * 100000 + j);
      data.append(reinterpret_cast<const char*>(&value), sizeof(value));
    }
    header += (i ? "," : "") + std::string("\"t") + std::to_string(i) +
              "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(kElements) +
              "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(data.size()) +
              "]}";
  }
  header += "}";
  // Padded as safetensors pads it, so the data is aligned and the views are views.
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string path = dir.file("model.safetensors");
  testing::write_bytes(path, testing::safetensors_bytes(header, data));
  return path;
}

bool holds_tensor(const at::Tensor& t, int i) {
  if (t.numel() != kElements || t.scalar_type() != at::kFloat) return false;
  const float* values = t.data_ptr<float>();
  for (int j = 0; j < kElements; ++j) {
    if (values[j] != static_cast<float>(i * 100000 + j)) return false;
  }
  return true;
}

// What the Loader builds at open before its pass: the plan for `in` and `world` ranks, the read
// backend, the workers and the tensors' memory.
struct Parts {
  PassPlan plan;
  Stats stats;
  std::unique_ptr<io::IoSetup> io;
  std::unique_ptr<ReadScheduler> reads;
  std::unique_ptr<TensorMemory> memory;
};

std::unique_ptr<Parts> compose(const std::string& path, plan::LoadModeInputs in,
                               const std::string& backend, uint64_t buffer_size, int threads,
                               int world = 1) {
  auto parts = std::make_unique<Parts>();
  PassPlan& plan = parts->plan;
  plan.checkpoint = std::make_unique<format::Checkpoint>(std::vector<std::string>{path});
  parts->io = std::make_unique<io::IoSetup>(std::vector<std::string>{backend}, *plan.checkpoint);
  plan.io_alignment = parts->io->alignment();
  plan.ring_alignment = std::max<uint64_t>(64, plan.io_alignment);
  in.mapping_backend = parts->io->mapping() != nullptr;
  plan.mode = plan::choose_load_mode(in);
  plan.chunk_size = plan::round_up(plan::defaults::kChunkBytes, plan::kMaxDirectAlignment);
  plan::MemoryInputs memory;
  std::vector<size_t> selected;
  for (size_t i = 0; i < plan.checkpoint->tensors().size(); ++i) {
    selected.push_back(i);
    memory.tensor_bytes.push_back(plan.checkpoint->tensors()[i].nbytes);
  }
  memory.copy = in.copy || plan.mode.host_views;
  memory.world = world;
  memory.buffer_size = buffer_size;
  memory.chunk_size = plan.chunk_size;
  memory.read_widening = plan.mode.in_step ? 2 * plan::kMaxDirectAlignment
                                           : (parts->io->direct() ? 2 * plan.io_alignment : 0);
  memory.ring_alignment = plan.ring_alignment;
  plan.memory = plan::plan_memory(
      memory, [&](size_t) { return std::make_pair(path, std::string()); }, path);
  plan.reads = plan::make_read_plan(*plan.checkpoint, selected, plan.memory.max_group_bytes);
  parts->reads = std::make_unique<ReadScheduler>(*parts->io, threads, plan::defaults::kIoDepth,
                                                 plan.chunk_size, parts->stats);
  parts->memory =
      std::make_unique<TensorMemory>(plan, c10::Device(c10::DeviceType::CPU), parts->stats);
  return parts;
}

std::unique_ptr<ReadPass> read_pass(Parts& parts, bool copy) {
  return std::make_unique<ReadPass>(parts.plan, *parts.reads, *parts.memory,
                                    c10::Device(c10::DeviceType::CPU), copy, /*rank=*/0,
                                    parts.stats);
}

plan::LoadModeInputs host_reads(bool copy) {
  plan::LoadModeInputs in;
  in.copy = copy;
  return in;  // page_cache_views off: the read pass
}

TEST(ReadPass, HandsOutEveryTensorInStorageOrderWithinTheReadAheadBound) {
  TempDir dir;
  auto parts = compose(write_checkpoint(dir), host_reads(true), "pread", 32 << 10, 2);
  auto pass = read_pass(*parts, true);
  AloneWalk walk(*pass);
  for (int round = 0; round < 2; ++round) {
    if (round == 1) walk.restart();  // a second pass, after the end
    for (int i = 0; i < kTensors; ++i) {
      auto next = walk.next();
      ASSERT_TRUE(next);
      EXPECT_EQ(next->first, "t" + std::to_string(i));
      EXPECT_TRUE(holds_tensor(next->second, i));
      EXPECT_EQ(pass->state().groups[parts->plan.reads.group_of[i]].where,
                plan::Destination::HostOwned);
      // Owned destinations allocated ahead of the consumer stay within buffer_size.
      EXPECT_LE(pass->state().ahead_bytes, parts->plan.memory.buffer_size);
    }
    EXPECT_FALSE(walk.next());
  }
  EXPECT_EQ(parts->stats.tensors_loaded, 2u * kTensors);
}

TEST(ReadPass, ABorrowedTensorKeptPastItsRegionIsCopiedOutNotOverwritten) {
  TempDir dir;
  // A ring of three tensors: the first one's region is reused before the pass ends.
  auto parts = compose(write_checkpoint(dir), host_reads(false), "pread", 48 << 10, 2);
  ASSERT_TRUE(parts->plan.mode.ring);
  auto pass = read_pass(*parts, false);
  AloneWalk walk(*pass);
  at::Tensor kept = walk.next()->second;
  while (walk.next()) {
  }
  EXPECT_TRUE(holds_tensor(kept, 0));
  EXPECT_GE(parts->stats.materializations, 1u);
  EXPECT_TRUE(pass->borrows_ring());
  parts->stats.materializations += pass->release_memory();
  EXPECT_TRUE(holds_tensor(kept, 0));
}

TEST(ReadPass, AReadFailureMidPassFailsThePassNamingTheTensorUntilRestarted) {
  TempDir dir;
  std::string path = write_checkpoint(dir);
  // Groups of one tensor each, read on the consumer's thread (no workers): read k is tensor k-1.
  auto parts = compose(path, host_reads(true), "pread", 16 << 10, 0);
  auto pass = read_pass(*parts, true);
  AloneWalk walk(*pass);
  io::FaultPlan faults;
  faults.fail_read_number = 3;
  io::arm_faults(faults);
  std::string first_message;
  int handed_out = 0;
  try {
    while (walk.next()) ++handed_out;
    FAIL() << "the failed read was not reported";
  } catch (const Error& e) {
    first_message = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Io);
  }
  io::disarm_faults();
  EXPECT_EQ(handed_out, 2);  // t0 and t1; the third read was t2's
  EXPECT_NE(first_message.find(path), std::string::npos) << first_message;
  EXPECT_NE(first_message.find("'t2'"), std::string::npos) << first_message;
  // The pass stays failed: the next step says why again, reading nothing.
  try {
    walk.next();
    FAIL() << "a failed pass went on";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), first_message);
  }
  walk.restart();
  for (int i = 0; i < kTensors; ++i) EXPECT_TRUE(holds_tensor(walk.next()->second, i));
  EXPECT_FALSE(walk.next());
}

// The index a pass keeps of its leased views: ordered by first byte whatever the order they
// were kept in; a range meets views that reach into it through a shared page (found by stepping
// back), and a view that died is never reported again.
TEST(LeasedViews, FindsTheViewsMeetingARangeAndForgetsTheDeadOnes) {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  testing::write_bytes(path, std::string(6 * 4096, 'x'));
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto lease = io::FileLease::take(fd);
  if (!lease) {
    ::close(fd);
    if (testing::leases_required()) FAIL() << "no lease on " << path << " where one is required";
    GTEST_SKIP() << "this filesystem or process gets no lease on " << path;
  }
  auto* map =
      static_cast<uint8_t*>(::mmap(nullptr, 6 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0));
  ::close(fd);
  ASSERT_NE(map, MAP_FAILED);
  auto a = lease->protect(map, 100, 4900);    // pages [0, 8192)
  auto b = lease->protect(map, 5000, 4000);   // pages [4096, 12288): shares page 1 with a
  auto c = lease->protect(map, 20000, 1000);  // pages [16384, 24576)
  ASSERT_TRUE(a && b && c);
  LeasedViews views(2);
  views.add(0, 5000, 4000, b);
  views.add(0, 20000, 1000, c);
  views.add(0, 100, 4900, a);
  using Pages = std::vector<std::pair<uint64_t, uint64_t>>;
  auto pages_kept = [&](uint64_t begin, uint64_t end) {
    Pages kept;
    views.each_kept_page_range(0, begin, end,
                               [&](uint64_t b, uint64_t e) { kept.emplace_back(b, e); });
    return kept;
  };
  EXPECT_EQ(pages_kept(6000, 6001), (Pages{{0, 8192}, {4096, 12288}}));
  EXPECT_EQ(pages_kept(8192, 16384), (Pages{{4096, 12288}}));
  EXPECT_EQ(pages_kept(0, 4096), (Pages{{0, 8192}}));
  EXPECT_EQ(pages_kept(12288, 1 << 20), (Pages{{16384, 24576}}));
  EXPECT_TRUE(views.shows_bytes(0, 4990, 20));
  EXPECT_FALSE(views.shows_bytes(0, 9000, 11000));  // between b's last byte and c's first
  EXPECT_TRUE(views.shows_bytes(0, 20999, 1));
  EXPECT_FALSE(views.shows_bytes(1, 0, 1 << 20));  // another file
  b.reset();
  EXPECT_EQ(pages_kept(0, 1 << 20), (Pages{{0, 8192}, {16384, 24576}}));
  EXPECT_FALSE(views.shows_bytes(0, 5000, 4000));
  EXPECT_TRUE(views.forget_ended());
  a.reset();
  c.reset();
  EXPECT_FALSE(views.forget_ended());
  EXPECT_TRUE(pages_kept(0, 1 << 20).empty());
  lease.reset();
  ::munmap(map, 6 * 4096);
}

// A view kept past its step, where the kernel refuses a lease on its file (played here by the
// testing switch): copied into owned memory; one dropped costs nothing.
TEST(ViewPass, AViewKeptPastItsStepIsMadeOwnedAndOneDroppedCostsNothing) {
  TempDir dir;
  struct NoLease {  // set while the pass asks for leases (at a keep), whatever fails
    NoLease() { ::setenv("INSTANTTENSOR_TESTING_NO_LEASE", "1", 1); }
    ~NoLease() { ::unsetenv("INSTANTTENSOR_TESTING_NO_LEASE"); }
  } no_lease;
  plan::LoadModeInputs in = host_reads(true);
  in.page_cache_views = true;
  auto parts = compose(write_checkpoint(dir), in, "pread", 32 << 10, 0);
  ASSERT_TRUE(parts->plan.mode.host_views);
  ViewPass pass(parts->plan, map_for_views(*parts->plan.checkpoint), parts->memory->factory(),
                parts->stats, parts->plan.memory.buffer_size, io::ReadAheadPolicy{},
                CacheUse::Keep);
  AloneWalk walk(pass);
  at::Tensor kept = walk.next()->second;  // t0, kept
  const void* view = kept.data_ptr();
  EXPECT_TRUE(holds_tensor(walk.next()->second, 1));  // t1, dropped at once
  EXPECT_TRUE(holds_tensor(walk.next()->second, 2));  // t0 checked here: still held
  EXPECT_EQ(parts->stats.materializations, 1u);
  EXPECT_EQ(parts->stats.leased_views, 0u);
  EXPECT_NE(kept.data_ptr(), view);  // repointed into owned memory
  EXPECT_TRUE(holds_tensor(kept, 0));
  while (walk.next()) {
  }
  EXPECT_EQ(parts->stats.materializations, 1u);
  EXPECT_EQ(parts->stats.read_requests, 0u);  // nothing went through the read backend
  pass.release_memory();
  EXPECT_TRUE(holds_tensor(kept, 0));
}

// Under a lease the kept view stays where it is, copied by nobody, until a writer opens the
// file: then its pages become private copies at the same address before the writer goes on.
TEST(ViewPass, AViewKeptPastItsStepStaysAViewUnderALeaseUntilAWriterComes) {
  TempDir dir;
  plan::LoadModeInputs in = host_reads(true);
  in.page_cache_views = true;
  auto parts = compose(write_checkpoint(dir), in, "pread", 32 << 10, 0);
  ASSERT_TRUE(parts->plan.mode.host_views);
  const std::string path = parts->plan.checkpoint->files().front().path;
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    const bool leases = io::FileLease::take(fd) != nullptr;
    ::close(fd);
    if (!leases && testing::leases_required())
      FAIL() << "no lease on " << path << " where one is required";
    if (!leases) GTEST_SKIP() << "this filesystem or process gets no lease on " << path;
  }
  // Its tensors are small: leased all the same (by default they would be copied out).
  ::setenv("INSTANTTENSOR_TESTING_LEASE_MIN_BYTES", "0", 1);
  ViewPass pass(parts->plan, map_for_views(*parts->plan.checkpoint), parts->memory->factory(),
                parts->stats, parts->plan.memory.buffer_size, io::ReadAheadPolicy{},
                CacheUse::Keep);
  ::unsetenv("INSTANTTENSOR_TESTING_LEASE_MIN_BYTES");
  AloneWalk walk(pass);
  at::Tensor kept = walk.next()->second;  // t0, kept
  const void* view = kept.data_ptr();
  EXPECT_TRUE(holds_tensor(walk.next()->second, 1));
  EXPECT_TRUE(holds_tensor(walk.next()->second, 2));  // t0 checked here: leased
  EXPECT_EQ(parts->stats.leased_views, 1u);
  EXPECT_EQ(parts->stats.materializations, 0u);
  EXPECT_EQ(kept.data_ptr(), view);
  while (walk.next()) {
  }
  pass.release_memory();
  // The writer's open waits for the copies; then every byte of the file is overwritten.
  const int writer = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(writer, 0);
  const std::string junk(4096, '\x5a');
  for (off_t at = 0; at < 1 << 20; at += 4096) {
    ASSERT_EQ(::pwrite(writer, junk.data(), junk.size(), at), 4096);
  }
  ASSERT_EQ(::ftruncate(writer, 0), 0);
  ::close(writer);
  EXPECT_EQ(kept.data_ptr(), view);
  EXPECT_TRUE(holds_tensor(kept, 0));  // no SIGBUS, no new bytes
}

TEST(MappedPass, HandsOutViewsOfTheMappingReadingNothing) {
  TempDir dir;
  auto parts = compose(write_checkpoint(dir), host_reads(false), "mmap", 0, 0);
  ASSERT_TRUE(parts->plan.mode.mapped_iteration);
  MappedPass pass(parts->plan, *parts->io, parts->memory->factory(), parts->stats);
  AloneWalk walk(pass);
  std::vector<at::Tensor> all;
  while (auto next = walk.next()) all.push_back(next->second);
  ASSERT_EQ(all.size(), static_cast<size_t>(kTensors));
  for (int i = 0; i < kTensors; ++i) EXPECT_TRUE(holds_tensor(all[i], i));
  EXPECT_EQ(parts->stats.read_requests, 0u);
  EXPECT_EQ(parts->stats.materializations, 0u);
}

// A pass that records the steps a walk takes, and fails where told.
class RecordingPass : public Pass {
 public:
  explicit RecordingPass(const PassPlan& plan) : Pass(plan) {}
  std::optional<size_t> fail_at;
  bool out_of_memory = false;  // fail_at fails as a device allocation would
  std::vector<std::string> steps;

  void prepare(size_t item) override {
    steps.push_back("prepare " + std::to_string(item));
    if (fail_at == item) fail(Error(ErrorKind::Io, plan_.first_path(), "", "injected"));
  }
  std::optional<Error> settle(size_t item) override {
    steps.push_back("settle " + std::to_string(item));
    if (fail_at == item && out_of_memory) {
      c10::OutOfMemoryError e({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                              "injected: tried to allocate 2.00 GiB");
      return failure_of(e, item);
    }
    if (fail_at == item) return Error(ErrorKind::Io, plan_.first_path(), "", "injected");
    return std::nullopt;
  }
  std::pair<std::string, at::Tensor> hand_out(size_t item) override {
    steps.push_back("hand_out " + std::to_string(item));
    state_.next_item = item + 1;
    return {plan_.tensor_of_item(item).name(), at::full({1}, static_cast<int64_t>(item))};
  }
  void end() override { steps.push_back("end"); }

 protected:
  void on_begin() override { steps.push_back("begin"); }
};

TEST(AloneWalk, BeginsPreparesHandsOutInOrderAndEnds) {
  TempDir dir;
  auto parts = compose(write_checkpoint(dir), host_reads(true), "pread", 0, 0);
  RecordingPass pass(parts->plan);
  AloneWalk walk(pass);
  while (walk.next()) {
  }
  std::vector<std::string> expected{"begin"};
  for (int i = 0; i < kTensors; ++i) {
    expected.push_back("prepare " + std::to_string(i));
    expected.push_back("hand_out " + std::to_string(i));
  }
  expected.push_back("end");
  EXPECT_EQ(pass.steps, expected);
  EXPECT_FALSE(walk.works_in_child() == false);
}

TEST(AloneWalk, AFailedStepStaysThePassError) {
  TempDir dir;
  auto parts = compose(write_checkpoint(dir), host_reads(true), "pread", 0, 0);
  RecordingPass pass(parts->plan);
  pass.fail_at = 2;
  AloneWalk walk(pass);
  walk.next();
  walk.next();
  EXPECT_THROW(walk.next(), Error);
  EXPECT_THROW(walk.next(), Error);
  EXPECT_EQ(pass.steps.back(), "prepare 2");  // not prepared again
}

// Runs `body(rank, group)` on `world` threads over one fake group; rethrows nothing: each
// body records its own outcome.
void on_ranks(int world,
              const std::function<void(int, c10::intrusive_ptr<c10d::ProcessGroup>)>& body) {
  auto groups = testing::thread_group(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) threads.emplace_back(body, rank, groups[rank]);
  for (auto& thread : threads) thread.join();
}

const c10::Device kCpu(c10::DeviceType::CPU);

TEST(ExchangeProtocol, TheHandshakeAgreesOnTheSmallestBudgetAndWhoSharesAHost) {
  std::vector<uint64_t> budgets(2);
  std::vector<HostTopology> topologies(2);
  on_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    ExchangeProtocol protocol(group, kCpu, /*digest=*/42, /*host_identity=*/7,
                              /*device_budget=*/rank == 0 ? 1000 : 600, "f");
    budgets[rank] = protocol.agreed_device_budget();
    topologies[rank] = protocol.topology();
  });
  EXPECT_EQ(budgets, (std::vector<uint64_t>{600, 600}));
  EXPECT_EQ(topologies[0].hosts, 1);
  EXPECT_EQ(topologies[1].local_ranks, 2);
}

TEST(ExchangeProtocol, DifferentCheckpointsAreRefusedOnEveryRank) {
  std::vector<std::string> errors(2);
  on_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    try {
      ExchangeProtocol protocol(group, kCpu, /*digest=*/rank == 0 ? 1 : 2, 7, UINT64_MAX, "f");
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  for (const auto& error : errors) EXPECT_NE(error.find("rank"), std::string::npos) << error;
}

TEST(ExchangeProtocol, AStatusRoundRaisesOneRanksFailureOnEveryRank) {
  std::vector<std::string> errors(2);
  on_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    ExchangeProtocol protocol(group, kCpu, 1, 7, UINT64_MAX, "f");
    Stats stats;
    protocol.status_round(std::nullopt, "f", stats);  // nobody failed: nothing raised
    std::optional<Error> failure;
    if (rank == 1) failure = Error(ErrorKind::Io, "f", "t3", "injected read error");
    try {
      protocol.status_round(failure, "f", stats);
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_NE(errors[0].find("rank 1 failed"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("'t3'"), std::string::npos) << errors[1];  // its own, as raised
  for (const auto& error : errors) {
    EXPECT_NE(error.find("injected read error"), std::string::npos) << error;
  }
}

TEST(ExchangeProtocol, RoundsPostedAheadSettleInOrderAndAFailureLeavesNoneBehind) {
  // The exchanging walk's order: round u+1 posted before round u settles. Rank 1 fails in the
  // second round; both ranks raise when they settle it (not the first), with the third posted,
  // and a later round on the same group goes through (nothing was left pending).
  std::vector<std::string> errors(2);
  std::vector<int> settled(2, 0);
  std::vector<bool> later_round(2, false);
  on_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    ExchangeProtocol protocol(group, kCpu, 1, 7, UINT64_MAX, "f");
    Stats stats;
    std::optional<Error> failure;
    if (rank == 1) failure = Error(ErrorKind::Io, "f", "t5", "injected read error");
    try {
      protocol.post_status(std::nullopt, stats);
      protocol.post_status(failure, stats);
      protocol.settle_status("f", stats);
      ++settled[rank];
      protocol.post_status(failure, stats);
      protocol.settle_status("f", stats);
      ++settled[rank];
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
    EXPECT_TRUE(protocol.oldest_status_arrived());  // none left posted
    try {
      protocol.status_round(std::nullopt, "f", stats);
      later_round[rank] = true;
    } catch (const Error& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  });
  EXPECT_EQ(settled, (std::vector<int>{1, 1}));
  EXPECT_NE(errors[0].find("rank 1 failed"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("'t5'"), std::string::npos) << errors[1];
  EXPECT_EQ(later_round, (std::vector<bool>{true, true}));
}

TEST(InStepWalk, AFailureOnOneRankRaisesOnEveryRankAtTheSameStep) {
  TempDir dir;
  std::string path = write_checkpoint(dir);
  std::vector<int> handed_out(2, 0);
  std::vector<std::string> errors(2);
  on_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    auto parts = compose(path, host_reads(true), "pread", 0, 0);
    RecordingPass pass(parts->plan);
    if (rank == 1) pass.fail_at = 3;
    auto protocol = std::make_unique<ExchangeProtocol>(group, kCpu, 1, 7, UINT64_MAX, path);
    // Rounds only at the end: rank 1's failure makes its round early, and rank 0 meets it
    // there at its next round, the end.
    std::vector<uint64_t> item_bytes(kTensors, kElements * 4);
    InStepWalk walk(pass, std::move(protocol), StepRounds(item_bytes), parts->stats);
    EXPECT_FALSE(walk.works_in_child());
    try {
      while (walk.next()) ++handed_out[rank];
    } catch (const Error& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_EQ(handed_out[1], 3);
  EXPECT_EQ(handed_out[0], kTensors);  // alone between rounds: it meets the failure at the end
  for (const auto& error : errors) EXPECT_NE(error.find("injected"), std::string::npos) << error;
}

TEST(InStepWalk, ADeviceOutOfMemoryErrorKeepsItsKindOnEveryRank) {
  TempDir dir;
  std::string path = write_checkpoint(dir);
  std::vector<std::optional<ErrorKind>> kinds(2);
  std::vector<std::string> messages(2);
  on_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    auto parts = compose(path, host_reads(true), "pread", 0, 0);
    RecordingPass pass(parts->plan);
    if (rank == 0) pass.fail_at = 1;  // rank 1 fails only through rank 0's round
    pass.out_of_memory = true;
    auto protocol = std::make_unique<ExchangeProtocol>(group, kCpu, 1, 7, UINT64_MAX, path);
    std::vector<uint64_t> item_bytes(kTensors, kElements * 4);
    InStepWalk walk(pass, std::move(protocol), StepRounds(item_bytes), parts->stats);
    try {
      while (walk.next()) {
      }
    } catch (const Error& e) {
      kinds[rank] = e.kind();
      messages[rank] = e.what();
    }
  });
  EXPECT_EQ(kinds[0], ErrorKind::OutOfMemory);
  EXPECT_EQ(kinds[1], ErrorKind::OutOfMemory);  // rank 0's, carried by the round
  EXPECT_NE(messages[0].find("out of device memory"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("rank 0 failed"), std::string::npos) << messages[1];
  EXPECT_NE(messages[1].find("out of device memory"), std::string::npos) << messages[1];
}

TEST(ExchangingWalk, EachRankReadsItsSharesAndEveryRankGetsEveryTensor) {
  TempDir dir;
  std::string path = write_checkpoint(dir);
  std::vector<int> right(2, 0);
  std::vector<uint64_t> received(2, 0), read(2, 0);
  on_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::ProcessGroup> group) {
    plan::LoadModeInputs in = host_reads(true);
    in.distributed = in.group_serves_target = true;
    in.exchange_policy = plan::ExchangePolicy::Always;
    auto parts = compose(path, in, "pread", 0, 2, /*world=*/2);
    ASSERT_TRUE(parts->plan.mode.exchanging());
    auto protocol = std::make_unique<ExchangeProtocol>(group, kCpu, 1, 7, UINT64_MAX, path);
    protocol->prepare_gathers(parts->plan.mode.exchange);
    ReadPass pass(parts->plan, *parts->reads, *parts->memory, kCpu, /*copy=*/true, protocol->rank(),
                  parts->stats);
    ExchangingWalk walk(pass, std::move(protocol), parts->stats);
    int i = 0;
    while (auto next = walk.next()) right[rank] += holds_tensor(next->second, i++);
    walk.close();
    received[rank] = parts->stats.bytes_received;
    read[rank] = parts->stats.bytes_read;
    pass.drain();
    pass.release_memory();
  });
  EXPECT_EQ(right, (std::vector<int>{kTensors, kTensors}));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_GT(received[rank], 0u);
    EXPECT_LT(read[rank], static_cast<uint64_t>(kTensors) * kElements * 4);  // a share, not all
  }
}

}  // namespace
}  // namespace instanttensor::loader
