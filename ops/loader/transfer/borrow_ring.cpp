#include "loader/transfer/borrow_ring.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "io/direct_io.h"
#include "io/memory_advice.h"
#include "loader/transfer/storage_views.h"
#include "pool/host_buffer.h"

namespace instanttensor::loader {

namespace {
// The region's own reference is one; anything more is a consumer still holding the tensor (a
// view, a list entry, an export). And the storage is still the ring's: its DataPtr is the one
// borrow() made (no context, nothing to delete, inside the block). One that share_memory_, set_
// or pickling repointed is torch's then: never copied out or repointed again.
bool held_by_consumer(const c10::intrusive_ptr<c10::StorageImpl>& storage,
                      const c10::DataPtr& block, uint64_t capacity) {
  if (storage.use_count() <= 1) return false;
  const c10::StorageImpl& impl = *storage;  // const: never materializes copy-on-write
  const c10::DataPtr& now = impl.data_ptr();
  const auto* data = static_cast<const uint8_t*>(now.get());
  const auto* start = static_cast<const uint8_t*>(block.get());
  return now.get_context() == nullptr && now.get_deleter() == &c10::detail::deleteNothing &&
         data >= start && data <= start + capacity;
}
}  // namespace

BorrowRing::BorrowRing(const LoaderStreams& streams, Memory memory, uint64_t capacity,
                       uint64_t alignment, const char* purpose, uint64_t min_capacity)
    : streams_(streams),
      memory_(memory),
      capacity_(capacity),
      requested_(capacity),
      min_capacity_(min_capacity == 0 ? capacity : std::min(min_capacity, capacity)),
      alignment_(alignment),
      purpose_(purpose) {}

BorrowRing::~BorrowRing() {
  try {
    release_all();
  } catch (...) {
    // Only a failed allocation while copying out a retained tensor lands here; the loader's
    // close() reports it, a destructor has no one to report to.
  }
}

void BorrowRing::allocate_staging() {
  capacity_ = requested_;
  for (uint64_t size = requested_;;) {
    try {
      // Pinned, so host-to-device copies run on the copy engine without a driver bounce buffer.
      block_ = pool::allocate_pinned(size, alignment_, streams_.device().type());
      capacity_ = size;
      pinned_ = true;
      break;
    } catch (const std::exception& refused) {
      // A locked-memory limit, a refused registration, a platform without pinning.
      if (pinning_refused_.empty()) {
        const auto* torch_error = dynamic_cast<const c10::Error*>(&refused);
        pinning_refused_ = torch_error ? torch_error->what_without_backtrace() : refused.what();
        if (pinning_refused_.empty()) pinning_refused_ = "refused";
      }
      if (size <= min_capacity_) break;
      // Halved (a limit is usually far from the ask), never below two of the caller's regions.
      size = std::max(min_capacity_, size / 2 / alignment_ * alignment_);
    }
  }
  if (pinned_ && capacity_ < requested_) {
    memory_description_ = "pinned, smaller (" + std::to_string(capacity_) + " of " +
                          std::to_string(requested_) + " bytes; pinning " +
                          std::to_string(requested_) + " refused: " + pinning_refused_ + ")";
    TORCH_WARN_ONCE("instanttensor: pinning ", requested_, " bytes of staging was refused (",
                    pinning_refused_, "); staging through a smaller pinned ring of ", capacity_,
                    " bytes");
  } else if (!pinned_) {
    // Pageable staging still moves every byte (the runtime copies from it synchronously,
    // through its own bounce buffer), only slower.
    block_ = pool::allocate_host_window(capacity_, 0, alignment_, purpose_);
    memory_description_ = "pageable (pinning refused: " + pinning_refused_ + ")";
    TORCH_WARN_ONCE("instanttensor: pinning ", requested_, " bytes of staging was refused (",
                    pinning_refused_, "); staging through pageable memory, copies slower");
  } else {
    memory_description_ = "pinned";
  }
}

void BorrowRing::ensure_memory() {
  if (allocator_) return;
  pinning_refused_.clear();
  pinned_ = false;
  switch (memory_) {
    case Memory::Host:
      // Not pre-faulted: with MADV_HUGEPAGE the first read into each 2 MiB page faults it in
      // more cheaply than a separate memset pass (measured: 0.082 s -> 0.057 s, 265 MB).
      block_ = pool::allocate_host_window(capacity_, 0, alignment_, purpose_);
      break;
    case Memory::Pinned:
      allocate_staging();
      break;
    case Memory::Device: {
      c10::DeviceGuard guard(streams_.device());
      block_ = c10::GetAllocator(streams_.device().type())->allocate(capacity_);
      break;
    }
  }
  allocator_ = std::make_unique<pool::RingAllocator>(capacity_, alignment_);
  allocator_->set_limit(limit_);
  allocated_bytes_ = capacity_;
  switch (memory_) {
    case Memory::Host:
      memory_description_ = "host";
      break;
    case Memory::Pinned:
      break;  // said by allocate_staging
    case Memory::Device:
      memory_description_ = "device";
      break;
  }
}

void BorrowRing::raise_limit(uint64_t limit) {
  limit_ = limit_ == UINT64_MAX ? limit : std::max(limit_, limit);
  if (allocator_) allocator_->set_limit(std::max(allocator_->limit(), limit_));
}

uint64_t BorrowRing::limit() const {
  return allocator_ ? allocator_->limit() : std::min(limit_, capacity_);
}

BorrowRing::Region* BorrowRing::place(uint64_t span, uint64_t phase) {
  ensure_memory();
  auto at = allocator_->allocate(span, phase);
  if (!at) return nullptr;
  Region region;
  region.span = span;
  region.data = static_cast<uint8_t*>(block_.get()) + *at;
  regions_.push_back(std::move(region));
  in_use_ += span;
  return &regions_.back();
}

c10::StorageImpl* BorrowRing::borrow(Region& region, uint8_t* data, uint64_t nbytes) {
  auto storage = make_storage(c10::DataPtr(data, block_.device()), nbytes);
  region.storages.push_back(storage);
  return storage.get();
}

void BorrowRing::mark_released(Region& region) const {
  if (memory_ == Memory::Device) region.released = CopyFence::after(streams_.consumer());
  region.release_marked = true;
}

void BorrowRing::materialize(c10::StorageImpl& storage) const {
  uint64_t nbytes = storage.nbytes();
  if (memory_ != Memory::Device) {
    c10::DataPtr fresh = pool::allocate_host(nbytes, false, "a retained borrowed tensor");
    std::memcpy(fresh.get(), storage.data(), nbytes);
    storage.set_data_ptr_noswap(std::move(fresh));
    return;
  }
  // Fresh device memory, filled on the loader's stream after the release point, then the
  // storage repointed; the consumer's stream waits for the copy before it touches the tensor.
  c10::Device device = streams_.device();
  c10::DeviceGuard guard(device);
  c10::DataPtr fresh = c10::GetAllocator(device.type())->allocate(nbytes);
  if (nbytes > 0) {
    c10::StreamGuard on_loader(streams_.loader());
    byte_view(static_cast<uint8_t*>(fresh.get()), nbytes, device)
        .copy_(byte_view(static_cast<uint8_t*>(storage.mutable_data()), nbytes, device),
               /*non_blocking=*/true);
  }
  CopyFence::after(streams_.loader()).block(streams_.consumer(), "materialize");
  storage.set_data_ptr_noswap(std::move(fresh));
}

uint64_t BorrowRing::release_oldest() {
  Region& oldest = regions_.front();
  oldest.readers_done.wait("staging_reuse");  // a device copy may still be reading these bytes
  // Reclaimed before the consumer moved past it (forced, or an abandoned pass): everything the
  // consumer has queued so far is the release point.
  if (!oldest.release_marked) mark_released(oldest);
  oldest.released.block(streams_.loader(), "release");
  if (memory_ == Memory::Device) {
    // A tensor still held may have been read on the consumer's stream after the release point
    // (work queued on a kept tensor after the step that passed it): its copy-out and the reuse
    // wait for everything the consumer has queued by now. Found by the simulated device.
    for (auto& storage : oldest.storages) {
      // Any reference, ours or repointed: its queued reads may still be on the way.
      if (storage.use_count() > 1) {
        CopyFence::after(streams_.consumer()).block(streams_.loader(), "retained_reads");
        break;
      }
    }
  }
  uint64_t copied = 0;
  for (auto& storage : oldest.storages) {
    // Give a tensor still held memory of its own before the ring reuses this.
    if (held_by_consumer(storage, block_, capacity_)) {
      materialize(*storage);
      copied += 1;
    }
  }
  in_use_ -= oldest.span;
  regions_.pop_front();
  allocator_->release_oldest();
  return copied;
}

void BorrowRing::hand_over_retained() {
  std::vector<c10::StorageImpl*> retained;
  for (auto& region : regions_) {
    for (auto& storage : region.storages) {
      if (held_by_consumer(storage, block_, capacity_) && storage->nbytes() > 0)
        retained.push_back(storage.get());
    }
  }
  if (retained.empty()) return;
  auto owner = std::make_shared<c10::DataPtr>(std::move(block_));
  for (c10::StorageImpl* storage : retained) {
    storage->set_data_ptr_noswap(data_kept_by(storage->mutable_data(), owner));
  }
  for (auto& region : regions_) region.storages.clear();  // nothing left to copy out
  // Give the pages no retained tensor touches back to the system now; the address range goes
  // when the last retained tensor does.
  const auto page = static_cast<uintptr_t>(io::page_size());
  std::sort(retained.begin(), retained.end(),
            [](auto* a, auto* b) { return a->data() < b->data(); });
  auto base = reinterpret_cast<uintptr_t>(owner->get());
  uintptr_t free_from = (base + page - 1) / page * page;
  auto give_back_until = [&](uintptr_t end) {
    // Refused (locked memory: pinned staging), the pages stay until the last retained tensor
    // goes: counted, the tensors are right either way.
    if (end > free_from) {
      (void)io::advise(reinterpret_cast<void*>(free_from), end - free_from, MADV_DONTNEED,
                       "a borrow ring's pages no retained tensor uses");
    }
  };
  for (c10::StorageImpl* storage : retained) {
    auto begin = reinterpret_cast<uintptr_t>(storage->data());
    give_back_until(begin / page * page);
    free_from = std::max(free_from, (begin + storage->nbytes() + page - 1) / page * page);
  }
  give_back_until((base + capacity_) / page * page);
}

uint64_t BorrowRing::release_all() {
  uint64_t copied = 0;
  // Host memory: tensors the consumer still holds keep their bytes where they are (copying a
  // loop variable's 250 MB tensor into fresh memory took 0.7 s at close).
  if (memory_ == Memory::Host && block_.get() != nullptr) hand_over_retained();
  if (memory_ == Memory::Device && !regions_.empty()) {
    // Closing: the consumer has queued all its work on the ring's tensors by now.
    CopyFence::after(streams_.consumer()).block(streams_.loader(), "close");
  }
  while (!regions_.empty()) copied += release_oldest();
  if (block_.get() != nullptr && memory_ == Memory::Device) {
    // The block goes back to the caching allocator, which orders reuse on the stream it was
    // allocated on; copies out of it ran on the loader's stream.
    streams_.record_on_loader(block_);
  }
  bool was_pinned = block_.get() != nullptr && pinned_;
  block_.clear();
  allocator_.reset();
  // The host allocator would keep the block cached for the life of the process.
  if (was_pinned) pool::release_cached_pinned(streams_.device().type());
  return copied;
}

}  // namespace instanttensor::loader
