// The simulated accelerator's runtime: devices, their memory, streams run by worker threads,
// events, and the delay knob. Test-only (never linked into libinstanttensor.so).
//
// Device memory is handed out at addresses with the top bit flipped: host code that reads or
// writes device memory directly faults at once instead of passing by luck. Only the queued
// operations below touch it, through real().
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace simdev {

constexpr int kDeviceCount = 2;
// Stream ids per device: 0 the default stream; 1..kPoolStreams the pool (what the loader takes,
// getStreamFromGlobalPool); the rest but the last for getNewStream (a test's torch.Stream), so a
// consumer's stream never is the loader's by chance and ordering between them must come from
// events; the last kCollectiveStreams for the simulated collectives.
constexpr int kStreamsPerDevice = 12;
constexpr int kPoolStreams = 3;
// The last ids: the simulated collectives' own streams (NCCL's, one per communicator), which
// nothing else hands out; each backend takes the next (collective_stream), so up to this many
// groups never share one and cannot order each other's collectives.
constexpr int kCollectiveStreams = 4;
constexpr c10::StreamId kFirstCollectiveStream = kStreamsPerDevice - kCollectiveStreams;
constexpr uint64_t kDeviceCapacity = 8ull << 30;  // what mem_get_info reports as total

// The host address behind a device address (and back: the mapping is its own inverse).
inline void* real(const void* device_address) {
  return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(device_address) ^ (1ull << 63));
}

// One stream: operations run in order on a worker thread of its own, each after a random
// 0-2 ms sleep when delays are on. Sequence numbers count operations enqueued and completed.
// With the timing model on, the stream keeps the device's clock (see engine_move): an operation
// is ready when it was enqueued or when the one before it ended on that clock, whichever is
// later, however late the worker thread is scheduled to run it.
class Stream {
 public:
  Stream(c10::DeviceIndex device, c10::StreamId id);
  ~Stream();
  // Queues `op`; returns its sequence number. Any thread.
  uint64_t enqueue(std::function<void()> op);
  // Blocks until operation `sequence` (and all before it) has run.
  void wait_for(uint64_t sequence);
  bool passed(uint64_t sequence);
  uint64_t enqueued();
  void synchronize() { wait_for(enqueued()); }
  c10::Stream handle() const;

 private:
  void run();
  c10::DeviceIndex device_;
  c10::StreamId id_;
  std::mutex mutex_;
  std::condition_variable changed_;
  struct Queued {
    uint64_t sequence;
    std::function<void()> op;
    std::chrono::steady_clock::time_point enqueued_at;
  };
  std::deque<Queued> queue_;
  // When the last operation ended on the device's clock (worker thread only).
  std::chrono::steady_clock::time_point device_time_;
  // device_time_ as of completed_ (under mutex_): where a stream waiting for this one goes on.
  std::chrono::steady_clock::time_point completed_device_time_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

// A recorded position on a stream (what c10::Event's opaque pointer points at).
struct Event {
  Stream* stream = nullptr;
  uint64_t sequence = 0;
};

Stream& stream_of(const c10::Stream& stream);
Stream& stream(c10::DeviceIndex device, c10::StreamId id);
// The calling thread's current device and its current stream on each device.
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex device);
c10::Stream current_stream(c10::DeviceIndex device);
c10::Stream exchange_current_stream(const c10::Stream& stream);
// Round-robin over the pool streams, and over the streams for getNewStream.
c10::Stream pool_stream(c10::DeviceIndex device);
c10::Stream new_stream(c10::DeviceIndex device);
// Round-robin over the collective streams: the id a new collective backend uses on each device.
c10::StreamId next_collective_stream();

// Sleeps a random 0-2 ms when delays are on (INSTANTTENSOR_SIMDEV_DELAY=1 or set_delays).
void maybe_delay();
void set_delays(bool on);
bool delays();

// The timing model (off by default): each device has one copy engine per direction, shared by
// all its streams, and a copy holds it for `latency + bytes / bandwidth`. Set by
// INSTANTTENSOR_SIMDEV_TIMING="<h2d GB/s>,<d2h GB/s>,<latency us>" (read at load) or
// set_timing; a bandwidth of 0 turns the model off for that direction.
struct Timing {
  double h2d_bytes_per_second = 0;
  double d2h_bytes_per_second = 0;
  double latency_seconds = 0;
};
void set_timing(const Timing& timing);
Timing timing();

