#include "loader/pass/owned_copy.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "io/direct_io.h"
#include "io/fault_free_copy.h"
#include "io/process_id.h"
#include "io/untouched_pages.h"

namespace instanttensor::loader {

namespace {
constexpr int64_t kCopyGrain = 4 << 20;
// The process the library was loaded in. A forked child copies on its own thread: torch's
// OpenMP pool, once used by the parent, waits in a child for threads that are not there.
const pid_t loaded_in = io::current_process_id();

// at::parallel_for, or the caller's thread alone in a forked child.
template <typename Body>
void for_ranges(int64_t begin, int64_t end, int64_t grain, const Body& body) {
  if (io::current_process_id() != loaded_in) {
    if (begin < end) body(begin, end);
    return;
  }
  at::parallel_for(begin, end, grain, body);
}
}  // namespace

uint64_t copy_into_untouched(uint8_t* to, const uint8_t* from, uint64_t nbytes) {
  const uint64_t page = io::page_size();
  io::UntouchedPagePlacer placer(to, nbytes);
  std::mutex mutex;
  std::vector<std::pair<uint64_t, uint64_t>> not_placed;  // [begin, end) byte ranges
  const auto pages = static_cast<int64_t>(placer.registered_bytes() / page);
  for_ranges(0, pages, static_cast<int64_t>(kCopyGrain / page), [&](int64_t first, int64_t last) {
    const uint64_t begin = static_cast<uint64_t>(first) * page;
    const uint64_t end = static_cast<uint64_t>(last) * page;
    const uint64_t placed = placer.place(begin, from + begin, end - begin);
    if (placed < end - begin) {
      std::lock_guard<std::mutex> lock(mutex);
      not_placed.emplace_back(begin + placed, end);
    }
  });
  placer.close();
  not_placed.emplace_back(static_cast<uint64_t>(pages) * page, nbytes);
  uint64_t unreadable = nbytes;  // the first source byte that could not be read
  for (auto [begin, end] : not_placed) {
    for_ranges(static_cast<int64_t>(begin), static_cast<int64_t>(end), kCopyGrain,
               [&](int64_t b, int64_t e) {
                 const auto length = static_cast<uint64_t>(e - b);
                 const uint64_t copied = io::copy_without_faults(to + b, from + b, length);
                 if (copied < length) {
                   std::lock_guard<std::mutex> lock(mutex);
                   unreadable = std::min(unreadable, static_cast<uint64_t>(b) + copied);
                 }
               });
  }
  return unreadable;
}

std::shared_ptr<uint8_t> heap_bytes(uint64_t nbytes) {
  const uint64_t size = std::max<uint64_t>(64, (nbytes + 63) / 64 * 64);
  void* memory = std::aligned_alloc(64, size);
  if (!memory) throw std::bad_alloc();
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(memory), [](uint8_t* p) { std::free(p); });
}

}  // namespace instanttensor::loader
