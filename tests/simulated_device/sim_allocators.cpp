#include "sim_allocators.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "sim_runtime.h"

namespace simdev {
namespace {

// One device allocation: the streams that used it (the current one at allocation, and those
// recorded); freeing waits for all of them to pass, then scribbles over the bytes, so a copy
// ordered wrongly after the free reads garbage instead of the old bytes.
struct DeviceBlock {
  void* host = nullptr;
  uint64_t size = 0;
  c10::DeviceIndex device = 0;
  std::mutex mutex;
  std::vector<c10::Stream> streams;
};

// The host ranges of live device blocks, so a queued operation can tell that its device
// memory was freed before it ran (a free ordered on the wrong stream): it then counts a stale
// access and leaves the bytes alone, where a real device would have written into memory the
// allocator may already have handed to someone else.
// Each block has a generation, so a copy queued into a freed block whose address the next
// allocation reuses is still found stale.
struct LiveBlock {
  uint64_t size = 0;
  uint64_t generation = 0;
};
std::mutex live_mutex;
std::map<uintptr_t, LiveBlock> live_blocks;
uint64_t next_generation = 0;
std::atomic<uint64_t> stale_access_count{0};

void add_live(const DeviceBlock* block) {
  std::lock_guard<std::mutex> lock(live_mutex);
  live_blocks[reinterpret_cast<uintptr_t>(block->host)] = LiveBlock{block->size, ++next_generation};
}

// The live block holding [host, host + nbytes), or null. Under live_mutex.
const LiveBlock* live_block_of(const void* host, size_t nbytes) {
  auto begin = reinterpret_cast<uintptr_t>(host);
  auto after = live_blocks.upper_bound(begin);
  if (after == live_blocks.begin()) return nullptr;
  auto block = std::prev(after);
  return begin + nbytes <= block->first + block->second.size ? &block->second : nullptr;
}

void remove_live(const DeviceBlock* block) {
  std::lock_guard<std::mutex> lock(live_mutex);
  live_blocks.erase(reinterpret_cast<uintptr_t>(block->host));
}

void release(DeviceBlock* block) {
  remove_live(block);
  if (move_bytes()) std::memset(block->host, 0xA5, block->size);
  std::free(block->host);
  add_device_bytes(block->device, -static_cast<int64_t>(block->size));
  delete block;
}

void free_device_block(void* context) {
  auto* block = static_cast<DeviceBlock*>(context);
  std::vector<c10::Stream> users;
  {
    std::lock_guard<std::mutex> lock(block->mutex);
    users = block->streams;
  }
  // The last of the streams to pass its marker releases the block.
  auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(users.size()));
  for (const auto& user : users) {
    stream_of(user).enqueue([block, remaining] {
      if (remaining->fetch_sub(1) == 1) release(block);
    });
  }
}

// A c10::DeviceAllocator, as CUDA's caching allocator is, so the engine's generic questions (the
// free memory its default device budget takes a share of) reach it the same way.
struct DeviceAllocator final : public c10::DeviceAllocator {
  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr& data, c10::Stream stream) override {
    record_block_use(data, stream);
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override { return {}; }
  void resetAccumulatedStats(c10::DeviceIndex) override {}
  void resetPeakStats(c10::DeviceIndex) override {}
  // What torch.simdev.mem_get_info says: the capacity less the bytes in use.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    uint64_t used = std::min(device_bytes_in_use(device), kDeviceCapacity);
    return {static_cast<size_t>(kDeviceCapacity - used), static_cast<size_t>(kDeviceCapacity)};
  }

  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    auto* block = new DeviceBlock();
    block->size = std::max<uint64_t>(nbytes, 1);
    block->host = std::aligned_alloc(512, (block->size + 511) / 512 * 512);
    TORCH_CHECK(block->host != nullptr, "simdev: out of memory allocating ", nbytes, " bytes");
    // Fresh device memory is never zero by luck.
    if (move_bytes()) std::memset(block->host, 0x5A, block->size);
    block->device = device;
    block->streams.push_back(current_stream(device));
    add_live(block);
    add_device_bytes(device, static_cast<int64_t>(block->size));
    return c10::DataPtr(real(block->host), block, &free_device_block,
                        c10::Device(c10::DeviceType::PrivateUse1, device));
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    // Host-side copies of device memory (torch's clone of a storage) go through a stream.
    auto& s = stream_of(current_stream(current_device()));
    s.wait_for(s.enqueue([=] { std::memcpy(real(dest), real(src), count); }));
  }
};

void free_pinned(void* base) {
  remove_pinned_block(base);
  std::free(base);
}

struct PinnedAllocator final : public at::HostAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    // Page-aligned, rounded to a power of two as torch's caching host allocators do.
    size_t size = 4096;
    while (size < nbytes) size <<= 1;
    int64_t limit = pinned_limit();
    TORCH_CHECK(limit < 0 || pinned_bytes_in_use() + size <= static_cast<uint64_t>(limit),
                "simdev: pinning ", nbytes, " bytes refused (locked-memory limit of ", limit,
                " bytes)");
    void* base = std::aligned_alloc(4096, size);
    TORCH_CHECK(base != nullptr, "simdev: out of pinned memory allocating ", nbytes, " bytes");
    add_pinned_block(base, size);
    return c10::DataPtr(base, base, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return at::HostStats(); }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}
};

DeviceAllocator device_allocator;
PinnedAllocator pinned_allocator;

}  // namespace

void record_block_use(const c10::DataPtr& data, const c10::Stream& stream) {
  if (data.get_deleter() != &free_device_block) return;  // not ours (a view's borrowed pointer)
  auto* block = static_cast<DeviceBlock*>(data.get_context());
  std::lock_guard<std::mutex> lock(block->mutex);
  for (const auto& user : block->streams) {
    if (user == stream) return;
  }
  block->streams.push_back(stream);
}

c10::Allocator* device_allocator_instance() { return &device_allocator; }

DeviceRange device_range(const void* host, size_t nbytes) {
  std::lock_guard<std::mutex> lock(live_mutex);
  const LiveBlock* block = live_block_of(host, nbytes);
  return DeviceRange{host, nbytes, block ? block->generation : 0};
}

bool touch_live(const DeviceRange& a, const DeviceRange& b, const std::function<void()>& touch) {
  std::lock_guard<std::mutex> lock(live_mutex);
  for (const DeviceRange* range : {&a, &b}) {
    if (range->host == nullptr) continue;
    const LiveBlock* block = live_block_of(range->host, range->nbytes);
    if (block == nullptr || block->generation != range->generation) {
      stale_access_count.fetch_add(1);
      return false;
    }
  }
  touch();
  return true;
}

uint64_t stale_accesses() { return stale_access_count.load(); }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &device_allocator);
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &pinned_allocator)

}  // namespace simdev