// Benchmarks only (default on): whether queued copies and device kernels move their bytes and
// fresh device memory is poisoned. Off, they only take their modelled time, so the host's cores
// are not spent simulating a DMA engine and device memory (benchmarks/device_pipeline.py); the
// correctness tests always move the bytes.
// Copies of up to 64 KiB always move: control messages (a collective's status words, a
// handshake) travel in them and must arrive.
void set_move_bytes(bool on);
bool move_bytes();
bool moves(size_t nbytes);

enum class Direction { HostToDevice, DeviceToHost };
// Holds the copy engine of `device` for `direction` as long as the model says for `nbytes`, on
// the device's clock (from when the copy was ready on its stream and the engine free, not from
// when its worker thread ran it; a host thread's copy starts now), calling `move` first: it
// moves the bytes, or not (moves(), above), after checking the device memory is still live.
// Called where queued copies run.
void engine_move(c10::DeviceIndex device, Direction direction, size_t nbytes,
                 const std::function<void()>& move);
// Holds the engine for the modelled time of `nbytes`, moving nothing (benchmarks).
void engine_time(c10::DeviceIndex device, Direction direction, size_t nbytes);
// For a stream's operation that waited on the host (a collective's rendezvous, whose copies run
// on the host's clock): the device's clock goes on from now. No-op off a stream's worker.
void catch_up_device_clock();

// Counters the tests and benchmarks read (any thread):
// - host syncs: a host thread (not a stream worker) asking to wait until a stream reaches a
//   point (stream or event synchronize, a blocking copy, a read back to the host);
// - host waits: those of them that blocked (the point had not passed yet);
// - pending polls: event or stream queries answered "not yet";
// - peaks of device bytes per device and of pinned bytes since the last reset_peaks.
struct Counters {
  uint64_t host_waits = 0;
  uint64_t host_syncs = 0;
  uint64_t pending_polls = 0;
  // CPU time the streams' worker threads spent (running queued work: copies, kernels, frees;
  // and waking for it, queue handling, waking the waiters), up to the end of the last operation
  // each ran: what simulating the device costs the host's cores, which a GPU's engines would not.
  double worker_cpu_seconds = 0;
  // CPU time the enqueuing threads (the host's) spent waking the streams' workers for new work:
  // also the simulator's cost to the host, spent on the host's own threads.
  double wake_cpu_seconds = 0;
};
Counters counters();

// What one copy engine did since the last reset_engine_stats: copies, the seconds they held it
// (modelled), and when the first began and the last ended (steady clock: Python's
// time.monotonic). Benchmarks compare busy time with the pass's wall time.
struct EngineStats {
  uint64_t copies = 0;
  double busy_seconds = 0;
  double first_start = 0;
  double last_end = 0;
};
EngineStats engine_stats(c10::DeviceIndex device, Direction direction);
// Each copy of one engine since the last reset_engine_stats (at most the first 2^20): when it
// began and ended (steady clock) and its bytes, for a benchmark's timeline.
struct EngineCopy {
  double start = 0;
  double end = 0;
  uint64_t bytes = 0;
};
std::vector<EngineCopy> engine_log(c10::DeviceIndex device, Direction direction);
void reset_engine_stats();
void count_pending_poll();
// Peaks restart at the bytes in use now.
void reset_peaks();
uint64_t device_bytes_peak(c10::DeviceIndex device);
uint64_t pinned_bytes_peak();

// Device memory accounting (bytes live per device) and host pinned memory (bytes live, and
// whether a host pointer lies in a pinned block).
uint64_t device_bytes_in_use(c10::DeviceIndex device);
void add_device_bytes(c10::DeviceIndex device, int64_t delta);
uint64_t pinned_bytes_in_use();
bool is_pinned(const void* host);
void add_pinned_block(void* base, uint64_t size);
// A locked-memory limit: pinned allocations that would take the pinned bytes in use above
// `bytes` are refused (an error, as cudaHostAlloc's under RLIMIT_MEMLOCK); negative: no limit.
void set_pinned_limit(int64_t bytes);
int64_t pinned_limit();
void remove_pinned_block(void* base);

}  // namespace simdev
