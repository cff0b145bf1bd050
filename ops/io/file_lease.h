// Views of a file's private mapping kept past their step without copying them: a read lease
// (fcntl F_SETLEASE) makes the kernel tell this process before anyone opens the file for writing
// or truncates it, and the writer waits until the views' pages have been replaced by private
// copies (the same addresses, so the views and every pointer into them stay right).
//
// Why: a kept view used to be copied into fresh memory when the pass moved on, the last tensor of
// every pass included (a `for` loop still binds it). On a VM whose free memory is handed back to
// the host, fresh memory costs a host fault per page: 262 MB took 0.85-1.0 s in each of two
// processes, against 0.08 s alone (benchmarks/README.md). With a lease, nothing is copied unless
// a writer comes or the process forks.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "io/copies_at_once.h"

namespace instanttensor::io {

class ViewProtection;

// A read lease on one file, taken through an open file description of its own (the file
// reopened through /proc/self/fd), so it outlives the caller's descriptor and the loader that
// opened it, and two leases on one file never share one kernel lease. One process-wide thread
// answers lease breaks for every lease (a real-time signal directed at it alone and blocked
// there; SIGIO too, which the kernel sends instead when that signal's queue is full). The lease
// is released when the last holder (the loader, its protections) drops it. Any thread.
//
// A fork copies nothing: the parent's views stay under its leases (a writer waits until the
// parent's pages are private copies); a child's views share the parent's pages and no lease
// covers them, so a rewrite of the file after the fork shows in them, and a truncation makes
// reading them SIGBUS, as with safetensors' tensors (the child's own kept views are copied out).
// At most max_leases() leases live in a process at once (a descriptor each).
class FileLease : public std::enable_shared_from_this<FileLease> {
 public:
  // The lease on the file `fd` reads, or nullptr where the kernel refuses it: leases disabled
  // (/proc/sys/fs/leases-enable), a filesystem without them (NFS, FUSE), a file this process
  // neither owns nor has CAP_LEASE for, a file open for writing anywhere, no /proc, no thread for
  // the watcher; in a testing build, INSTANTTENSOR_TESTING_NO_LEASE=1 refuses too.
  // Also nullptr when max_leases() leases are alive already.
  static std::shared_ptr<FileLease> take(int fd);
  // Where take() was refused: a holder of the file `fd` reads (a descriptor of its own, counted
  // with the leases under max_leases()) whose protect() replaces a view's pages by private
  // copies at once, since no writer will wait for it. A pointer exported from the view (numpy,
  // DLPack) then reads the copies too, as it does under a lease once a writer came. nullptr
  // past the cap, or with no descriptor to spare.
  // `copy` fills the copies (io/copies_at_once.h; the kernel's copy when null).
  static std::shared_ptr<FileLease> copying_at_once(int fd, PageCopier copy = nullptr);
  // The most leases (and holders) this process holds at once: 64, or a sixteenth of the
  // descriptor limit (RLIMIT_NOFILE, read at each take) where that is less.
  static size_t max_leases() noexcept;
  // The most views frozen at once by copying_at_once() holders in this process. Neighbouring
  // copies merge into one kernel map area (io/copies_at_once.h), but views kept apart are an
  // area each and split their file's: an eighth of vm.max_map_count (read once), 8191 at its
  // default. Past it, the caller copies views out instead.
  static size_t max_views_copied_at_once() noexcept;
  ~FileLease();
  FileLease(const FileLease&) = delete;
  FileLease& operator=(const FileLease&) = delete;

  // Keeps the tensor bytes [offset, offset + nbytes) of the file, mapped private from offset 0
  // at `mapping_start`, as a view until a writer comes; the whole pages under it are then
  // replaced by private copies before the writer may go on (a write into the view by another
  // thread between that copy and the replacement is lost). A copying_at_once() holder replaces
  // them now (a copy of the view's bytes, made without the process's lease lock; one caller
  // at a time per holder). nullptr when the
  // lease is no longer held (a writer came already), in a forked child, or when a holder cannot
  // copy (no memory, max_views_copied_at_once() reached): the caller copies the view instead.
  // Dropping the protection maps the file's own pages back where they had been replaced (an
  // in-place write by a live, unprotected view on a page shared with it is lost then).
  std::shared_ptr<ViewProtection> protect(uint8_t* mapping_start, uint64_t offset, uint64_t nbytes);

 private:
  friend class ViewProtection;
  friend struct LeaseRegistry;
  explicit FileLease(int own_fd);
  // Under the registry's lock: every protection replaced by private copies. False when a copy
  // could not be made (no memory, too many mappings): the lease is kept then, and the kernel
  // lets the writer go after /proc/sys/fs/lease-break-time.
  bool freeze_all() noexcept;

  int fd_;       // ours: the lease lives on its open file description
  pid_t taker_;  // a forked child never releases the parent's lease
  bool held_ = true;
  std::unique_ptr<CopiesAtOnce> copies_;  // copying_at_once(): no lease; protect() copies
  bool registered_ = false;  // in the registry: its destructor takes the registry's lock
  std::vector<ViewProtection*> protections_;
};

// The pages of one kept view (see FileLease::protect). Lives as long as the view's storage.
class ViewProtection {
 public:
  ~ViewProtection();
  ViewProtection(const ViewProtection&) = delete;
  ViewProtection& operator=(const ViewProtection&) = delete;

  // The page-aligned file range [begin, end) it keeps: a caller unmapping pages behind its
  // consumer leaves these alone.
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }

 private:
  friend class FileLease;
  ViewProtection(std::shared_ptr<FileLease> lease, uint8_t* mapping_start, uint64_t offset,
                 uint64_t nbytes);
  // Under the registry's lock: off its lease's list.
  void unlist() noexcept;

  std::shared_ptr<FileLease> lease_;
  uint8_t* mapping_start_;
  uint64_t begin_;
  uint64_t end_;
  bool frozen_ = false;  // under the registry's lock
  size_t index_ = 0;     // its place in lease_->protections_, under the registry's lock
  bool listed_ = false;  // in lease_->protections_ (under the registry's lock)
};

}  // namespace instanttensor::io
