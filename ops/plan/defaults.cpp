#include "plan/defaults.h"

namespace instanttensor::plan::defaults {

namespace {

// "8 MiB", "256 MiB", "32 KiB", or bytes: how the README writes sizes.
std::string size_text(uint64_t bytes) {
  if (bytes % (1ull << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes % (1ull << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes);
}

}  // namespace

std::vector<DefaultRow> default_table() {
  std::string share = std::to_string(kFreeMemoryShare);
  share.erase(share.find_last_not_of('0') + 1);  // "0.500000" -> "0.5"
  return {
      {"INSTANTTENSOR_BUFFER_SIZE", size_text(kReadAheadBytes)},
      {"INSTANTTENSOR_CHUNK_SIZE", size_text(kChunkBytes)},
      {"INSTANTTENSOR_CONCURRENCY", std::to_string(kConcurrency)},
      {"INSTANTTENSOR_CONCURRENCY", size_text(kInlineReadBytes)},
      {"INSTANTTENSOR_IO_DEPTH", std::to_string(kIoDepth)},
      {"INSTANTTENSOR_MAX_FREE_MEM_USAGE", share},
  };
}

}  // namespace instanttensor::plan::defaults
