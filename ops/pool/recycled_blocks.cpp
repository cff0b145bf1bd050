#include "pool/recycled_blocks.h"

#include "pool/host_buffer.h"

namespace instanttensor::pool {

namespace {
constexpr uint64_t kSmallestKept = 2ull << 20;
}  // namespace

// What a handed-out block's DataPtr carries to find its way back.
struct RecycledBlocks::Lease {
  void* block;
  uint64_t bytes;
  std::shared_ptr<RecycledBlocks> home;
};

RecycledBlocks::~RecycledBlocks() { close(); }

c10::DataPtr RecycledBlocks::allocate_window(uint64_t span, uint64_t prefix, uint64_t alignment,
                                             const char* purpose) {
  if (span < kSmallestKept) return allocate_host_window(span, prefix, alignment, purpose);
  // First, so that nothing can throw once a block is taken.
  auto lease = std::make_unique<Lease>(Lease{nullptr, 0, shared_from_this()});
  void* block = nullptr;
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The smallest kept block that fits, unless it is more than a quarter larger than a fresh
    // block would be (fresh ones are rounded up to 2 MiB).
    const uint64_t fresh_bytes = (span + kSmallestKept - 1) / kSmallestKept * kSmallestKept;
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->bytes >= span && it->bytes <= fresh_bytes + fresh_bytes / 4 &&
          reinterpret_cast<uintptr_t>(it->block) % alignment == 0 &&
          (best == kept_.end() || it->bytes < best->bytes)) {
        best = it;
      }
    }
    if (best != kept_.end()) {
      bytes = best->bytes;
      block = best->block;
      kept_bytes_ -= bytes;
      kept_.erase(best);
      reuses_ += 1;
    }
  }
  if (block == nullptr) {
    HostBlock fresh = allocate_host_block(span, alignment, purpose);
    block = fresh.ptr;
    bytes = fresh.bytes;
  }
  lease->block = block;
  lease->bytes = bytes;
  return c10::DataPtr(static_cast<char*>(block) + prefix, lease.release(),
                      &RecycledBlocks::give_back, c10::Device(c10::DeviceType::CPU));
}

void RecycledBlocks::give_back(void* context) noexcept {
  std::unique_ptr<Lease> lease(static_cast<Lease*>(context));
  lease->home->keep_or_free(lease->block, lease->bytes);
}

void RecycledBlocks::keep_or_free(void* block, uint64_t bytes) noexcept {
  std::list<Kept> surplus;
  bool kept = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_ && bytes <= capacity_) {
      try {
        kept_.push_back({block, bytes});
        kept_bytes_ += bytes;
        kept = true;
      } catch (...) {
        // No memory for the list node: the block is freed below.
      }
      // Full: the oldest go, so what is kept follows the sizes the consumer drops now (moving
      // list nodes allocates nothing).
      while (kept_bytes_ > capacity_) {
        kept_bytes_ -= kept_.front().bytes;
        surplus.splice(surplus.end(), kept_, kept_.begin());
      }
    }
  }
  if (!kept) free_host_block(block);
  for (const Kept& k : surplus) free_host_block(k.block);
}

void RecycledBlocks::close() noexcept {
  std::list<Kept> kept;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    kept.swap(kept_);
    kept_bytes_ = 0;
  }
  for (const Kept& k : kept) free_host_block(k.block);
}

uint64_t RecycledBlocks::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_bytes_;
}

uint64_t RecycledBlocks::reuses() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reuses_;
}

}  // namespace instanttensor::pool
