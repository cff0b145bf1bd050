// The pipeline behind SafeOpen: plan -> io -> (pool) -> tensors, copy or borrow.
#pragma once

#include <c10/core/StorageImpl.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "instanttensor/instanttensor.h"
#include "io/io_setup.h"
#include "loader/borrow_ring.h"
#include "loader/device_stage.h"
#include "loader/options.h"
#include "loader/rank_exchange.h"
#include "loader/read_scheduler.h"
#include "plan/read_plan.h"

namespace instanttensor {

// Thread contract: every public method takes `mutex_`, so calls from several threads are
// serialized; the thread inside a call is "the consumer's thread" for the rules of safe
// borrowing. Background threads live in the read backend and only write bytes into memory the
// loader reserved for them; they never touch tensor objects.
class Loader {
 public:
  Loader(std::vector<std::string> files, const OpenOptions& options);
  ~Loader();

  std::vector<std::string> keys() const;
  std::vector<std::string> offset_keys() const;
  std::optional<std::map<std::string, std::string>> metadata() const;
  TensorMetadata get_tensor_metadata(const std::string& name) const;
  at::Tensor get_tensor(const std::string& name);
  at::Tensor get_rows(const std::string& name, int64_t start, int64_t stop);
  void restart();
  std::optional<std::pair<std::string, at::Tensor>> next();
  Stats stats() const;
  uint64_t total_tensor_size() const { return plan_.total_bytes; }
  uint64_t buffer_size() const { return buffer_size_; }
  bool copy() const { return options_.copy; }
  void close();

 private:
  struct GroupState {
    plan::AlignedRange range;  // what is read: the group's bytes, widened for O_DIRECT
    uint8_t* dest = nullptr;   // where the range lands (owned block or ring)
    bool submitted = false;
    bool done = false;       // the group's bytes are in place (read here or received)
    bool exchanged = false;  // distributed: this group's exchange has run
  };
  struct ItemState {
    c10::intrusive_ptr<c10::StorageImpl> owned;  // copy=true: the tensor's own storage
    c10::StorageImpl* borrowed = nullptr;        // copy=false: held by its ring region
  };

  void ensure_open() const;
  void begin_pass();
  void drain_in_flight() noexcept;
  void pump();
  bool place_group(size_t group, bool force);
  bool reclaim_oldest_region(bool force);
  void submit_group(size_t group);
  void wait_for_group(size_t group);
  bool reads_here(size_t group) const {
    return owner_.empty() || owner_[group] == exchange_->rank();
  }
  // Distributed: brings group `g` to this rank (reading it here if this rank owns it).
  void receive_group(size_t g, std::optional<Error> failure);
  // Places, submits and (when this rank reads it) waits for the group of `item`.
  void make_ready(size_t item);
  uint64_t checkpoint_digest() const;
  // Fails the pass if a read of it failed (waiting for nothing).
  void check_pass_reads();
  [[noreturn]] void fail_pass(Error error);
  Error read_error(const loader::ReadFailure& failure, const format::IndexedTensor& t) const;
  std::pair<std::string, at::Tensor> hand_out(size_t item);
  const format::IndexedTensor& tensor_of_item(size_t item) const;
  const std::string& file_of(const format::IndexedTensor& t) const;
  at::Tensor to_target_device(at::Tensor tensor) const;
  // `tensor` itself when its data is aligned for its element type, else an aligned copy.
  at::Tensor aligned(at::Tensor tensor);
  loader::BorrowRing& host_ring();
  const format::IndexedTensor& selected_tensor(const std::string& name) const;
  // Reads [offset, offset + nbytes) of tensor `t` into a fresh owned storage, synchronously.
  c10::intrusive_ptr<c10::StorageImpl> read_owned(const format::IndexedTensor& t, uint64_t offset,
                                                  uint64_t nbytes);

  mutable std::mutex mutex_;
  loader::ResolvedOptions options_;
  std::unique_ptr<format::Checkpoint> checkpoint_;
  plan::ReadPlan plan_;
  uint64_t buffer_size_ = 0;
  // The host pipeline borrows from a ring (copy=false, or staged) or reads into owned storage.
  bool host_borrow_ = false;
  uint64_t host_ring_bytes_ = 0;
  // Staged transfer (accelerator target, or forced): host staging ring -> DeviceStage.
  bool staged_ = false;
  bool host_fallback_ = false;
  uint64_t device_budget_ = UINT64_MAX;
  std::unique_ptr<loader::DeviceStage> stage_;
  uint64_t chunk_size_ = 0;
  std::unique_ptr<io::IoSetup> io_;
  uint64_t io_alignment_ = 1;  // O_DIRECT alignment of reads (1: buffered)
  uint64_t ring_alignment_ = 64;
  std::unique_ptr<loader::ReadScheduler> reads_;
  bool closed_ = false;

  // Distributed: the exchange and the rank that reads each group (empty when single-process).
  std::unique_ptr<loader::RankExchange> exchange_;
  std::vector<int> owner_;

  // The current pass.
  uint64_t pass_id_ = 0;
  bool pass_started_ = false;
  std::optional<Error> pass_error_;
  std::vector<GroupState> groups_;
  std::vector<ItemState> items_;
  size_t next_group_ = 0;     // next group to place and submit
  size_t next_item_ = 0;      // next item to hand out
  uint64_t ahead_bytes_ = 0;  // copy=true: bytes allocated and not yet handed out

  // copy=false (or staged): the host ring the reads land in, allocated on first use.
  std::unique_ptr<loader::LoaderStreams> host_streams_;
  std::unique_ptr<loader::BorrowRing> host_ring_;

  Stats stats_;
};

}  // namespace instanttensor
