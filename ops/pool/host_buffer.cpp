#include "pool/host_buffer.h"

#include <ATen/ATen.h>
#include <ATen/core/CachingHostAllocator.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "instanttensor/error.h"
#include "io/memory_advice.h"

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
  auto out_of_memory = [&] {
    return Error(ErrorKind::Io, "", "",
                 std::string("out of host memory allocating ") + std::to_string(nbytes) +
                     " bytes for " + purpose);
  };
  if (rounded < kHugePage) {
    void* ptr = nullptr;
    if (::posix_memalign(&ptr, alignment, rounded) != 0 || ptr == nullptr) throw out_of_memory();
    return HostBlock{ptr, rounded, false};
  }
  // Large blocks get a mapping of their own rather than malloc's heap: changing the heap (brk,
  // madvise) waits for the page faults that read workers are taking in it at that moment (3-10
  // ms a call while workers read into fresh memory: 0.3-0.6 s over 93 tensors), a new mapping
  // does not. Over-mapped by the alignment, then trimmed to it.
  uint64_t length = rounded + alignment;
  void* raw = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw out_of_memory();
  auto base = reinterpret_cast<uintptr_t>(raw);
  uintptr_t start = (base + alignment - 1) / alignment * alignment;
  if (start > base) ::munmap(raw, start - base);
  if (base + length > start + rounded) {
    ::munmap(reinterpret_cast<void*>(start + rounded), base + length - (start + rounded));
  }
  // A refusal (THP off) only costs speed: counted (io/memory_advice.h).
  (void)io::advise(reinterpret_cast<void*>(start), rounded, MADV_HUGEPAGE,
                   "a large host block's huge pages");
  return HostBlock{reinterpret_cast<void*>(start), rounded, true};
}

void free_host_block(const HostBlock& block) noexcept {
  if (block.mapped) {
    ::munmap(block.ptr, block.bytes);
  } else {
    std::free(block.ptr);
  }
}

namespace {
// The deleter of a DataPtr whose context is a heap-held HostBlock.
void free_held_block(void* held) noexcept {
  std::unique_ptr<HostBlock> block(static_cast<HostBlock*>(held));
  free_host_block(*block);
}

c10::DataPtr host_data_ptr(const HostBlock& block, uint64_t prefix) {
  void* data = static_cast<char*>(block.ptr) + prefix;
  if (!block.mapped) {
    return c10::DataPtr(data, block.ptr, &std::free, c10::Device(c10::DeviceType::CPU));
  }
  std::unique_ptr<HostBlock> held;
  try {
    held = std::make_unique<HostBlock>(block);
  } catch (...) {
    free_host_block(block);
    throw;
  }
  return c10::DataPtr(data, held.release(), &free_held_block, c10::Device(c10::DeviceType::CPU));
}
}  // namespace

c10::DataPtr allocate_host(uint64_t nbytes, bool prefault, const char* purpose) {
  HostBlock block = allocate_host_block(nbytes, 64, purpose);
  if (prefault) std::memset(block.ptr, 0, nbytes);
  return host_data_ptr(block, 0);
}

c10::DataPtr allocate_host_window(uint64_t span, uint64_t prefix, uint64_t alignment,
                                  const char* purpose) {
  return host_data_ptr(allocate_host_block(span, alignment, purpose), prefix);
}

namespace {
// Host memory a device runtime hands out may be faulted in lazily, 4 KiB at a time, on its first
// touch by a read (a unified-memory platform's "pinned" memory, the simulated device's); 2 MiB
// pages cost a fraction of that (a warm read-bound pass of 0.5 GB on the simulated device: 0.166 ->
// 0.111 CPU seconds). Memory the runtime already locked is resident: the advice changes nothing
// there. Only the whole 2 MiB pages inside the block are advised; a refusal is only a missed
// optimization.
void advise_huge_pages(void* data, uint64_t nbytes) noexcept {
  auto begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) / kHugePage * kHugePage;
  auto end = (reinterpret_cast<uintptr_t>(data) + nbytes) / kHugePage * kHugePage;
  if (end > begin) {
    (void)io::advise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE,
                     "pinned staging's huge pages");
  }
}
}  // namespace

c10::DataPtr allocate_pinned(uint64_t nbytes, uint64_t alignment, c10::DeviceType device_type) {
  // The caching host allocator rounds each request up to a power of two: ask for exactly the
  // (power-of-two) size, whose blocks come page-aligned, and pad only if one does not.
  at::HostAllocator* allocator = at::getHostAllocator(device_type);
  c10::DataPtr block = allocator->allocate(nbytes);
  advise_huge_pages(block.get(), nbytes);
  auto base = reinterpret_cast<uintptr_t>(block.get());
  if (base % alignment == 0) return block;
  block = allocator->allocate(nbytes + alignment);
  advise_huge_pages(block.get(), nbytes + alignment);
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
