// instanttensor: load safetensors checkpoints into libtorch tensors at the speed of the storage.
//
//   instanttensor::SafeOpen f({"model-00001.safetensors", "model-00002.safetensors"});
//   for (auto& [name, tensor] : f) { ... }          // storage order, pipelined reads
//   at::Tensor w = f.get_tensor("lm_head.weight");  // random access
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <utility>
#include <vector>

#include "instanttensor/error.h"

namespace instanttensor {

// Explicit options; an unset field falls back to its INSTANTTENSOR_* environment variable (read
// once, when the checkpoint is opened), then to the default stated here.
struct OpenOptions {
  // Where tensors land. Default: the CPU. An accelerator without an index means its current
  // device, resolved at open.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  // true (default): every tensor owns exactly its bytes. false: tensors borrow ring memory
  // (safe borrowing: see SafeOpen).
  bool copy = true;
  // Only these tensors are planned and read; unknown names are Error(Key). Default: all.
  std::optional<std::vector<std::string>> keys;
  // copy=false or a process group: bytes of the borrow ring (on the device for accelerators;
  // must hold the largest selected tensor). Default: 2 x (largest tensor + alignment) + 256 MiB,
  // at most what the selection needs, within device_budget. copy=true: bytes read ahead of the
  // consumer. Default: 256 MiB, or the selected bytes if fewer. INSTANTTENSOR_BUFFER_SIZE.
  std::optional<int64_t> buffer_size;
  // Bytes per read request. Default: 8 MiB (rounded up to the O_DIRECT alignment); warm reads
  // into a staging ring by a process alone: 2-8 MiB, so the ring in use fits half the CPU's
  // last-level cache (Stats::read_bytes says which).
  std::optional<int64_t> chunk_size;
  // Read worker threads. Default: 4, at most the core count for buffered reads and mapping
  // copies of files mostly in the page cache; 0 (reads on the calling thread) for selections of
  // 8 MiB or less unless a group exchanges them.
  std::optional<int64_t> concurrency;
  // Reads in flight on io_uring (the pread pool keeps one per worker). Default: 32.
  std::optional<int64_t> io_depth;
  // Comma list, preferred first, any case: auto, pread, buffered, direct, uring, uring_buffered,
  // mmap, or upstream's AIO, AIO_BUFFERED, URING, URING_BUFFERED, MMAP, CUFILE, BUFFERED.
  // Default: auto (buffered when half of the files is cached or a host target iterates views of
  // the page cache; else O_DIRECT if it times 1.25x faster on 32 MiB, untimed under 256 MiB;
  // never mmap).
  std::optional<std::string> backend;
  // Distributed loading. Default: none. With a group of more than one rank that has a backend
  // for the target's device type (gloo for CPU targets, NCCL or gloo for accelerators),
  // iteration hands every rank every tensor and the ranks exchange bytes as `exchange` says
  // (exchanging, each rank reads about 1/world of them); without such a backend every rank
  // reads everything on its own (a warning). All ranks must open the same files
  // and selection with the same layout options (checked up front) and iterate in step.
  c10::intrusive_ptr<c10d::ProcessGroup> process_group;
  // Whether a group exchanges bytes: "auto" (default), "always" or "never", any case;
  // INSTANTTENSOR_EXCHANGE. auto: device targets exchange (each rank reads 1/world, the group's
  // device backend moves the rest); host targets do not: each rank reads what it needs itself,
  // as one process would (warm, from the page cache the ranks of a host share). Either way
  // the group checks at open that every rank loads the same thing, and a failure on one rank
  // raises on every rank. Every rank must pass the same value. stats().exchange says what was
  // chosen.
  std::optional<std::string> exchange;
  // Staged transfer (always used for accelerator targets): reads land in a host staging ring of
  // staging_size bytes (pinned for accelerators; default: 64 MiB, at least 32 KiB; 0 or less
  // is Error(Argument)) and are
  // copied to the device on the loader's stream. force_staging (default false) takes that path
  // for a CPU target too, so the whole transfer stage runs (and is tested) without an
  // accelerator.
  bool force_staging = false;
  std::optional<int64_t> staging_size;
  // Bytes of device memory the loader may use (negative: Error(Argument)). Default:
  // max_free_mem_usage of the memory the device's allocator reports free at open
  // (c10::DeviceAllocator::getMemoryInfo); unlimited when the allocator cannot say. copy=false:
  // buffer_size must fit; a tensor larger than the budget is Error(Argument) naming it, before
  // anything is allocated, or with host_fallback (default false) a CPU tensor.
  std::optional<int64_t> device_budget;
  // The share of free device memory the default device_budget takes, in (0, 1] (else
  // Error(Argument)). Default: INSTANTTENSOR_MAX_FREE_MEM_USAGE, else 0.5.
  std::optional<double> max_free_mem_usage;
  bool host_fallback = false;
  // What opening warns about (a process group that cannot exchange for this target, so every
  // rank reads everything) is kept in SafeOpen::warnings(); with print_warnings (default true)
  // it also goes to c10's warning handler once per process (stderr in a C++ program). The
  // Python layer turns warnings() into Python warnings instead.
  bool print_warnings = true;
};

struct TensorMetadata {
  c10::ScalarType dtype;
  std::vector<int64_t> shape;  // torch shape (F4: last dimension halved)
};

// Counters of one SafeOpen since it was opened.
struct Stats {
  uint64_t bytes_read = 0;         // bytes read from storage (by this rank)
  uint64_t bytes_received = 0;     // bytes other ranks read and sent to this one
  uint64_t read_requests = 0;      // read requests completed
  uint64_t tensors_loaded = 0;     // tensors handed out (iteration and get_tensor)
  uint64_t materializations = 0;   // borrowed tensors copied out before their memory was reused
  uint64_t misaligned_copies = 0;  // borrowed tensors handed out as copies (unaligned data)
  uint64_t leased_views = 0;       // views kept past their step under a read lease, not copied
  uint64_t buffer_size = 0;        // pool bytes (copy=false) or read-ahead budget (copy=true)
  uint64_t peak_pool_bytes = 0;    // highest pool bytes in use at once
  uint64_t recycled_blocks = 0;    // owned tensors read into memory a dropped one gave back
  double open_seconds = 0;         // opening files and validating headers
  double read_seconds = 0;         // time inside read calls, summed over workers
  double wait_seconds = 0;         // time the consumer waited for reads
  double copy_seconds = 0;         // materializations and copies on the consumer's thread
  double exchange_seconds = 0;     // distributed: waiting on status rounds and all-gathers
  std::string backend;             // the read backend in use
  // Whether the bytes were exchanged over a process group, and why: "none (single process)",
  // "none (one host, host target)", "device (device target)", "host (exchange=always)", ...
  std::string exchange;
  // The staging ring's memory once used: "pinned" (accelerators), "host" (a CPU target with
  // force_staging); where the platform refused to pin it (a locked-memory limit...), "pinned,
  // smaller (<n> of <asked> bytes; ...)" when a smaller ring that still holds two slices could be
  // pinned, else "pageable (pinning refused: <why>)" (copies slower); a warning once per process
  // either way. Empty while nothing was staged.
  std::string staging;
  // The loader's own ring memory once allocated (0 when none was needed): the staging ring
  // (pinned for accelerators; bounded by OpenOptions::staging_size) and the device ring
  // (copy=false or an exchange on an accelerator; bounded by buffer_size and device_budget).
  uint64_t staging_bytes = 0;
  uint64_t device_ring_bytes = 0;
  // Bytes per read request, chosen at open: OpenOptions::chunk_size (rounded to the alignment),
  // else 8 MiB; a staged pass's reads through staging: its slice (at most half the staging
  // ring; unless chunk_size is asked, for warm reads of a process alone, a slice whose ring in use
  // fits half of the CPU's last-level cache: 2 MiB on a 32 MiB cache with 2 read workers).
  uint64_t read_bytes = 0;
  // Memory advice (madvise) the kernel refused while this loader was open, in the whole process:
  // the load goes on with right bytes, only resident memory or speed differ (a kernel without
  // transparent huge pages, locked pages that cannot be given back). The debug line names the
  // first.
  uint64_t advice_refused = 0;
};

// One event of a loader's timeline (SafeOpen::timeline, recorded with INSTANTTENSOR_TIMELINE=1):
// `kind` is one of read_submitted, read, read_booked, staging_placed, staging_freed,
// staging_full, staging_limit, copy_queued, copy_wait, consumer_wait, tensor_out, open
// (ops/loader/reads/ pass_timeline.h says what each means); `start` and `end` are steady-clock
// seconds (equal for an instant); `bytes` and `tag` (a read's tag) where they apply, else 0.
struct TimelineEvent {
  std::string kind;
  double start = 0;
  double end = 0;
  uint64_t bytes = 0;
  uint64_t tag = 0;
};

// What load_into left unfilled (both empty with strict=true, which raises instead), sorted.
struct LoadIntoResult {
  std::vector<std::string> missing_keys;     // destinations with no selected tensor of that name
  std::vector<std::string> unexpected_keys;  // selected tensors with no destination
};

class Loader;  // the engine behind SafeOpen (ops/loader/loader.h)

// An open checkpoint: one or many safetensors files (sorted by path), validated up front.
//
// Threads: every method may be called from any thread; calls are serialized by an internal lock.
// Reads run on background workers; handed-out tensor objects are only touched on the calling
// thread, inside next(), get_tensor() and close().
//
// Borrowing (copy=false): yielded tensors view pool memory, valid at least until the iteration
// advances. A borrowed tensor still referenced when its memory must be reused is first copied to
// fresh memory and its storage repointed (stats().materializations), so a kept tensor never
// changes; a pointer exported earlier (data_ptr, DLPack, numpy) then refers to the old region.
// get_tensor() always returns an owned tensor.
//
// Host iteration (copy=true and copy=false without a named backend): tensors are views of a
// private mapping of the file. One still referenced when the pass moves on stays a view under a
// read lease on the file (stats().leased_views): a writer's open or truncation waits until its
// pages are private copies at the same address, so it never changes and never raises SIGBUS. A
// fork copies nothing: a forked child's kept views share the parent's pages, unprotected there
// (a rewrite of the file shows in them, as in safetensors' tensors). Where the kernel refuses the
// lease, or 64 files are leased already, it is copied out instead (stats().materializations).
// A storage the consumer repointed (share_memory_, set_, resize_) is never touched again.
class SafeOpen {
 public:
  // Opens and validates every file. Throws Error (NotFound, Permission, Io, Format, Argument,
  // Key) naming the file and tensor.
  explicit SafeOpen(std::vector<std::string> files, OpenOptions options = {});
  explicit SafeOpen(const std::string& file, OpenOptions options = {});
  ~SafeOpen();
  SafeOpen(SafeOpen&&) noexcept;
  SafeOpen& operator=(SafeOpen&&) noexcept;

