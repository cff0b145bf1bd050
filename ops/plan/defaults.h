// Every default a caller can see, in one table: the options (OpenOptions, safe_open), the
// environment variables, the planner and the README's environment table read these (a test
// keeps the README's table equal to default_table()). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace instanttensor::plan::defaults {

constexpr uint64_t kChunkBytes = 8ull << 20;  // chunk_size, INSTANTTENSOR_CHUNK_SIZE
constexpr int kConcurrency = 4;               // concurrency, INSTANTTENSOR_CONCURRENCY
// Selections this small read on the caller's thread (no workers) unless concurrency is given:
// starting threads costs more than the reads.
constexpr uint64_t kInlineReadBytes = 8ull << 20;
constexpr int kIoDepth = 32;  // io_depth, INSTANTTENSOR_IO_DEPTH
// copy=True: bytes read ahead (buffer_size); a ring: the slack beyond two of its largest group.
constexpr uint64_t kReadAheadBytes = 256ull << 20;
constexpr uint64_t kStagingBytes = 64ull << 20;  // staging_size: a few chunks, a power of two
// max_free_mem_usage, INSTANTTENSOR_MAX_FREE_MEM_USAGE: the share of the accelerator's free
// memory the loader may use.
constexpr double kFreeMemoryShare = 0.5;

// One environment variable with its default as the README states it ("8 MiB", "4").
struct DefaultRow {
  std::string variable;
  std::string value;
};

// The variables whose default is one value above, each with that value as text, in the
// README's order. Pure; any thread.
std::vector<DefaultRow> default_table();

}  // namespace instanttensor::plan::defaults
