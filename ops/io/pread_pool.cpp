#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "instanttensor/error.h"
#include "io/fault_injection.h"
#include "io/read_backend.h"
#include "io/thread_name.h"

namespace instanttensor::io {

namespace {

ReadCompletion perform_read(const ReadRequest& request) {
  auto start = std::chrono::steady_clock::now();
  ReadCompletion done;
  done.tag = request.tag;
  done.file = request.file;
  char* dest = static_cast<char*>(request.dest);
  while (done.bytes < request.length) {
    // Linux caps one read at about 2 GiB; larger requests loop.
    uint64_t want = std::min<uint64_t>(request.length - done.bytes, 1u << 30);
    ssize_t got;
    if (int fault = injected_fault(&want)) {
      errno = fault;
      got = -1;
    } else {
      got = ::pread(request.fd, dest + done.bytes, static_cast<size_t>(want),
                    static_cast<off_t>(request.offset + done.bytes));
    }
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      done.error = errno;
      break;
    }
    if (got == 0) {
      done.truncated = done.bytes < required_bytes(request);
      break;
    }
    done.bytes += static_cast<uint64_t>(got);
  }
  done.finished = std::chrono::steady_clock::now();
  done.seconds = std::chrono::duration<double>(done.finished - start).count();
  return done;
}

class WorkerPool final : public ReadBackend {
 public:
  WorkerPool(int threads, std::function<ReadCompletion(const ReadRequest&)> perform,
             uint32_t idle_spin_us)
      : perform_(std::move(perform)), idle_spin_(std::chrono::microseconds(idle_spin_us)) {
    workers_.reserve(threads);
    try {
      for (int i = 0; i < threads; ++i) {
        workers_.emplace_back([this] { work(); });
        name_thread(workers_.back(), "it-read");
      }
    } catch (const std::system_error& e) {
      stop_and_join();  // a joinable std::thread left behind would terminate the process
      throw Error(ErrorKind::Io, "", "", std::string("cannot start read workers: ") + e.what());
    }
  }

  ~WorkerPool() override { stop_and_join(); }

  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_.store(true);
    }
    queued_cv_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  void submit(const ReadRequest& request) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queued_.push_back(request);
      ++in_flight_;
      queued_count_.fetch_add(1, std::memory_order_release);
    }
    queued_cv_.notify_one();
  }

  ReadCompletion wait_completion() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return !done_.empty(); });
    ReadCompletion completion = done_.front();
    done_.pop_front();
    --in_flight_;
    return completion;
  }

  uint64_t idle_spells_spun() const override { return spun_spells_.load(); }

  size_t in_flight() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_flight_;
  }

 private:
  // Keeps the core until a request is queued, the pool stops or idle_spin_ has passed, giving
  // it to any other runnable thread meanwhile: a worker that sleeps at once is woken for the
  // consumer's next slice some 0.1-1 ms later on this project's VMs (an idle virtual CPU's
  // wake-up), where the slice itself takes 0.15-0.3 ms (2 MiB, warm).
  void spin_while_idle() const {
    const auto until = std::chrono::steady_clock::now() + idle_spin_;
    while (queued_count_.load(std::memory_order_acquire) == 0 && !stopping_.load() &&
           std::chrono::steady_clock::now() < until) {
      ::sched_yield();
    }
  }

  void work() {
    // Spins only while its idle spells are short: one that outlasted the spin (the consumer
    // waits on the copy engine, a copy-bound pass) is slept through next time, so a worker
    // idling for milliseconds at a time does not burn 300 us of CPU for each of them (copy-bound
    // warm: the workers' CPU 285-297 ms against 124-165 read-bound on 0.98 GB, 2026-12-07).
    bool spin = idle_spin_.count() > 0;
    for (;;) {
      ReadRequest request;
      const auto idle_since = std::chrono::steady_clock::now();
      if (spin) {
        spun_spells_.fetch_add(1, std::memory_order_relaxed);
        spin_while_idle();
      }
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queued_cv_.wait(lock, [this] { return stopping_ || !queued_.empty(); });
        // Drain the queue even when stopping: the owner's buffers outlive this destructor.
        if (queued_.empty()) return;
        request = queued_.front();
        queued_.pop_front();
        queued_count_.fetch_sub(1, std::memory_order_relaxed);
      }
      spin = idle_spin_.count() > 0 && std::chrono::steady_clock::now() - idle_since < idle_spin_;
      ReadCompletion completion = perform_(request);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.push_back(completion);
      }
      done_cv_.notify_one();
    }
  }

  std::function<ReadCompletion(const ReadRequest&)> perform_;
  const std::chrono::microseconds idle_spin_;
  // Read without the lock by spinning workers: requests queued, and the pool stopping (written
  // under mutex_, so a sleeping worker's wait cannot miss it).
  std::atomic<size_t> queued_count_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> spun_spells_{0};
  mutable std::mutex mutex_;
  std::condition_variable queued_cv_;
  std::condition_variable done_cv_;
  std::deque<ReadRequest> queued_;
  std::deque<ReadCompletion> done_;
  size_t in_flight_ = 0;
  std::vector<std::thread> workers_;
};

// Reads on the caller's thread, inside submit(): no threads to start and join, no wake-ups,
// for checkpoints so small that those would cost more than the reads.
class InlineReader final : public ReadBackend {
 public:
  explicit InlineReader(std::function<ReadCompletion(const ReadRequest&)> perform)
      : perform_(std::move(perform)) {}
  void submit(const ReadRequest& request) override { done_.push_back(perform_(request)); }
  ReadCompletion wait_completion() override {
    if (done_.empty()) {  // a broken caller contract: reported, never a pop of an empty queue
      throw Error(ErrorKind::Internal, "", "", "waiting on the inline reader with no read");
    }
    ReadCompletion completion = done_.front();
    done_.pop_front();
    return completion;
  }
  size_t in_flight() const override { return done_.size(); }

 private:
  std::function<ReadCompletion(const ReadRequest&)> perform_;
  std::deque<ReadCompletion> done_;
};

}  // namespace

std::unique_ptr<ReadBackend> make_inline_reader(
    std::function<ReadCompletion(const ReadRequest&)> perform) {
  return std::make_unique<InlineReader>(std::move(perform));
}

ReadCompletion pread_request(const ReadRequest& request) { return perform_read(request); }

std::unique_ptr<ReadBackend> make_worker_pool(
    int threads, std::function<ReadCompletion(const ReadRequest&)> perform, uint32_t idle_spin_us) {
  return std::make_unique<WorkerPool>(threads < 1 ? 1 : threads, std::move(perform), idle_spin_us);
}

std::unique_ptr<ReadBackend> make_pread_pool(int threads, uint32_t idle_spin_us) {
  return make_worker_pool(threads, perform_read, idle_spin_us);
}

}  // namespace instanttensor::io
