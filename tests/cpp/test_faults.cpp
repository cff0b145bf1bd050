// Injected I/O faults on every loader path: a clear exception, nothing leaked, and the process
// still loads the next checkpoint. Runs once per backend (see CMakeLists.txt).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <instanttensor/instanttensor.h>
#include <unistd.h>

#include <cerrno>
#include <functional>

#include "helper_files.h"
#include "helper_models.h"
#include "io/fault_injection.h"

namespace instanttensor {
namespace {

using testing::TempDir;

using testing::Model;

Model write_model(const TempDir& dir) {
  std::map<std::string, at::Tensor> a, b;
  for (int i = 0; i < 12; ++i) {
    (i % 2 ? a : b)["w" + std::to_string(i)] = at::randn({64 + i, 33});
  }
  return testing::save_shards(dir, {{"a.safetensors", a}, {"b.safetensors", b}});
}

class Faults : public ::testing::Test {
 protected:
  void TearDown() override { io::disarm_faults(); }
};

// io_uring's kernel workers (iou-wrk) come and go on their own schedule: wait until the count
// is at most `expected`, for up to 2 s.
void settle_threads(int expected) {
  // io_uring workers leave on their own time: poll for up to 30 s on a busy machine.
  for (int i = 0; i < 3000 && testing::thread_count() > expected; ++i) ::usleep(10000);
}

// The thread count once lingering kernel workers have left (stable for 100 ms). The lease
// watcher (io/file_lease.h) is one thread per process from the first lease on, by design: a
// host pass first makes it part of the count.
int quiet_thread_count(const Model& model) {
  for (auto& item : SafeOpen(model.files)) (void)item;  // a host pass takes leases
  int last = testing::thread_count();
  for (int stable = 0, i = 0; stable < 10 && i < 300; ++i) {
    ::usleep(10000);
    int now = testing::thread_count();
    stable = now == last ? stable + 1 : 0;
    last = now;
  }
  return last;
}

void expect_all_correct(const Model& model, OpenOptions options) {
  SafeOpen f(model.files, options);
  size_t seen = 0;
  for (auto& [name, tensor] : f) {
    EXPECT_TRUE(at::equal(tensor, model.tensors.at(name))) << name;
    ++seen;
  }
  EXPECT_EQ(seen, model.tensors.size());
  for (auto& [name, tensor] : model.tensors) EXPECT_TRUE(at::equal(f.get_tensor(name), tensor));
}

TEST_F(Faults, FailedReadIsAClearErrorOnEveryPathAndLeaksNothing) {
  TempDir dir;
  auto model = write_model(dir);
  int fds = testing::open_fd_count();
  int threads = quiet_thread_count(model);
  // Staged: host staging ring -> device stage (forced on the CPU), the accelerator's data path.
  for (auto [copy, staged] :
       {std::pair{true, false}, {false, false}, {true, true}, {false, true}}) {
    for (int nth : {1, 3, 7}) {
      SCOPED_TRACE(std::string(copy ? "copy" : "borrow") + (staged ? " staged" : "") + " read " +
                   std::to_string(nth));
      OpenOptions options;
      options.copy = copy;
      options.force_staging = staged;
      options.chunk_size = 4096;  // many reads, so the Nth lands mid-iteration
      io::FaultPlan plan;
      plan.fail_read_number = nth;
      {
        io::arm_faults(plan);
        SafeOpen f(model.files, options);
        // Nothing is read through the backend: views of the mapping, or of the page cache.
        const bool mapped_views = testing::read_backend(f.stats().backend) == "mmap" && !staged;
        const bool page_cache_views = testing::iterates_views(f.stats().backend);
        try {
          for (auto& item : f) (void)item;
          if (!(mapped_views && !copy) && !page_cache_views) {
            ADD_FAILURE() << "an injected EIO went unnoticed";
          }
        } catch (const Error& e) {
          std::string message = e.what();
          EXPECT_EQ(e.kind(), ErrorKind::Io) << message;
          EXPECT_NE(message.find(".safetensors"), std::string::npos) << message;
          EXPECT_NE(message.find("tensor 'w"), std::string::npos) << message;
          EXPECT_NE(message.find("Input/output error"), std::string::npos) << message;
        }
      }
      {
        // Random access on a fresh checkpoint fails with the injected error itself (not with
        // the stored failure of a pass).
        SafeOpen f(model.files, options);
        const bool mapped_views = testing::read_backend(f.stats().backend) == "mmap" && !staged;
        io::FaultPlan first;
        first.fail_read_number = 1;
        io::arm_faults(first);
        try {
          f.get_tensor("w4");
          if (!mapped_views) ADD_FAILURE() << "an injected EIO went unnoticed by get_tensor";
        } catch (const Error& e) {
          std::string message = e.what();
          EXPECT_NE(message.find("tensor 'w4'"), std::string::npos) << message;
          EXPECT_NE(message.find("Input/output error"), std::string::npos) << message;
        }
      }
      io::disarm_faults();
      expect_all_correct(model, options);  // the process loads the next checkpoint fine
    }
  }
  EXPECT_EQ(testing::open_fd_count(), fds);
  settle_threads(threads);
  EXPECT_LE(testing::thread_count(), threads);
}

TEST_F(Faults, ShortReadsEintrAndEagainAreRetriedTransparently) {
  TempDir dir;
  auto model = write_model(dir);
  io::FaultPlan plan;
  plan.short_reads = true;
  plan.eintr_every = 3;
  plan.eagain_every = 5;
  io::arm_faults(plan);
  for (bool copy : {true, false}) {
    for (bool staged : {false, true}) {
      OpenOptions options;
      options.copy = copy;
      options.buffer_size = 64 << 10;
      options.force_staging = staged;
      expect_all_correct(model, options);
    }
  }
}

TEST_F(Faults, SlowReadsNeitherHangNorReorder) {
  TempDir dir;
  auto model = write_model(dir);
  io::FaultPlan plan;
  plan.delay_ms = 3;
  io::arm_faults(plan);
  OpenOptions options;
  options.copy = false;
  options.buffer_size = 32 << 10;
  expect_all_correct(model, options);
}

TEST_F(Faults, IoUringSetupFailureFallsBackToThePreadPool) {
  TempDir dir;
  auto model = write_model(dir);
  OpenOptions options;
  options.backend = "uring";
  {
    // Only meaningful where io_uring really runs: otherwise the fallback below would happen
    // with or without the injected failure.
    SafeOpen probe(model.files, options);
    for (auto& item : probe) (void)item;
    std::string in_use = probe.stats().backend;
    if (in_use.rfind("io_uring", 0) != 0) GTEST_SKIP() << "io_uring is not in use here: " << in_use;
  }
  io::FaultPlan plan;
  plan.fail_uring_setup = true;
  io::arm_faults(plan);
  SafeOpen f(model.files, options);
  for (auto& [name, tensor] : f) EXPECT_TRUE(at::equal(tensor, model.tensors.at(name)));
  std::string backend = f.stats().backend;
  EXPECT_EQ(backend.rfind("pread", 0), 0u) << backend;
  EXPECT_NE(backend.find("io_uring fallback"), std::string::npos) << backend;
  EXPECT_NE(backend.find("Operation not permitted"), std::string::npos) << backend;
}

// A submit the kernel refuses used to leave the consumer waiting for a completion of a read that
// never reached the kernel. Now every refusal is an Error naming the cause, reads already in the
// kernel are reaped before it is raised (failing after some submits worked: the sanitizer build
// would see a late read land in freed memory), and the loader closes and opens again.
TEST_F(Faults, IoUringSubmitFailureIsAnErrorNotAHang) {
  TempDir dir;
  auto model = write_model(dir);
  OpenOptions options;
  options.backend = "uring";
  options.concurrency = 2;
  {
    SafeOpen probe(model.files, options);
    for (auto& item : probe) (void)item;
    std::string in_use = probe.stats().backend;
    if (in_use.rfind("io_uring", 0) != 0) GTEST_SKIP() << "io_uring is not in use here: " << in_use;
  }
  for (auto [error, after] : {std::pair{EIO, 0}, {ENOMEM, 0}, {EAGAIN, 0}, {EIO, 1}, {EIO, 3}}) {
    io::FaultPlan plan;
    plan.fail_uring_submit = error;
    plan.fail_uring_submit_after = after;
    io::arm_faults(plan);
    for (bool copy : {true, false}) {
      options.copy = copy;
      SafeOpen f(model.files, options);
      try {
        for (auto& item : f) (void)item;
        ADD_FAILURE() << "no error with submits failing (" << error << " after " << after << ")";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("io_uring submit failed"), std::string::npos)
            << e.what();
      }
      f.close();
    }
    io::disarm_faults();
    SafeOpen again(model.files, options);
    for (auto& [name, tensor] : again) EXPECT_TRUE(at::equal(tensor, model.tensors.at(name)));
  }
}

// A submit refused after some pieces of one tensor reached the kernel: random access and
// load_into (into the caller's memory, and through the staging ring) used to unwind with those
// pieces still counted or in flight: a wait in a cleanup that threw again (the process
// terminated in load_into's drain), or a buffer freed under a read. Now each is an Error, the
// queued pieces are waited for first, and the same loader still closes and a new one loads.
TEST_F(Faults, IoUringSubmitFailureMidTensorIsAnErrorOnRandomAccessAndLoadInto) {
  TempDir dir;
  auto model = write_model(dir);
  OpenOptions options;
  options.backend = "uring";
  options.chunk_size = 4096;  // every tensor (8.4-10 KB) is read in three pieces or more
  {
    SafeOpen probe(model.files, options);
    (void)probe.get_tensor("w11");
    std::string in_use = probe.stats().backend;
    if (in_use.rfind("io_uring", 0) != 0) GTEST_SKIP() << "io_uring is not in use here: " << in_use;
  }
  auto expect_submit_error = [](const char* what, const std::function<void()>& call) {
    try {
      call();
      ADD_FAILURE() << what << ": no error with the second submit refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("io_uring submit failed"), std::string::npos)
          << what << ": " << e.what();
    }
  };
  for (bool staged : {false, true}) {
    io::FaultPlan plan;
    plan.fail_uring_submit = EIO;
    plan.fail_uring_submit_after = 1;
    io::arm_faults(plan);
    options.force_staging = staged;
    SafeOpen random(model.files, options);
    expect_submit_error("get_tensor", [&] { (void)random.get_tensor("w11"); });
    random.close();
    io::arm_faults(plan);  // the count starts again
    SafeOpen into(model.files, options);
    std::map<std::string, at::Tensor> destinations;
    for (const char* name : {"w10", "w11"}) {
      destinations[name] = at::empty_like(model.tensors.at(name));
    }
    expect_submit_error(staged ? "load_into staged" : "load_into",
                        [&] { (void)into.load_into(destinations, /*strict=*/false); });
    into.close();
    io::disarm_faults();
    SafeOpen again(model.files, options);
    EXPECT_TRUE(at::equal(again.get_tensor("w11"), model.tensors.at("w11")));
    again.load_into(destinations, /*strict=*/false);
    for (auto& [name, tensor] : destinations)
      EXPECT_TRUE(at::equal(tensor, model.tensors.at(name)));
  }
}

TEST_F(Faults, ThousandsOfLoadersGrowNothing) {
  TempDir dir;
  auto model = write_model(dir);
  auto rss_kb = [] {
    std::string status = testing::read_bytes("/proc/self/status");
    auto at = status.find("VmRSS:");
    return std::stol(status.substr(at + 6));
  };
  for (int i = 0; i < 50; ++i) SafeOpen(model.files).next();  // warm allocator caches
  int fds = testing::open_fd_count();
  int threads = quiet_thread_count(model);
  long rss = rss_kb();
  for (int i = 0; i < 2000; ++i) {
    OpenOptions options;
    options.copy = i % 2 == 0;
    SafeOpen f(model.files, options);
    auto first = f.next();  // start reading, then abandon half way
    ASSERT_TRUE(first.has_value());
  }
  settle_threads(threads);
  EXPECT_EQ(testing::open_fd_count(), fds);
  EXPECT_LE(testing::thread_count(), threads);
  EXPECT_LT(rss_kb() - rss, 32 * 1024) << "RSS grew by more than 32 MiB over 2000 loaders";
}

}  // namespace
}  // namespace instanttensor
