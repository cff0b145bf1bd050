#include "loader/exchange/host_identity.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace instanttensor::loader {

namespace {

uint64_t fnv1a(uint64_t hash, const void* data, size_t size) {
  for (size_t i = 0; i < size; ++i) {
    hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 1099511628211ull;
  }
  return hash;
}

constexpr uint64_t kFnvBasis = 1469598103934665603ull;

}  // namespace

uint64_t host_identity(const std::vector<FileIdentity>& files) {
#ifdef INSTANTTENSOR_TESTING_HOOKS
  if (const char* testing = std::getenv("INSTANTTENSOR_TESTING_HOST_ID")) {
    return fnv1a(kFnvBasis, testing, std::char_traits<char>::length(testing));
  }
#endif
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  uint64_t hash = fnv1a(kFnvBasis, boot_id.data(), boot_id.size());
  for (const auto& file : files) {
    hash = fnv1a(hash, &file.device, sizeof(file.device));
    hash = fnv1a(hash, &file.inode, sizeof(file.inode));
  }
  return hash;
}

HostTopology host_topology(const std::vector<uint64_t>& identities, int rank) {
  HostTopology topology;
  const uint64_t mine = identities.at(static_cast<size_t>(rank));
  topology.local_ranks = static_cast<int>(std::count(identities.begin(), identities.end(), mine));
  std::vector<uint64_t> distinct = identities;
  std::sort(distinct.begin(), distinct.end());
  topology.hosts =
      static_cast<int>(std::unique(distinct.begin(), distinct.end()) - distinct.begin());
  return topology;
}

int parse_local_ranks(const char* value) {
  if (value == nullptr || *value < '0' || *value > '9') return 1;
  char* end = nullptr;
  const unsigned long long count = std::strtoull(value, &end, 10);
  if (*end != '\0' || count < 1 || count > (1u << 20)) return 1;
  return static_cast<int>(count);
}

int launcher_local_ranks() {
  int ranks = 1;
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    ranks = std::max(ranks, parse_local_ranks(std::getenv(name)));
  }
  return ranks;
}

}  // namespace instanttensor::loader
