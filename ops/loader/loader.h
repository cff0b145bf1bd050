// The pipeline behind SafeOpen: plan -> reads -> (transfer stage) -> (exchange) -> tensors.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "instanttensor/instanttensor.h"
#include "loader/fork_safety.h"
#include "loader/options.h"
#include "loader/pass/pass_state.h"
#include "plan/load_mode.h"

// The parts the loader holds by pointer: declared here, defined in their own headers.
namespace instanttensor::io {
class IoSetup;
class MappedFiles;
}  // namespace instanttensor::io
namespace instanttensor::pool {
class RecycledBlocks;
}
namespace instanttensor::loader {
class BorrowRing;
class DeviceStage;
class ExchangeProtocol;
class GroupFeed;
class LoaderStreams;
class OwnedPlacement;
class PageCacheViews;
class Placement;
class RandomAccess;
class ReadScheduler;
class RingPlacement;
class StagingStream;
class StepRounds;
class TensorFactory;
}  // namespace instanttensor::loader

namespace instanttensor {

// Opens a checkpoint, chooses its load mode (plan/load_mode.h) once, composes the parts of
// ops/loader for that mode, runs the pass and answers queries. Each read group of the plan goes
// through: place (Placement: owned memory or a ring region) -> submit and land (a GroupFeed:
// the whole group, or this rank's shares through the StagingStream to a device) -> exchange
// (ExchangeProtocol) -> hand out (TensorFactory: owned, borrowed, or an owned copy). Random
// access (RandomAccess) and load_into share the read scheduler, with their own read tags.
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
  uint64_t total_tensor_size() const { return plan_.reads.total_bytes; }
  uint64_t buffer_size() const { return plan_.memory.buffer_size; }
  bool copy() const { return options_.copy; }
  void close();

 private:
  static constexpr const char* kIterationInChild =
      "iterating a checkpoint with borrowed buffers, a process group or an accelerator target";

  // Opening (loader.cpp).
  std::vector<size_t> selected_indices() const;
  // The read backend for the options' chain, and the alignments and chunk size that follow.
  void open_io();
  // chunk_size as asked, or the default, before any rounding.
  uint64_t requested_chunk() const;
  // The load mode; with a usable group, after the handshake (which says where the ranks run).
  void choose_mode(const std::vector<size_t>& selected);
  // Host views: maps the files for them now, before the memory plan; a file that cannot be
  // mapped chooses the mode again without them (the read path, planned as such), with a note.
  void map_files_for_views(loader::LoadModeInputs in);
  // Distributed: agrees with the other ranks on the checkpoint, the layout and the device
  // budget, and learns their host identities (one collective).
  void open_exchange(const std::vector<size_t>& selected);
  // Other ranks of this host read alone beside this one (stats say how many).
  bool shares_host() const;
  void size_and_plan(std::vector<size_t> selected);
  void compose_parts();
  void start_reads();
  // Throws when closed; in a forked child, leaves the parent's work behind first (once).
  void ensure_open();
  void leave_parent_work_behind();
  // In a forked child, throws the ProcessOwner refusal for `what` when this loader's target,
  // rings or group cannot work there.
  void refuse_in_child(const std::string& what, bool iteration) const;
  const format::IndexedTensor& selected_tensor(const std::string& name) const;

