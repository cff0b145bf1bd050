// Host blocks that owned tensors gave back, kept for the loader's next owned tensors.
#pragma once

#include <c10/core/Allocator.h>

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

#include "pool/host_buffer.h"

namespace instanttensor::pool {

// While a loader is open, the memory of an owned (copy=True) tensor that its consumer drops is
// kept here, up to `capacity` bytes, and the next owned tensor of a similar size is read into it
// instead of into fresh memory: the first touch of fresh pages costs more than the read that
// fills them (REFERENCE.md section 5), and a model loader copies each tensor into its parameter
// and drops it. Only blocks of 2 MiB and more are kept (malloc recycles smaller ones itself).
// When full, the blocks given back longest ago are freed. A kept block holds stale bytes of an
// earlier tensor; the caller overwrites every byte of the tensor it carves from it before handing
// the tensor out. Thread-safe: blocks come back from whichever thread drops the last reference.
class RecycledBlocks : public std::enable_shared_from_this<RecycledBlocks> {
 public:
  // Create through make_shared: every block handed out keeps the keeper alive.
  explicit RecycledBlocks(uint64_t capacity) : capacity_(capacity) {}
  ~RecycledBlocks();
  RecycledBlocks(const RecycledBlocks&) = delete;
  RecycledBlocks& operator=(const RecycledBlocks&) = delete;

  // As allocate_host_window (`span` bytes aligned to at least `alignment`, data pointer `prefix`
  // bytes in), from a kept block when one of at least `span` and at most a quarter more than
  // a fresh block (`span` rounded up to 2 MiB) is here; the DataPtr returns the block here when
  // dropped (or frees it, once closed or full). Throws Error(Io) naming `purpose` when memory is
  // exhausted. Any thread.
  c10::DataPtr allocate_window(uint64_t span, uint64_t prefix, uint64_t alignment,
                               const char* purpose);

  // Frees every kept block; blocks dropped later are freed at once. Any thread; idempotent.
  void close() noexcept;

  // Bytes kept now, and how many allocations a kept block served (tests, stats).
  uint64_t kept_bytes() const;
  uint64_t reuses() const;

 private:
  struct Lease;
  static void give_back(void* lease) noexcept;
  void keep_or_free(const HostBlock& block) noexcept;

  const uint64_t capacity_;
  mutable std::mutex mutex_;
  std::list<HostBlock> kept_;  // oldest first; a few dozen at most (capacity / 2 MiB)
  uint64_t kept_bytes_ = 0;
  uint64_t reuses_ = 0;
  bool closed_ = false;
};

}  // namespace instanttensor::pool
