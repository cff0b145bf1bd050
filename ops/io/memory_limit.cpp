#include "io/memory_limit.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace instanttensor::io {

namespace {

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// A memory controller's view of this process: where its hierarchy is mounted, the file there
// that states a cgroup's limit, and the process's cgroup path ("/kubepods/pod1/c1").
struct MemoryController {
  std::string mount;
  std::string limit_file;
  std::string path;
};

// From /proc/self/cgroup ("id:controllers:path" per line): the v2 line ("0::/path") and the v1
// line whose controllers include memory ("4:memory:/path", "4:cpu,memory:/path").
std::vector<MemoryController> own_memory_controllers() {
  std::vector<MemoryController> found;
  std::istringstream lines(read_text("/proc/self/cgroup"));
  std::string line;
  while (std::getline(lines, line)) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    const std::string path = line.substr(second + 1);
    if (controllers == ",," && line.compare(0, first, "0") == 0) {
      found.push_back({"/sys/fs/cgroup", "memory.max", path});
    } else if (controllers.find(",memory,") != std::string::npos) {
      found.push_back({"/sys/fs/cgroup/memory", "memory.limit_in_bytes", path});
    }
  }
  return found;
}

uint64_t measure_memory_limit() {
  uint64_t limit = UINT64_MAX;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) limit = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
  // The limit that binds is the lowest on the way up: a parent's caps its children's. The
  // root is read too: inside a cgroup namespace (a container) "/" is the container's own
  // cgroup; a machine's root states none (v2) or an unlimited one (v1: a huge count).
  for (const auto& controller : own_memory_controllers()) {
    std::string cgroup = controller.path;
    while (!cgroup.empty()) {
      const std::string folder = cgroup == "/" ? std::string() : cgroup;
      const std::string file = controller.mount + folder + "/" + controller.limit_file;
      limit = std::min(limit, parse_cgroup_memory_max(read_text(file)));
      if (cgroup == "/") break;
      const size_t slash = cgroup.find_last_of('/');
      cgroup = slash == 0 || slash == std::string::npos ? "/" : cgroup.substr(0, slash);
    }
  }
  return limit;
}

}  // namespace

uint64_t parse_cgroup_memory_max(const std::string& text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return UINT64_MAX;  // "max", or nothing
  char* end = nullptr;
  const unsigned long long bytes = std::strtoull(text.c_str(), &end, 10);
  if (*end != '\0' && *end != '\n') return UINT64_MAX;
  return bytes;
}

uint64_t memory_limit_bytes() {
#ifdef INSTANTTENSOR_TESTING_HOOKS
  // Tests play a machine smaller than their checkpoint.
  if (const char* testing = std::getenv("INSTANTTENSOR_TESTING_MEMORY_BYTES")) {
    return std::strtoull(testing, nullptr, 10);
  }
#endif
  static const uint64_t limit = measure_memory_limit();
  return limit;
}

}  // namespace instanttensor::io
