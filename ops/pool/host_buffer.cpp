#include "pool/host_buffer.h"

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "instanttensor/error.h"

namespace instanttensor::pool {

namespace {
constexpr uint64_t kHugePage = 2ull << 20;

void free_pinned_copy(void* holder) { delete static_cast<c10::DataPtr*>(holder); }

}  // namespace

HostBlock allocate_host_block(uint64_t nbytes, uint64_t min_alignment, const char* purpose) {
  uint64_t alignment = nbytes >= kHugePage ? kHugePage : 64;
  if (alignment < min_alignment) alignment = min_alignment;
  // Round the size up too: the tail of a huge page would otherwise be a separate small mapping.
  uint64_t rounded = ((nbytes ? nbytes : 1) + alignment - 1) / alignment * alignment;
  void* ptr = nullptr;
  if (::posix_memalign(&ptr, alignment, rounded) != 0 || ptr == nullptr) {
    throw Error(ErrorKind::Io, "", "",
                std::string("out of host memory allocating ") + std::to_string(nbytes) +
                    " bytes for " + purpose);
  }
  if (rounded >= kHugePage) ::madvise(ptr, rounded, MADV_HUGEPAGE);
  return HostBlock{ptr, rounded};
}

void free_host_block(void* ptr) noexcept { std::free(ptr); }

c10::DataPtr allocate_host(uint64_t nbytes, bool prefault, const char* purpose) {
  void* ptr = allocate_host_block(nbytes, 64, purpose).ptr;
  if (prefault) std::memset(ptr, 0, nbytes);
  return c10::DataPtr(ptr, ptr, &free_host_block, c10::Device(c10::DeviceType::CPU));
}

c10::DataPtr allocate_host_window(uint64_t span, uint64_t prefix, uint64_t alignment,
                                  const char* purpose) {
  void* block = allocate_host_block(span, alignment, purpose).ptr;
  return c10::DataPtr(static_cast<char*>(block) + prefix, block, &free_host_block,
                      c10::Device(c10::DeviceType::CPU));
}

c10::DataPtr allocate_pinned(uint64_t nbytes, uint64_t alignment, c10::DeviceType device_type) {
  // The caching host allocator rounds each request up to a power of two: ask for exactly the
  // (power-of-two) size, whose blocks come page-aligned, and pad only if one does not.
  at::HostAllocator* allocator = at::getHostAllocator(device_type);
  c10::DataPtr block = allocator->allocate(nbytes);
  auto base = reinterpret_cast<uintptr_t>(block.get());
  if (base % alignment == 0) return block;
  block = allocator->allocate(nbytes + alignment);
  base = reinterpret_cast<uintptr_t>(block.get());
  auto aligned = (base + alignment - 1) / alignment * alignment;
  auto* holder = new c10::DataPtr(std::move(block));
  return c10::DataPtr(reinterpret_cast<void*>(aligned), holder, &free_pinned_copy,
                      c10::Device(c10::DeviceType::CPU));
}

void release_cached_pinned(c10::DeviceType device_type) noexcept {
  try {
    at::getHostAllocator(device_type)->empty_cache();
  } catch (...) {
    // Nothing cached, or no runtime: nothing to give back.
  }
}

}  // namespace instanttensor::pool
