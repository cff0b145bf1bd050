// What the loader's stages did when, for finding what bounds a load: reads (in the read calls
// and booked by the consumer), staging slices placed and freed, a staging ring found full, copies
// queued, host waits for copies, the consumer's waits and tensors handed out, and between ranks
// the status rounds waited for and the gathers queued. Times are
// steady-clock seconds (Python's time.monotonic), so a benchmark lays other clocks' events (the
// simulated device's copy engine) beside them. Off unless INSTANTTENSOR_TIMELINE=1: then every
// event costs one lock, which a benchmark's reads of megabytes do not notice.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "instanttensor/instanttensor.h"
#include "loader/reads/timing.h"

namespace instanttensor::loader {

class PassTimeline {
 public:
  // Names as SafeOpen::timeline() reports them (TimelineEvent::kind).
  enum class Kind : uint8_t {
    ReadSubmitted,  // a piece handed to the read backend (instant)
    Read,           // a piece inside its read calls (interval)
    ReadBooked,     // the consumer's thread learned a piece was done (instant)
    StagingPlaced,  // a staging slice taken for a read (instant; bytes: the slice)
    StagingFreed,   // a staging slice given back after its copy read it (instant)
    StagingFull,    // a read could not be submitted: no staging slice free without a wait
    CopyQueued,     // a copy to the device queued on the loader's stream (instant)
    CopyWait,       // the host blocked until a copy had read its staging slice (interval)
    ConsumerWait,   // the consumer blocked for a tensor's bytes (interval)
    TensorOut,      // a tensor handed out (instant)
    Open,           // the open: headers, the read method (a cold probe), plans (interval)
    StagingLimit,   // the staging ring's limit set or raised (instant; bytes: the new limit)
    StatusWait,     // ranks: the consumer waiting for a status round, reading on (interval)
    GatherQueued,   // ranks: a unit's gather queued (instant; bytes: the unit)
  };
  static const char* name(Kind kind);

  // At most this many events are kept (events() then ends early, silently; dropped() counts the
  // rest): a pass of 8 MiB reads records a few per read, 1 TB of them about 10^6.
  static constexpr size_t kMaxEvents = size_t{1} << 20;

  // Starts recording (opening reads INSTANTTENSOR_TIMELINE). Any thread.
  void enable() { enabled_.store(true, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Records an interval (an instant: start == end). Any thread: read workers, the consumer.
  void record(Kind kind, Clock::time_point start, Clock::time_point end, uint64_t bytes = 0,
              uint64_t tag = 0);
  void instant(Kind kind, uint64_t bytes = 0, uint64_t tag = 0) {
    if (enabled()) {
      auto now = Clock::now();
      record(kind, now, now, bytes, tag);
    }
  }

  // Everything recorded so far, in the order recorded. Any thread.
  std::vector<TimelineEvent> events() const;
  uint64_t dropped() const;

 private:
  struct Entry {
    Kind kind;
    Clock::time_point start, end;
    uint64_t bytes, tag;
  };
  std::atomic<bool> enabled_{false};
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  uint64_t dropped_ = 0;
};

// Records an interval from construction to destruction when the timeline is on.
class TimelineSpan {
 public:
  TimelineSpan(PassTimeline& timeline, PassTimeline::Kind kind, uint64_t bytes = 0)
      : timeline_(timeline), kind_(kind), bytes_(bytes) {
    if (timeline_.enabled()) start_ = Clock::now();
  }
  ~TimelineSpan() {
    if (start_ != Clock::time_point{}) timeline_.record(kind_, start_, Clock::now(), bytes_);
  }
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;

 private:
  PassTimeline& timeline_;
  PassTimeline::Kind kind_;
  uint64_t bytes_;
  Clock::time_point start_{};
};

}  // namespace instanttensor::loader
