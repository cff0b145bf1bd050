#include "sim_runtime.h"

#include <c10/util/Exception.h>
#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <random>
#include <string>

namespace simdev {

namespace {

std::atomic<bool> delays_on{[] {
  const char* value = std::getenv("INSTANTTENSOR_SIMDEV_DELAY");
  return value != nullptr && std::string(value) == "1";
}()};

std::array<std::array<std::unique_ptr<Stream>, kStreamsPerDevice>, kDeviceCount>& streams() {
  // Never destroyed: worker threads may still run at exit, and destructors of other statics
  // (storages freed at exit) enqueue on them.
  static auto* all = [] {
    auto* table =
        new std::array<std::array<std::unique_ptr<Stream>, kStreamsPerDevice>, kDeviceCount>();
    for (int d = 0; d < kDeviceCount; ++d) {
      for (int s = 0; s < kStreamsPerDevice; ++s) {
        (*table)[d][s] = std::make_unique<Stream>(static_cast<c10::DeviceIndex>(d), s);
      }
    }
    return table;
  }();
  return *all;
}

thread_local c10::DeviceIndex thread_device = 0;
thread_local bool on_stream_worker = false;
// The operation a stream's worker runs, on the device's clock: at host time `op_host_mark` it
// was at device time `op_device_mark`, and it has gone on at the host's pace since; a copy
// moves the marks to where it ended, a wait for another stream to where that one got.
thread_local std::chrono::steady_clock::time_point op_device_mark;
thread_local std::chrono::steady_clock::time_point op_host_mark;

std::chrono::steady_clock::time_point op_device_now() {
  return op_device_mark + (std::chrono::steady_clock::now() - op_host_mark);
}
std::atomic<uint64_t> host_wait_count{0};
std::atomic<uint64_t> worker_cpu_nanoseconds{0};
std::atomic<uint64_t> wake_cpu_nanoseconds{0};

uint64_t thread_cpu_nanoseconds() {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
}
std::atomic<uint64_t> host_sync_count{0};
std::atomic<uint64_t> pending_poll_count{0};

Timing timing_from_environment() {
  Timing t;
  const char* value = std::getenv("INSTANTTENSOR_SIMDEV_TIMING");
  if (value == nullptr || *value == 0) return t;
  double h2d = 0, d2h = 0, latency_us = 0;
  TORCH_CHECK(
      std::sscanf(value, "%lf,%lf,%lf", &h2d, &d2h, &latency_us) == 3,
      "INSTANTTENSOR_SIMDEV_TIMING: expected \"<h2d GB/s>,<d2h GB/s>,<latency us>\", got \"", value,
      "\"");
  t.h2d_bytes_per_second = h2d * 1e9;
  t.d2h_bytes_per_second = d2h * 1e9;
  t.latency_seconds = latency_us * 1e-6;
  return t;
}

std::atomic<bool> moving_bytes{true};
std::mutex timing_mutex;
Timing current_timing = timing_from_environment();

// One engine per device and direction: a copy holds its mutex until its modelled end on the
// device's clock, and records what it did under it.
std::array<std::array<std::mutex, 2>, kDeviceCount> engines;
std::array<std::array<EngineStats, 2>, kDeviceCount> engine_records;
// Where each engine's last copy ended on the device's clock (under its engine mutex).
std::array<std::array<std::chrono::steady_clock::time_point, 2>, kDeviceCount> engine_free_at;
std::array<std::array<std::vector<EngineCopy>, 2>, kDeviceCount> engine_logs;
constexpr size_t kMaxLoggedCopies = size_t{1} << 20;

double monotonic_seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}
thread_local std::array<c10::StreamId, kDeviceCount> thread_streams{};
std::atomic<uint32_t> next_pool_stream{0};
std::atomic<uint32_t> next_new_stream{0};

std::mutex accounting_mutex;
std::array<uint64_t, kDeviceCount> device_bytes{};
std::array<uint64_t, kDeviceCount> device_peak{};
uint64_t pinned_peak = 0;
std::map<uintptr_t, uint64_t> pinned_blocks;  // base -> size
uint64_t pinned_total = 0;

void check_device(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kDeviceCount, "simdev: no device ", int(device));
}

}  // namespace

