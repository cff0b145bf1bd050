// The size of this host's last-level CPU cache (torch-free), which decides how large a slice
// warm reads copy into staging: a ring that fits it is written in the cache, not through to
// memory (plan::choose_staged_read_bytes).
#pragma once

#include <cstdint>
#include <string>

namespace instanttensor::io {

// Bytes of the highest-level unified cache of CPU 0, as sysfs states it
// (/sys/devices/system/cpu/cpu0/cache/index*/): 0 when none can be read. Not glibc's
// sysconf(_SC_LEVEL3_CACHE_SIZE), which reads the CPUID of the whole package (320 MiB on this
// project's 2-core VM, whose guest cache is 32 MiB). Read once per process; a library built with
// INSTANTTENSOR_TESTING_HOOKS reads INSTANTTENSOR_TESTING_LLC_BYTES first, on each call. Any
// thread.
uint64_t last_level_cache_bytes();

// A sysfs cache size ("32768K", "2M", "512", then a newline) in bytes: 0 for text that is not
// one. Pure.
uint64_t parse_cache_size(const std::string& text);

}  // namespace instanttensor::io
