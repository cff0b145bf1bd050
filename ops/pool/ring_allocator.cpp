#include "pool/ring_allocator.h"

namespace instanttensor::pool {

RingAllocator::RingAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity), limit_(capacity), alignment_(alignment) {}

uint64_t RingAllocator::aligned_from(uint64_t from, uint64_t phase) const {
  uint64_t want = phase & (alignment_ - 1);
  uint64_t have = from & (alignment_ - 1);
  return from + ((want - have) & (alignment_ - 1));
}

std::optional<uint64_t> RingAllocator::allocate(uint64_t size, uint64_t phase) {
  auto fits_before = [&](uint64_t start, uint64_t limit) -> std::optional<uint64_t> {
    uint64_t at = aligned_from(start, phase);
    if (at <= limit && size <= limit - at) return at;
    return std::nullopt;
  };
  std::optional<uint64_t> at;
  if (regions_.empty()) {
    at = fits_before(0, limit_);
  } else {
    uint64_t tail = regions_.front().begin;
    uint64_t head = regions_.back().end;
    if (head > tail) {  // occupied [tail, head): free space after head, then before tail
      at = fits_before(head, limit_);
      if (!at) at = fits_before(0, tail);
    } else {  // wrapped: occupied [tail, an earlier limit) and [0, head)
      at = fits_before(head, tail);
    }
  }
  if (at) regions_.push_back(Region{*at, *at + size});
  return at;
}

void RingAllocator::release_oldest() { regions_.pop_front(); }

}  // namespace instanttensor::pool
