#include "io/memory_advice.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "io/fault_injection.h"

namespace instanttensor::io {

namespace {
std::atomic<uint64_t> refusals{0};
std::mutex first_mutex;
std::string first;  // guarded by first_mutex

const char* advice_name(int advice) {
  switch (advice) {
    case MADV_DONTNEED:
      return "MADV_DONTNEED";
    case MADV_HUGEPAGE:
      return "MADV_HUGEPAGE";
    case MADV_SEQUENTIAL:
      return "MADV_SEQUENTIAL";
    case MADV_NORMAL:
      return "MADV_NORMAL";
    case MADV_WILLNEED:
      return "MADV_WILLNEED";
    case MADV_REMOVE:
      return "MADV_REMOVE";
    default:
      return "madvise";
  }
}

void note_refusal(int advice, uint64_t length, const char* purpose, int error) noexcept {
  // The words before the count, so that a count above zero always has its description.
  if (refusals.load() == 0) {
    try {
      std::lock_guard<std::mutex> lock(first_mutex);
      if (first.empty()) {
        first = std::string(advice_name(advice)) + " of " + std::to_string(length) + " bytes (" +
                purpose + "): " + std::strerror(error);
      }
    } catch (...) {
      // No memory for the words: the count alone says it.
    }
  }
  refusals.fetch_add(1);
}
}  // namespace

bool advise(void* start, uint64_t length, int advice, const char* purpose) noexcept {
  if (length == 0) return true;
  int error = injected_advice_refusal(advice);
  if (error == 0 && ::madvise(start, length, advice) != 0) error = errno;
  if (error == 0) return true;
  note_refusal(advice, length, purpose, error);
  return false;
}

uint64_t advice_refusals() noexcept { return refusals.load(); }

std::string first_advice_refusal() {
  std::lock_guard<std::mutex> lock(first_mutex);
  return first;
}

}  // namespace instanttensor::io