Stream::Stream(c10::DeviceIndex device, c10::StreamId id)
    : device_(device), id_(id), worker_([this] { run(); }) {}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

uint64_t Stream::enqueue(std::function<void()> op) {
  uint64_t sequence = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sequence = ++enqueued_;
    queue_.push_back(Queued{sequence, std::move(op), std::chrono::steady_clock::now()});
  }
  // Woken after the lock is released (a worker woken under it would block on it at once). A
  // host thread's wake is counted as the simulator's cost to the host: a GPU's copy engine wakes
  // no host thread, but this wake costs the enqueuing thread (the loader's consumer) 3-6 us a
  // copy here, 1.3-3 ms of a read-bound pass of 491 copies (2026-12-07). A stream worker's
  // enqueue (a block freed by an operation's captures) is already in its own count.
  if (on_stream_worker) {
    changed_.notify_all();
    return sequence;
  }
  const uint64_t before = thread_cpu_nanoseconds();
  changed_.notify_all();
  wake_cpu_nanoseconds.fetch_add(thread_cpu_nanoseconds() - before);
  return sequence;
}

void Stream::wait_for(uint64_t sequence) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Where the waiting operation got on the device's clock before it blocked: the host time it
  // then spends blocked is not the device's.
  const auto arrived = on_stream_worker ? op_device_now() : std::chrono::steady_clock::time_point{};
  if (!on_stream_worker) {
    host_sync_count.fetch_add(1);
    if (completed_ < sequence) host_wait_count.fetch_add(1);
  }
  changed_.wait(lock, [&] { return completed_ >= sequence; });
  if (on_stream_worker) {
    // An operation of another stream that waited for this one goes on from where this one got
    // on the device's clock (its last completion: never earlier than the operation waited for,
    // later if this stream has run on since) or from where it arrived, whichever is later; not
    // from the host's time when its worker saw the completion.
    op_host_mark = std::chrono::steady_clock::now();
    op_device_mark = std::max(arrived, completed_device_time_);
  }
}

bool Stream::passed(uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ >= sequence;
}

uint64_t Stream::enqueued() {
  std::lock_guard<std::mutex> lock(mutex_);
  return enqueued_;
}

c10::Stream Stream::handle() const {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device_), id_);
}

void Stream::run() {
  on_stream_worker = true;
  // Named, so a test can find the simulator's own threads in /proc and weigh their CPU.
  ::pthread_setname_np(::pthread_self(), "simdev-stream");
  // Everything this thread spends is the simulator's cost to the host, not only its operations:
  // waking for each one, taking it off the queue and telling the waiters cost it 2-3 times what
  // the operations do on a read-bound pass (10 of 15 ms of a 0.1 s pass, 2026-12-07).
  uint64_t counted = thread_cpu_nanoseconds();
  auto count_cpu = [&] {
    const uint64_t now = thread_cpu_nanoseconds();
    worker_cpu_nanoseconds.fetch_add(now - counted);
    counted = now;
  };
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    auto [sequence, op, enqueued_at] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    maybe_delay();
    op_host_mark = std::chrono::steady_clock::now();
    op_device_mark = std::min(op_host_mark, std::max(enqueued_at, device_time_));
    op();
    device_time_ = std::min(std::chrono::steady_clock::now(), op_device_now());
    count_cpu();
    // Released outside the lock: its captures (a storage kept alive for the copy) may free a
    // device block, which queues on a stream, maybe this one.
    op = nullptr;
    lock.lock();
    completed_ = sequence;
    completed_device_time_ = device_time_;
    changed_.notify_all();
  }
}

Stream& stream(c10::DeviceIndex device, c10::StreamId id) {
  check_device(device);
  TORCH_CHECK(id >= 0 && id < kStreamsPerDevice, "simdev: no stream ", id);
  return *streams()[device][id];
}

Stream& stream_of(const c10::Stream& s) { return stream(s.device_index(), s.id()); }

