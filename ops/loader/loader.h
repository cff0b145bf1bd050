// The pipeline behind SafeOpen: plan -> reads -> (transfer stage) -> (exchange) -> tensors.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "instanttensor/instanttensor.h"
#include "io/memory_advice.h"
#include "loader/fork_safety.h"
#include "loader/options.h"
#include "loader/pass/pass_state.h"
#include "plan/load_mode.h"

// The parts the loader holds by pointer: declared here, defined in their own headers.
namespace instanttensor::io {
class IoSetup;
class MappedFiles;
}  // namespace instanttensor::io
namespace instanttensor::loader {
class ExchangeProtocol;
class Pass;
class RandomAccess;
class ReadScheduler;
class TensorMemory;
class Walk;
}  // namespace instanttensor::loader

namespace instanttensor {

// Opens a checkpoint, chooses its load mode (plan/load_mode.h) once and composes the parts for
// it: a Pass (loader/pass/pass.h: reading into loader memory, views of the page cache, or views
// of the file mapping) and a Walk (loader/walk/walk.h: alone, ranks in step, ranks exchanging
// bytes) that drives it; random access (RandomAccess) and load_into share the read scheduler
// with the pass, with their own read tags. The Loader itself keeps the lock, the fork rules, the
// queries and close.
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
  std::vector<TimelineEvent> timeline() const;
  std::vector<std::string> warnings() const;
  uint64_t total_tensor_size() const { return plan_.reads.total_bytes; }
  uint64_t buffer_size() const { return plan_.memory.buffer_size; }
  bool copy() const { return options_.copy; }
  void close();

 private:
  static constexpr const char* kIterationInChild =
      "iterating a checkpoint with borrowed buffers, a process group or an accelerator target";

  // Opening (loader_open.cpp), in this order.
  std::vector<size_t> selected_indices() const;
  // The read backend for the options' chain (cold files under `auto`: buffered until
  // settle_read_method).
  void open_io();
  // chunk_size as asked, or the default, before any rounding.
  uint64_t requested_chunk() const;
  // A staged pass's most bytes per read through staging (before the ring caps it), for the
  // selection's `tensor_bytes`: chunk_size, or for warm reads of a process alone a slice fitted
  // to the CPU's last-level cache (loader_read_size.cpp). After the mode, the read method and
  // the chunk size.
  uint64_t staged_read_bytes(const std::vector<uint64_t>& tensor_bytes) const;
  // The read workers for `selected_bytes` (plan::choose_read_threads from the options, the read
  // method and the cores): what start_reads starts and what staged_read_bytes plans for.
  int read_threads(uint64_t selected_bytes) const;
  // How long an idle read worker of `threads` spins before it sleeps
  // (plan::choose_worker_spin_us), `local_ranks` ranks of this host reading beside this one.
  uint32_t worker_spin_us(int threads, int local_ranks) const;
  // Reads each worker keeps in flight: io_depth as asked, or the default.
  int io_depth() const;
  // Processes that may load beside this one on this host, as far as the open knows before any
  // handshake: a launcher's count (torchrun, MPI), or the group's size where a group was given
  // (its ranks may share this host). Both the staged read size and the workers' spin follow it.
  int processes_on_host() const;
  // Where the ranks meet, decided once: the load mode; with a usable group, after the
  // handshake (returned), which says where the ranks run and agrees on the device budget.
  std::unique_ptr<loader::ExchangeProtocol> choose_mode(
      const std::vector<size_t>& selected, std::shared_ptr<const io::MappedFiles>& mapping);
  // After the mode: the read method for cold files under `auto` (timed unless the iteration
  // reads through the page cache), then the alignments and the chunk size that follow.
  void settle_read_method();
  // Host views: maps the files for them now, before the memory plan; a file that cannot be
  // mapped chooses the mode again without them (the read path, planned as such), with a note.
  std::shared_ptr<const io::MappedFiles> map_files_for_views(plan::LoadModeInputs in);
  std::unique_ptr<loader::ExchangeProtocol> open_exchange(const std::vector<size_t>& selected);
  // The memory plan (for `world` ranks sharing each unit) and the read plan.
  void size_and_plan(std::vector<size_t> selected, int world);
  // `local_ranks`: ranks of this host that read alone beside this one (stats say so).
  void start_reads(int local_ranks);
  // The pass for the mode (over `mapping` for host views), then the walk that drives it.
  void compose_parts(std::unique_ptr<loader::ExchangeProtocol> exchange,
                     std::shared_ptr<const io::MappedFiles> mapping);
  // The pass of a load that exchanges nothing. `alone_on_host`: no other rank of the group
  // reads this host's page cache (the handshake found none; without a handshake, a group of
  // one, or no group and no launcher stating other processes on this host).
  std::unique_ptr<loader::Pass> make_pass(std::shared_ptr<const io::MappedFiles> mapping,
                                          bool alone_on_host);

  // Throws when closed; in a forked child, leaves the parent's work behind first (once).
  void ensure_open();
  void leave_parent_work_behind();
  // In a forked child, throws the ProcessOwner refusal for `what` when this loader's target,
  // rings or group cannot work there.
  void refuse_in_child(const std::string& what, bool iteration) const;
  const format::IndexedTensor& selected_tensor(const std::string& name) const;
  // options.debug: one line of this loader's figures on stderr, at close.
  void print_debug_line() const;

  loader::ForkSafeMutex mutex_;
  loader::ProcessOwner process_;
  loader::ResolvedOptions options_;
  loader::PassPlan plan_;  // the checkpoint, the load mode and the plans, fixed at open
  std::unique_ptr<io::IoSetup> io_;
  Stats stats_;  // before reads_, which books into it until destroyed
  // The process's madvise refusals when this loader opened (stats() counts those since, until
  // close() fixes the count).
  const uint64_t advice_refusals_at_open_ = io::advice_refusals();
  std::vector<std::string> warnings_;
  std::unique_ptr<loader::ReadScheduler> reads_;
  std::unique_ptr<loader::TensorMemory> memory_;
  std::unique_ptr<loader::RandomAccess> random_;
  std::unique_ptr<loader::Pass> pass_;
  std::unique_ptr<loader::Walk> walk_;  // destroyed first: its gathers land in the pass's memory
  bool closed_ = false;
};

}  // namespace instanttensor