  std::vector<std::string> keys() const;         // selected names, sorted
  std::vector<std::string> offset_keys() const;  // selected names, storage order
  // The files' __metadata__ (first file wins on a shared key); nullopt when none has one.
  std::optional<std::map<std::string, std::string>> metadata() const;
  TensorMetadata get_tensor_metadata(const std::string& name) const;
  // An owned tensor, in any order, any number of times. Error(Key) for an unselected name.
  at::Tensor get_tensor(const std::string& name);
  // Rows [start, stop) of dimension 0 of a tensor, as an owned tensor; only their bytes are
  // read. Error(Argument) for a 0-d tensor or rows out of range.
  at::Tensor get_rows(const std::string& name, int64_t start, int64_t stop);

  // Fills tensors the caller owns (a model's state_dict: name -> tensor, any device) in place
  // with the selected tensors of the same names, in one pass over the bytes: CPU destinations
  // are read straight into (O_DIRECT where their address and the file offset agree modulo the
  // block), accelerator ones through the pinned staging ring with no device allocation. Before
  // any byte is written: a dtype or shape that differs from the file's, a destination that
  // overlaps itself (expanded) or another one is Error(Argument) naming the tensor; names on one
  // side only are Error(Key) listing them when `strict`, else returned. Returns after every
  // destination holds its bytes (device copies done). Independent of iteration (which may be
  // underway); with a process group every rank reads and fills all its destinations itself.
  LoadIntoResult load_into(const std::map<std::string, at::Tensor>& destinations,
                           bool strict = true);
  // The same with destinations[i] named names[i] (the operator's and the Loader class's form):
  // lengths that differ, or a name given twice, are Error(Argument) before any byte is written.
  LoadIntoResult load_into(const std::vector<std::string>& names,
                           const std::vector<at::Tensor>& destinations, bool strict = true);