c10::DeviceIndex current_device() { return thread_device; }

void set_current_device(c10::DeviceIndex device) {
  check_device(device);
  thread_device = device;
}

c10::Stream current_stream(c10::DeviceIndex device) {
  check_device(device);
  return stream(device, thread_streams[device]).handle();
}

c10::Stream exchange_current_stream(const c10::Stream& s) {
  c10::Stream previous = current_stream(s.device_index());
  thread_streams[s.device_index()] = s.id();
  return previous;
}

c10::Stream pool_stream(c10::DeviceIndex device) {
  uint32_t n = next_pool_stream.fetch_add(1);
  return stream(device, static_cast<c10::StreamId>(1 + n % kPoolStreams)).handle();
}

c10::Stream new_stream(c10::DeviceIndex device) {
  uint32_t n = next_new_stream.fetch_add(1);
  constexpr int kNewStreams = kFirstCollectiveStream - 1 - kPoolStreams;
  return stream(device, static_cast<c10::StreamId>(1 + kPoolStreams + n % kNewStreams)).handle();
}

c10::StreamId next_collective_stream() {
  static std::atomic<uint32_t> next{0};
  return static_cast<c10::StreamId>(kFirstCollectiveStream +
                                    next.fetch_add(1) % kCollectiveStreams);
}

void maybe_delay() {
  if (!delays_on.load()) return;
  thread_local std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> micros(0, 2000);
  std::this_thread::sleep_for(std::chrono::microseconds(micros(random)));
}

void set_delays(bool on) { delays_on.store(on); }
bool delays() { return delays_on.load(); }

void set_timing(const Timing& t) {
  std::lock_guard<std::mutex> lock(timing_mutex);
  current_timing = t;
}

Timing timing() {
  std::lock_guard<std::mutex> lock(timing_mutex);
  return current_timing;
}

void set_move_bytes(bool on) { moving_bytes.store(on); }
bool move_bytes() { return moving_bytes.load(); }
bool moves(size_t nbytes) { return nbytes <= (64u << 10) || move_bytes(); }

namespace {
// The engine for `nbytes`, moving them when `moving`.
void run_engine(c10::DeviceIndex device, Direction direction, size_t nbytes,
                const std::function<void()>& move) {
  check_device(device);
  const Timing t = timing();
  const double bandwidth =
      direction == Direction::HostToDevice ? t.h2d_bytes_per_second : t.d2h_bytes_per_second;
  if (bandwidth <= 0) {
    if (move) move();
    return;
  }
  std::lock_guard<std::mutex> engine(engines[device][static_cast<int>(direction)]);
  // A copy engine runs on the device's clock, not the host's: a copy starts once it is ready
  // on its stream and the engine is free, even if the worker thread that models it is
  // scheduled late (on 2 busy cores, 8 MiB copies modelled at 0.21 ms took 0.54-0.74 ms of
  // wall time, so the engine looked slower the busier the host's readers were). Only the
  // moment the host sees the copy finished is late, as a real host's wake-up is.
  auto& free_at = engine_free_at[device][static_cast<int>(direction)];
  auto start = std::chrono::steady_clock::now();
  if (on_stream_worker) start = std::max(op_device_now(), free_at);
  if (move) move();
  auto modelled = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(t.latency_seconds + nbytes / bandwidth));
  auto end = start + modelled;
  std::this_thread::sleep_until(end);
  free_at = end;
  if (on_stream_worker) {
    op_device_mark = end;
    op_host_mark = std::chrono::steady_clock::now();
  }
  EngineStats& record = engine_records[device][static_cast<int>(direction)];
  if (record.copies == 0) record.first_start = monotonic_seconds(start);
  record.copies += 1;
  record.busy_seconds += std::chrono::duration<double>(end - start).count();
  record.last_end = monotonic_seconds(end);
  auto& log = engine_logs[device][static_cast<int>(direction)];
  if (log.size() < kMaxLoggedCopies) {
    log.push_back({monotonic_seconds(start), record.last_end, static_cast<uint64_t>(nbytes)});
  }
}
}  // namespace

