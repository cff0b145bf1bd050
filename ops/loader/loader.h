// The pipeline behind SafeOpen: plan -> reads -> (transfer stage) -> (exchange) -> tensors.
#pragma once

#include <c10/core/StorageImpl.h>

#include <deque>
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
#include "loader/fork_safety.h"
#include "loader/memory_plan.h"
#include "loader/options.h"
#include "loader/rank_exchange.h"
#include "loader/read_scheduler.h"
#include "plan/read_plan.h"
#include "pool/recycled_blocks.h"

namespace instanttensor {

// Composes the pieces of ops/loader: ReadScheduler (reads), BorrowRing (borrowed host memory),
// DeviceStage (staging -> device), RankExchange (collectives). Each read group of the plan goes
// through: place (its destination: owned memory or a ring region) -> submit (its bytes, or this
// rank's slices of its units) -> land (reads done; copied to the device) -> exchange (status
// round + all-gather per unit) -> hand out (owned, borrowed, or an owned copy).
//
// Fork: in a forked child the parent's worker threads do not exist. The first call there leaves
// the parent's reads, pass, exchange and device state behind without waiting for them; random
// access on a CPU target then reads with workers the child starts; an iteration in progress at the
// fork, borrowed rings, the exchange's collectives and accelerator targets raise instead.
//
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
  LoadIntoResult load_into(const std::vector<std::string>& names,
                           const std::vector<at::Tensor>& destinations, bool strict);
  void restart();
  std::optional<std::pair<std::string, at::Tensor>> next();
  Stats stats() const;
  std::vector<std::string> warnings() const;
  uint64_t total_tensor_size() const { return plan_.total_bytes; }
  uint64_t buffer_size() const { return memory_.buffer_size; }
  bool copy() const { return options_.copy; }
  void close();

 private:
  // Where a group's bytes live until they are handed out.
  enum class Destination {
    HostOwned,    // one tensor, read into its own host storage (CPU copy=true; host fallback)
    HostRing,     // the host borrow ring (CPU borrow; the host exchange)
    DeviceOwned,  // one tensor, streamed into its own device storage (accelerator copy=true)
    DeviceRing,   // the device ring (accelerator borrow; the device exchange)
  };
  struct GroupState {
    Destination where = Destination::HostOwned;
    plan::AlignedRange range;  // the group's bytes, widened for O_DIRECT
    uint8_t* dest = nullptr;   // the group's first byte in its destination
    bool placed = false;
    bool landed = false;             // every byte this rank reads is in `dest`
    bool verified = false;           // landed, and its file was unchanged after the reads
    size_t units_submitted = 0;      // units whose share (of this rank) was submitted
    size_t units_landed = 0;         // units whose share is in `dest`
    size_t units_exchanged = 0;      // distributed: units through their status round and gather
    loader::CopyFence landed_fence;  // device: after the last copy into `dest`
  };
  struct ItemState {
    c10::intrusive_ptr<c10::StorageImpl> owned;  // HostOwned / DeviceOwned
    c10::StorageImpl* borrowed = nullptr;        // held by its ring region
  };
  // A share read into the staging ring, waiting for its copy to the device (FIFO).
  // This rank's share of one unit, read into the staging ring (then copied to the device) or,
  // for the host exchange, straight into its place in the group's destination.
  struct StagedShare {
    size_t group = 0;
    uint64_t tag = 0;
    uint8_t* staged = nullptr;     // the share's first byte in the staging ring
    uint64_t group_offset = 0;     // where it goes, relative to the group's first byte
    uint64_t nbytes = 0;           // 0: this rank has no bytes in the unit
    bool in_staging_ring = false;  // staged: holds staging space until copied
  };