  // The pass (loader_pass.cpp).
  void begin_pass();
  void drain_in_flight() noexcept;
  // Orders the free of owned device destinations not handed out (all of the pass's; one) after
  // the copies queued so far on the loader's stream. Consumer thread.
  void keep_owned_until_copied() noexcept;
  void keep_until_copied(c10::StorageImpl& owned) noexcept;
  // The two steps of both: true when `owned` is device memory whose use was recorded.
  bool record_use_by_copies(c10::StorageImpl& owned) noexcept;
  void order_consumer_after_copies() noexcept;
  // Places and submits groups ahead of the consumer, as far as memory allows.
  void pump();
  // Every feed submits the reads of the groups placed so far that it serves.
  void submit_placed();
  loader::Placement& placement_for(loader::Destination where);
  bool place_group(size_t group, bool force);
  // Lands what the feeds have finished; a read failure (of a group up to `waited`) fails the
  // pass.
  void land(size_t waited);
  // Waits until `units` units of `group` have landed (all of them for SIZE_MAX).
  void wait_until_landed(size_t group, size_t units = SIZE_MAX);
  // Places and submits the group of `item`; waits for it to land unless `wait` is false.
  void make_ready(size_t item, bool wait);
  std::optional<std::pair<std::string, at::Tensor>> next_local();
  // Ranks in step (loader_in_step.cpp).
  std::optional<std::pair<std::string, at::Tensor>> next_exchanged();
  // Group `g` through its status rounds (carrying `failure`, or a deferred one) and gathers.
  void exchange_group(size_t g, std::optional<Error> failure);
  // The Error of a failed read of the first `units` units of `g` (SIZE_MAX: all), once landed.
  std::optional<Error> landing_failure(size_t g, size_t units);
  // A group that does not exchange: read alone, status rounds at StepRounds' items.
  std::optional<std::pair<std::string, at::Tensor>> next_in_step();
  void check_pass_reads();
  [[noreturn]] void fail_pass(Error error);
  std::pair<std::string, at::Tensor> hand_out(size_t item);
  // mmap with copy=false: a view of the file mapping; nothing read, no ring.
  std::pair<std::string, at::Tensor> hand_out_mapped(size_t item);
  // Host views (mode_.host_views): a view of the page cache, owned if kept past its step.
  std::pair<std::string, at::Tensor> hand_out_view(size_t item);
  // Any other exception met while making `item` ready (a device OutOfMemoryError), as the
  // Error a status round carries, naming the item's file and tensor.
  Error failure_of(const std::exception& e, size_t item) const;

  loader::ForkSafeMutex mutex_;
  loader::ProcessOwner process_;
  loader::ResolvedOptions options_;
  loader::PassPlan plan_;
  loader::LoadMode mode_;
  uint64_t device_budget_ = UINT64_MAX;  // staged: device bytes the loader may use
  std::unique_ptr<io::IoSetup> io_;
  Stats stats_;  // before reads_, which books into it until destroyed
  std::vector<std::string> warnings_;
  std::unique_ptr<loader::ReadScheduler> reads_;
  bool closed_ = false;

  // Memory of owned host tensors the consumer dropped, reused for the next ones (close frees).
  std::shared_ptr<pool::RecycledBlocks> recycled_;
  std::unique_ptr<loader::DeviceStage> stage_;  // staged: staging ring -> the target's memory
  std::unique_ptr<loader::LoaderStreams> host_streams_;
  std::unique_ptr<loader::BorrowRing> host_ring_;  // made on first use
  // The group's protocol: null unless the mode walks in step (mode_.in_step), exchanging bytes
  // or not.
  std::unique_ptr<loader::ExchangeProtocol> exchange_;
  std::unique_ptr<loader::StepRounds> step_rounds_;  // in step without an exchange

  // The parts, composed for the mode at open.
  std::unique_ptr<loader::TensorFactory> factory_;
  std::unique_ptr<loader::RandomAccess> random_;
  std::unique_ptr<loader::StagingStream> staging_;         // staged only
  std::vector<std::unique_ptr<loader::GroupFeed>> feeds_;  // every placed group's reads
  std::unique_ptr<loader::OwnedPlacement> host_owned_;
  std::unique_ptr<loader::OwnedPlacement> device_owned_;
  std::unique_ptr<loader::RingPlacement> host_ring_placement_;
  std::unique_ptr<loader::RingPlacement> device_ring_placement_;
  std::unique_ptr<loader::PageCacheViews> views_;         // host views only
  std::shared_ptr<const io::MappedFiles> views_mapping_;  // from choose_mode to compose_parts

  loader::PassState pass_;
};

}  // namespace instanttensor