void catch_up_device_clock() {
  if (!on_stream_worker) return;
  op_host_mark = std::chrono::steady_clock::now();
  op_device_mark = op_host_mark;
}

void engine_move(c10::DeviceIndex device, Direction direction, size_t nbytes,
                 const std::function<void()>& move) {
  run_engine(device, direction, nbytes, move);
}

void engine_time(c10::DeviceIndex device, Direction direction, size_t nbytes) {
  run_engine(device, direction, nbytes, nullptr);
}

EngineStats engine_stats(c10::DeviceIndex device, Direction direction) {
  check_device(device);
  std::lock_guard<std::mutex> engine(engines[device][static_cast<int>(direction)]);
  return engine_records[device][static_cast<int>(direction)];
}

std::vector<EngineCopy> engine_log(c10::DeviceIndex device, Direction direction) {
  check_device(device);
  std::lock_guard<std::mutex> engine(engines[device][static_cast<int>(direction)]);
  return engine_logs[device][static_cast<int>(direction)];
}

void reset_engine_stats() {
  for (int d = 0; d < kDeviceCount; ++d) {
    for (int direction = 0; direction < 2; ++direction) {
      std::lock_guard<std::mutex> engine(engines[d][direction]);
      engine_records[d][direction] = EngineStats();
      engine_logs[d][direction].clear();
    }
  }
}

Counters counters() {
  Counters c;
  c.host_waits = host_wait_count.load();
  c.host_syncs = host_sync_count.load();
  c.pending_polls = pending_poll_count.load();
  c.worker_cpu_seconds = static_cast<double>(worker_cpu_nanoseconds.load()) * 1e-9;
  c.wake_cpu_seconds = static_cast<double>(wake_cpu_nanoseconds.load()) * 1e-9;
  return c;
}

void count_pending_poll() { pending_poll_count.fetch_add(1); }

void reset_peaks() {
  std::lock_guard<std::mutex> lock(accounting_mutex);
  device_peak = device_bytes;
  pinned_peak = pinned_total;
}

uint64_t device_bytes_peak(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(accounting_mutex);
  return device_peak[device];
}

uint64_t pinned_bytes_peak() {
  std::lock_guard<std::mutex> lock(accounting_mutex);
  return pinned_peak;
}

uint64_t device_bytes_in_use(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(accounting_mutex);
  return device_bytes[device];
}

void add_device_bytes(c10::DeviceIndex device, int64_t delta) {
  std::lock_guard<std::mutex> lock(accounting_mutex);
  device_bytes[device] = static_cast<uint64_t>(static_cast<int64_t>(device_bytes[device]) + delta);
  device_peak[device] = std::max(device_peak[device], device_bytes[device]);
}

namespace {
std::atomic<int64_t> pinned_limit_bytes{-1};
}  // namespace

void set_pinned_limit(int64_t bytes) { pinned_limit_bytes = bytes; }
int64_t pinned_limit() { return pinned_limit_bytes; }

uint64_t pinned_bytes_in_use() {
  std::lock_guard<std::mutex> lock(accounting_mutex);
  return pinned_total;
}

bool is_pinned(const void* host) {
  auto address = reinterpret_cast<uintptr_t>(host);
  std::lock_guard<std::mutex> lock(accounting_mutex);
  auto after = pinned_blocks.upper_bound(address);
  if (after == pinned_blocks.begin()) return false;
  auto block = std::prev(after);
  return address < block->first + block->second;
}

void add_pinned_block(void* base, uint64_t size) {
  std::lock_guard<std::mutex> lock(accounting_mutex);
  pinned_blocks[reinterpret_cast<uintptr_t>(base)] = size;
  pinned_total += size;
  pinned_peak = std::max(pinned_peak, pinned_total);
}

void remove_pinned_block(void* base) {
  std::lock_guard<std::mutex> lock(accounting_mutex);
  auto found = pinned_blocks.find(reinterpret_cast<uintptr_t>(base));
  if (found == pinned_blocks.end()) return;
  pinned_total -= found->second;
  pinned_blocks.erase(found);
}

}  // namespace simdev
