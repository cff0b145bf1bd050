// A fake process group for tests: `world` ranks as threads of this process, whose collectives
// (allgather, _allgather_base, broadcast: what RankExchange calls) meet in memory. The real
// backends (gloo, NCCL) are exercised by the Python suite; this one lets the exchange's and the
// walks' own logic run in one C++ test without sockets.
#pragma once

#include <memory>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace instanttensor::testing {

struct ThreadGroupState;

// Every rank's group, in rank order. Rank r's group must be used by one thread only, and every
// rank must make the same collectives in the same order (as with a real group).
std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> thread_group(int world);

}  // namespace instanttensor::testing