  void size_and_plan(std::vector<size_t> selected, const OpenOptions& options);
  // Distributed: chooses where the exchange runs, and agrees with the other ranks on the
  // checkpoint, the layout and the device budget (one collective).
  void open_exchange(const std::vector<size_t>& selected, const OpenOptions& options);
  // Throws when closed; in a forked child, leaves the parent's work behind first (once).
  void ensure_open();
  void leave_parent_work_behind();
  // In a forked child, throws the ProcessOwner refusal for `what` when this loader's target,
  // rings or group cannot work there.
  void refuse_in_child(const std::string& what, bool iteration) const;
  void begin_pass();
  void drain_in_flight() noexcept;
  // Places and submits groups ahead of the consumer, as far as memory allows.
  void pump();
  Destination destination_of(size_t group) const;
  bool place_group(size_t group, bool force);
  void borrow_items(size_t group, loader::BorrowRing& ring, loader::BorrowRing::Region& region);
  bool reclaim_oldest_region(loader::BorrowRing& ring, bool force);
  void submit_group(size_t group);
  // Staged groups: submits shares into the staging ring while it has room.
  // Shares (staged or exchanged groups): submits this rank's shares of `group` while the staging
  // ring has room; true once all are submitted.
  bool submit_shares(size_t group);
  // Lands finished shares in order: copies staged ones to the device, counts units landed.
  void land_shares();
  // Waits until `units` units of `group` have landed (all of them for SIZE_MAX).
  void wait_until_landed(size_t group, size_t units = SIZE_MAX);
  bool uses_shares(const GroupState& state) const;
  // Distributed: every unit of `group` through its status round (carrying `failure`) and
  // all-gather; throws on every rank if any rank failed.
  void exchange_group(size_t group, std::optional<Error> failure);
  // Places and submits the group of `item`; waits for it to land unless `wait` is false.
  void make_ready(size_t item, bool wait);
  uint64_t layout_digest(const std::vector<size_t>& selected, const OpenOptions& options) const;
  void check_pass_reads();
  [[noreturn]] void fail_pass(Error error);
  Error read_error(const loader::ReadFailure& failure, const format::IndexedTensor& t) const;
  void release_consumed_device_regions();
  std::pair<std::string, at::Tensor> hand_out(size_t item);
  // A storage viewing [offset, offset + nbytes) of `t` in the file mapping (mapped_access_).
  c10::intrusive_ptr<c10::StorageImpl> mapped_storage(const format::IndexedTensor& t,
                                                      uint64_t offset, uint64_t nbytes) const;
  at::Tensor owned_copy(const at::Tensor& tensor) const;
  const format::IndexedTensor& tensor_of_item(size_t item) const;
  const format::IndexedTensor& first_tensor(size_t group) const;
  const std::string& file_of(const format::IndexedTensor& t) const;
  at::Tensor to_target_device(at::Tensor tensor) const;
  // `tensor` itself when its data is aligned for its element type, else an aligned copy.
  at::Tensor aligned(at::Tensor tensor);
  loader::BorrowRing& host_ring();
  const format::IndexedTensor& selected_tensor(const std::string& name) const;
  // Reads [offset, offset + nbytes) of tensor `t` into a fresh owned storage, synchronously.
  c10::intrusive_ptr<c10::StorageImpl> read_owned(const format::IndexedTensor& t, uint64_t offset,
                                                  uint64_t nbytes);
  bool exchanging() const { return exchange_ != nullptr; }
  size_t unit_count(size_t group) const {
    return memory_.layout.unit_count(plan_.groups[group].length);
  }

  loader::ForkSafeMutex mutex_;
  loader::ProcessOwner process_;
  loader::ResolvedOptions options_;
  std::unique_ptr<format::Checkpoint> checkpoint_;
  plan::ReadPlan plan_;
  loader::MemoryPlan memory_;  // ring sizes, read grouping and the unit cut
  uint64_t chunk_size_ = 0;
  std::unique_ptr<io::IoSetup> io_;
  uint64_t io_alignment_ = 1;  // O_DIRECT alignment of reads (1: buffered)
  uint64_t ring_alignment_ = 64;
  Stats stats_;  // before reads_, which books into it until destroyed
  std::vector<std::string> warnings_;
  std::unique_ptr<loader::ReadScheduler> reads_;
  bool closed_ = false;

  // Staged transfer (accelerator target, or forced): staging ring -> DeviceStage.
  bool staged_ = false;
  uint64_t staging_request_ = 0;  // staging_size asked for at open (0: the default)
  // The mmap backend with a CPU target: random access hands out views of the mapping, and so
  // does iteration with copy=false (single rank): no ring, no reads.
  bool mapped_access_ = false;
  bool mapped_iteration_ = false;
  bool host_fallback_ = false;
  uint64_t device_budget_ = UINT64_MAX;
  std::unique_ptr<loader::DeviceStage> stage_;
  std::unique_ptr<loader::LoaderStreams> host_streams_;
  std::unique_ptr<loader::BorrowRing> host_ring_;
  // Memory of owned host tensors the consumer dropped, reused for the next ones (close frees).
  std::shared_ptr<pool::RecycledBlocks> recycled_;

  // Distributed: the exchange (null when single-process or loading locally).
  std::unique_ptr<loader::RankExchange> exchange_;
  loader::ExchangePlace place_ = loader::ExchangePlace::Local;

  // The current pass.
  uint64_t pass_id_ = 0;
  bool pass_started_ = false;
  std::optional<Error> pass_error_;
  std::vector<GroupState> groups_;
  std::vector<ItemState> items_;
  size_t next_group_ = 0;                  // next group to place and submit
  size_t next_item_ = 0;                   // next item to hand out
  uint64_t ahead_bytes_ = 0;               // owned destinations allocated and not yet handed out
  size_t staging_group_ = 0;               // staged: the group whose shares are being submitted
  std::deque<StagedShare> staged_shares_;  // submitted shares, in order, until landed
  size_t shares_in_staging_ = 0;           // of those, the ones holding staging space
  uint64_t share_sequence_ = 0;            // tags of shares
  std::optional<Error> deferred_failure_;  // distributed: carried by the next status round
};

}  // namespace instanttensor
