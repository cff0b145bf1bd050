// How `auto` reads files that are not in the page cache: O_DIRECT and buffered reads timed on
// the first bytes of the load, and the faster one kept (torch-free).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/read_backend.h"

namespace instanttensor::io {

// Bytes each method reads when timed: 1/64 of the checkpoint, from kLeastProbeBytes to
// kProbeBytes (32 MiB: tens of milliseconds at 1-2 GB/s, enough for a rate that a few hundred
// microseconds of jitter do not swing). The O_DIRECT probe's bytes miss the page cache and are
// read again by the load, so the probe costs the open about 2% of the load's reads (3% for the
// smallest timed checkpoints, at the 8 MiB floor; a fixed 32 MiB each took 0.08-0.09 s of the
// open of 0.5 GB here, 15-23% of a cold staged load).
constexpr uint64_t kProbeBytes = 32ull << 20;
constexpr uint64_t kLeastProbeBytes = 8ull << 20;
uint64_t probe_bytes_for(uint64_t checkpoint_bytes);
// Checkpoints smaller than this are read buffered without timing anything: the probe would be
// a large share of the load, and the page cache keeps them for the next run.
constexpr uint64_t kSmallestTimedCheckpoint = 8 * kProbeBytes;

struct ReadMethodChoice {
  bool direct = false;
  double direct_rate = 0;    // bytes per second measured with O_DIRECT; 0: not measured
  double buffered_rate = 0;  // bytes per second measured through the page cache; 0: not measured
  std::string reason;        // for stats()["backend"]: what was measured and why this method
};

// O_DIRECT must time this much faster to be kept: buffered reads share the page cache with the
// other ranks of the host and the next load, and a short probe understates them (the kernel's
// read-ahead grows over a long sequential read). On this project's VM the two timed within 10%
// of each other on 32 MiB while buffered loads of 1 GB took 0.68-0.73 s against 0.81-0.97 s
// with O_DIRECT (benchmarks/README.md); NVMe drives read O_DIRECT 1.5-3x faster than buffered.
constexpr double kDirectMargin = 1.25;

// The decision from measured rates: buffered unless O_DIRECT is kDirectMargin times faster. A
// rate of 0 means that method could not be measured (O_DIRECT refused, a read failed): the
// other one is kept. `probe_bytes` is only reported. Pure; any thread.
ReadMethodChoice decide_read_method(double direct_rate, double buffered_rate, uint64_t probe_bytes);

// Times both methods on the largest file (so the load reads these bytes anyway): `probe_bytes`
// (0: probe_bytes_for the checkpoint; rounded down to 16 KiB) from its start with O_DIRECT, the
// next `probe_bytes` buffered, each
// as 4 concurrent reads (the pread pool's depth), then decide_read_method. Checkpoints under
// `smallest_timed` bytes, or whose largest file is under 2 * probe_bytes, are read buffered
// unmeasured. Opens and closes its own O_DIRECT fd; threads it starts are joined before it
// returns; never throws (a failure to measure leaves buffered reads, with the reason said).
// Any thread; `files`' fds stay the caller's.
ReadMethodChoice measure_read_methods(const std::vector<FileToRead>& files,
                                      uint64_t probe_bytes = 0,
                                      uint64_t smallest_timed = kSmallestTimedCheckpoint);

}  // namespace instanttensor::io
