#include "io/cache_size.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace instanttensor::io {

namespace {

std::string first_line(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

uint64_t measure_last_level_cache() {
  int best_level = 0;
  uint64_t best_bytes = 0;
  // index0..: L1 data and instruction, L2, L3 (and L4 where one exists); the files of an index
  // past the last do not exist.
  for (int index = 0; index < 8; ++index) {
    const std::string folder =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    const std::string type = first_line(folder + "type");
    if (type.empty()) break;
    if (type != "Unified") continue;
    const int level = std::atoi(first_line(folder + "level").c_str());
    const uint64_t bytes = parse_cache_size(first_line(folder + "size"));
    if (level > best_level && bytes > 0) best_level = level, best_bytes = bytes;
  }
  return best_bytes;
}

}  // namespace

uint64_t parse_cache_size(const std::string& text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  uint64_t unit = 1;
  if (*end == 'K')
    unit = 1ull << 10, ++end;
  else if (*end == 'M')
    unit = 1ull << 20, ++end;
  else if (*end == 'G')
    unit = 1ull << 30, ++end;
  if (*end != '\0' && *end != '\n') return 0;
  return value * unit;
}

uint64_t last_level_cache_bytes() {
#ifdef INSTANTTENSOR_TESTING_HOOKS
  // Tests play hosts of other cache sizes (0: unknown).
  if (const char* testing = std::getenv("INSTANTTENSOR_TESTING_LLC_BYTES")) {
    return std::strtoull(testing, nullptr, 10);
  }
#endif
  static const uint64_t bytes = measure_last_level_cache();
  return bytes;
}

}  // namespace instanttensor::io
