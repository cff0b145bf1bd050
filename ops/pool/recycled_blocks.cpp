#include "pool/recycled_blocks.h"

namespace instanttensor::pool {

namespace {
constexpr uint64_t kSmallestKept = 2ull << 20;
}  // namespace

// What a handed-out block's DataPtr carries to find its way back.
struct RecycledBlocks::Lease {
  HostBlock block;
  std::shared_ptr<RecycledBlocks> home;
};

RecycledBlocks::~RecycledBlocks() { close(); }

c10::DataPtr RecycledBlocks::allocate_window(uint64_t span, uint64_t prefix, uint64_t alignment,
                                             const char* purpose) {
  if (span < kSmallestKept) return allocate_host_window(span, prefix, alignment, purpose);
  // First, so that nothing can throw once a block is taken.
  auto lease = std::make_unique<Lease>(Lease{HostBlock{}, shared_from_this()});
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The smallest kept block that fits, unless it is more than a quarter larger than a fresh
    // block would be (fresh ones are rounded up to 2 MiB).
    const uint64_t fresh_bytes = (span + kSmallestKept - 1) / kSmallestKept * kSmallestKept;
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->bytes >= span && it->bytes <= fresh_bytes + fresh_bytes / 4 &&
          reinterpret_cast<uintptr_t>(it->ptr) % alignment == 0 &&
          (best == kept_.end() || it->bytes < best->bytes)) {
        best = it;
      }
    }
    if (best != kept_.end()) {
      lease->block = *best;
      kept_bytes_ -= best->bytes;
      kept_.erase(best);
      reuses_ += 1;
    }
  }
  if (lease->block.ptr == nullptr) lease->block = allocate_host_block(span, alignment, purpose);
  void* data = static_cast<char*>(lease->block.ptr) + prefix;
  return c10::DataPtr(data, lease.release(), &RecycledBlocks::give_back,
                      c10::Device(c10::DeviceType::CPU));
}

void RecycledBlocks::give_back(void* context) noexcept {
  std::unique_ptr<Lease> lease(static_cast<Lease*>(context));
  lease->home->keep_or_free(lease->block);
}

void RecycledBlocks::keep_or_free(const HostBlock& block) noexcept {
  std::list<HostBlock> surplus;
  bool kept = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_ && block.bytes <= capacity_) {
      try {
        kept_.push_back(block);
        kept_bytes_ += block.bytes;
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
  for (const HostBlock& old : surplus) free_host_block(old);
}

void RecycledBlocks::close() noexcept {
  std::list<HostBlock> kept;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    kept.swap(kept_);
    kept_bytes_ = 0;
  }
  for (const HostBlock& block : kept) free_host_block(block);
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
