// Time booked into Stats (read, wait, copy, exchange, open seconds): one clock for the whole
// loader, in its lowest layer so that every part above may book time.
#pragma once

#include <chrono>

namespace instanttensor::loader {

using Clock = std::chrono::steady_clock;

// Seconds from `start` to now. Any thread.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace instanttensor::loader