  // Starts a new pass over the selected tensors in storage order (abandoning any pass underway).
  void restart();
  // The next (name, tensor) of the current pass; nullopt at the end. The first call starts a
  // pass if none is underway.
  std::optional<std::pair<std::string, at::Tensor>> next();

  Stats stats() const;
  // What the loader's stages did when since open, with INSTANTTENSOR_TIMELINE=1 set at open
  // (empty otherwise), for finding what bounds a load (benchmarks/device_pipeline.py
  // --timeline). Kept after close. Any thread.
  std::vector<TimelineEvent> timeline() const;
  // What opening warned about, in order (empty when nothing did). Any thread.
  std::vector<std::string> warnings() const;
  uint64_t total_tensor_size() const;  // bytes of the selected tensors
  uint64_t buffer_size() const;
  bool copy() const;
  // Waits for reads in flight, copies out borrowed tensors that are still referenced, and
  // releases threads, fds and pool memory. Idempotent; the destructor calls it.
  void close();

  class Iterator {
   public:
    using value_type = std::pair<std::string, at::Tensor>;
    Iterator() = default;
    value_type& operator*() { return *current_; }
    value_type* operator->() { return &*current_; }
    Iterator& operator++();
    bool operator!=(const Iterator& other) const {
      return current_.has_value() != other.current_.has_value();
    }
    bool operator==(const Iterator& other) const { return !(*this != other); }

