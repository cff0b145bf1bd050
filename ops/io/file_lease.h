// Views of a file's private mapping kept past their step without copying them: a read lease
// (fcntl F_SETLEASE) makes the kernel tell this process before anyone opens the file for writing
// or truncates it, and the writer waits until the views' pages have been replaced by private
// copies (the same addresses, so the views and every pointer into them stay right).
//
// Why: a kept view used to be copied into fresh memory when the pass moved on, the last tensor of
// every pass included (a `for` loop still binds it). On a VM whose free memory is handed back to
// the host, fresh memory costs a host fault per page: 262 MB took 0.85-1.0 s in each of two
// processes, against 0.08 s alone (benchmarks/README.md). With a lease, nothing is copied unless
// a writer comes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace instanttensor::io {

class ViewProtection;

// A read lease on one file, taken through a descriptor of its own (a dup of the caller's), so
// it outlives the caller's descriptor and the loader that opened it. One process-wide thread
// answers lease breaks for every lease (a real-time signal directed at it alone, blocked
// there). The lease is released when the last holder (the loader, its protections) drops it.
// Any thread.
class FileLease : public std::enable_shared_from_this<FileLease> {
 public:
  // The lease on the file `fd` reads (opened read-only), or nullptr where the kernel refuses it:
  // leases disabled (/proc/sys/fs/leases-enable), a filesystem without them (NFS, FUSE), a file
  // this process neither owns nor has CAP_LEASE for, a file open for writing anywhere, no thread
  // for the watcher; in a testing build, INSTANTTENSOR_TESTING_NO_LEASE=1 refuses too.
  static std::shared_ptr<FileLease> take(int fd);
  ~FileLease();
  FileLease(const FileLease&) = delete;
  FileLease& operator=(const FileLease&) = delete;

  // Keeps [offset, offset + nbytes) of the file, mapped private from offset 0 at
  // `mapping_start`, as a view until a writer comes; the whole pages under it are then replaced
  // by private copies before the writer may go on. nullptr when the lease is no longer held (a
  // writer came already): the caller copies the view instead. Dropping the protection gives the
  // file's own pages back to the mapping where they had been replaced.
  std::shared_ptr<ViewProtection> protect(uint8_t* mapping_start, uint64_t offset, uint64_t nbytes);

  // In a forked child: the watcher thread and the lease are the parent's, so every live
  // protection of this process is replaced by private copies now (what the parent would do on a
  // writer's open). Called by the child once, before its first use of a view.
  static void freeze_all_in_child() noexcept;

 private:
  friend class ViewProtection;
  friend struct LeaseRegistry;
  explicit FileLease(int own_fd);
  // Under the registry's lock: every protection replaced by private copies, the lease released.
  void break_now() noexcept;

  int fd_;       // ours, a dup of the caller's: the lease lives on its open file description
  pid_t taker_;  // a forked child never releases the parent's lease
  bool held_ = true;
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
  // Its pages are private copies now (a writer came, or this is a forked child).
  bool frozen() const;

 private:
  friend class FileLease;
  ViewProtection(std::shared_ptr<FileLease> lease, uint8_t* mapping_start, uint64_t begin,
                 uint64_t end);
  // Under the registry's lock: private copies of [begin, end) over the same addresses.
  void freeze(uint64_t file_size) noexcept;

  std::shared_ptr<FileLease> lease_;
  uint8_t* mapping_start_;
  uint64_t begin_;
  uint64_t end_;
  bool frozen_ = false;
};

}  // namespace instanttensor::io
