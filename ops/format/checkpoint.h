// The index over the files of one checkpoint: open fds, validated headers, storage order.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/header.h"

namespace instanttensor::format {

// One open file of a checkpoint. The fd stays open for the Checkpoint's lifetime so a file that
// is replaced by rename during a load is still read from the inode that was validated.
struct CheckpointFile {
  std::string path;
  int fd = -1;
  uint64_t size = 0;
  dev_t device = 0;
  ino_t inode = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;  // status change: set by every write, unlike mtime (touch -r, cp -p)
  FileHeader header;
};

// Whether `file`'s path still names the file opened (device, inode), of the size, modification
// and status-change times it had then (a rewrite, a replacement by rename, a deletion: false). Any
// thread.
bool still_at_its_path(const CheckpointFile& file);

// A tensor of the checkpoint, located by file index and absolute byte range in that file.
struct IndexedTensor {
  const TensorEntry* entry = nullptr;
  size_t file_index = 0;
  uint64_t file_offset = 0;  // absolute: data_start + data_begin
  uint64_t nbytes = 0;
  const std::string& name() const { return entry->name; }
};

class Checkpoint {
 public:
  // Opens (O_RDONLY | O_CLOEXEC) and validates every file; files are sorted by path. Rejects an
  // empty list, directories, unreadable or malformed files, and a tensor name defined in two
  // files. Throws Error naming the file; fds opened so far are closed on failure.
  explicit Checkpoint(std::vector<std::string> paths);
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::vector<CheckpointFile>& files() const { return files_; }
  // The path of the file holding `t` (for errors naming the file and the tensor).
  const std::string& path_of(const IndexedTensor& t) const { return files_[t.file_index].path; }
  // All tensors in storage order: files in path order, then by offset.
  const std::vector<IndexedTensor>& tensors() const { return tensors_; }
  // Index into tensors() for a name; throws Error(Key) naming the name when absent.
  size_t index_of(const std::string& name) const;
  bool contains(const std::string& name) const { return by_name_.count(name) != 0; }
  // Union of the files' __metadata__ (a key present in several files keeps the first file's
  // value); has_metadata() is false when no file carries a __metadata__ object.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has_metadata() const { return has_metadata_; }

  // Closes every fd; the index stays readable. Reading after this is a caller bug. Idempotent.
  void close_files();

  // Re-stats every open fd and throws Error(Io) naming the file when its size or modification
  // time differs from what was validated at open. Consumer thread.
  void check_unchanged() const;
  // The same for one file, naming `tensor` in the error: called when a group's reads have landed,
  // so bytes written in place after open (same size, new mtime) are never handed out.
  void check_unchanged(size_t file_index, const std::string& tensor) const;

 private:
  std::vector<CheckpointFile> files_;
  std::vector<IndexedTensor> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
  bool has_metadata_ = false;
};

}  // namespace instanttensor::format