   private:
    friend class SafeOpen;
    SafeOpen* owner_ = nullptr;
    std::optional<value_type> current_;
  };
  // Range-for: each begin() starts a new pass.
  Iterator begin();
  Iterator end() { return Iterator(); }

 private:
  std::shared_ptr<Loader> loader_;
};

// The names of every tensor of `files`, in storage order (files sorted by path, then by offset),
// from their validated headers; no tensor data is read. Throws Error naming the file for a
// missing or malformed file. For choosing a selection (OpenOptions::keys) by pattern before
// opening. Any thread.
std::vector<std::string> tensor_names(std::vector<std::string> files);

// Every tensor of `file` as owned tensors on `device` (as safetensors.torch.load_file).
std::map<std::string, at::Tensor> load_file(const std::string& file,
                                            c10::Device device = c10::Device(c10::DeviceType::CPU));

// Pairs of names whose tensors' bytes overlap in memory (same device and storage), which
// save_file refuses, as safetensors does; empty when none do. Meta and empty tensors never
// overlap. The one check of both APIs (Python asks for it to raise safetensors' RuntimeError).
// Any thread.
std::vector<std::pair<std::string, std::string>> tensors_sharing_memory(
    const std::map<std::string, at::Tensor>& tensors);

// Writes contiguous tensors (any device; copied to the host) to `file`, readable by the
// reference safetensors reader. Rejects non-contiguous tensors and tensors sharing memory, as
// safetensors does. Throws Error(Argument/Io) naming the file and tensor.
void save_file(const std::map<std::string, at::Tensor>& tensors, const std::string& file,
               const std::optional<std::map<std::string, std::string>>& metadata = std::nullopt);

}  // namespace instanttensor
