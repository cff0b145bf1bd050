// One file of a checkpoint as validated when it was opened, and how to tell it is still that
// file. Torch-free.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <string>

#include "format/header.h"

namespace instanttensor::format {

// One file of a checkpoint, as validated when it was opened. Its descriptor belongs to the
// Checkpoint's FileDescriptors: a checkpoint of many shards holds one only for files being read.
struct CheckpointFile {
  std::string path;
  uint64_t size = 0;
  dev_t device = 0;
  ino_t inode = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;  // status change: set by every write, unlike mtime (touch -r, cp -p)
  FileHeader header;
};

// Records `st` (the fstat of the descriptor `file` is validated through) as what `file` is.
void record_identity(CheckpointFile& file, const struct stat& st);

// Whether `st` (a stat of some file) is `file` as validated: device, inode, size, modification
// and status-change times. Pure.
bool same_file(const CheckpointFile& file, const struct stat& st);

// Whether `st` is `file` as validated in what a read depends on: device, inode, size and
// modification time. Not the status-change time: chmod, chown or a new hard link set it, and
// must not fail a load. Pure.
bool same_contents(const CheckpointFile& file, const struct stat& st);

// Error(Io) naming `file` and `tensor` (may be empty): "file changed since it was opened", with
// how `st` (a stat of its path or descriptor now, not same_contents) differs: another file at
// the path, or this one rewritten ("size 10 -> 12", "same size, modified in place").
[[noreturn]] void throw_changed_since_open(const CheckpointFile& file, const std::string& tensor,
                                           const struct stat& st);

// Error(Io) for `file`'s path failing with `error` (an errno) when it is `taken` again ("opened
// again", "opened again for O_DIRECT reads", "stat'ed again"): a path that no longer leads to
// it (ENOENT, ENOTDIR, EACCES, EPERM, ELOOP, ESTALE) is "file changed since it was opened (its
// path cannot be opened: ...)"; anything else (EMFILE, EINVAL, EIO) says "cannot be <taken>:
// <reason>", as the file may be what it was. Both name `file` and `tensor` (may be empty).
[[noreturn]] void throw_reopen_failed(const CheckpointFile& file, const std::string& tensor,
                                      int error, const std::string& taken);

// Whether `file`'s path still names the file opened (a rewrite, a replacement by rename, a
// deletion: false). Any thread.
bool still_at_its_path(const CheckpointFile& file);

// Opens `path` O_RDONLY | O_CLOEXEC for reading and fstats it into `st`; -1 with errno on
// failure (nothing left open). O_NONBLOCK while opening, so that a named pipe put at the path
// does not wait for a writer forever; a regular file is then read blocking, as usual. The caller
// owns the descriptor. `extra_flags` (O_DIRECT) are added to the open. Any thread.
int open_for_reading(const std::string& path, struct stat* st, int extra_flags = 0);

}  // namespace instanttensor::format
