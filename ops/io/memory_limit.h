// How much memory this process's files can keep in the page cache at most: the machine's, or
// its cgroup's where lower (torch-free).
#pragma once

#include <cstdint>
#include <string>

namespace instanttensor::io {

// Physical memory, capped by the lowest memory limit on the path of this process's cgroup (v2
// `memory.max`, v1 `memory.limit_in_bytes`): a container's limit caps the page cache its
// processes fill too. Read once per process; a library built with INSTANTTENSOR_TESTING_HOOKS
// reads INSTANTTENSOR_TESTING_MEMORY_BYTES first, on each call. Any thread. UINT64_MAX when
// nothing can be read.
uint64_t memory_limit_bytes();

// The limit a cgroup's limit file states ("max" or a byte count, then a newline): UINT64_MAX for
// "max", an empty file or text that is not a count. Pure.
uint64_t parse_cgroup_memory_max(const std::string& text);

}  // namespace instanttensor::io
