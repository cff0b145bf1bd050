// The index over the files of one checkpoint: validated headers, storage order, and the files'
// descriptors, opened on demand.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/checkpoint_file.h"
#include "format/file_descriptors.h"
#include "format/header.h"

namespace instanttensor::format {

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
  // Opens (O_RDONLY | O_CLOEXEC) and validates every file in turn; files are sorted by path.
  // Rejects an empty list, directories, unreadable or malformed files, and a tensor name defined
  // in two files. Throws Error naming the file. At most FileDescriptors::kOpenKept descriptors
  // stay open (file_descriptors.h says why).
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

  // A buffered descriptor of file `index`, of the very file validated at open, in use until
  // release_descriptor(index) (FileDescriptors::acquire: opened or checked now, Error(Io) naming
  // the file when its path no longer names it). Owned here. The loader's consumer thread.
  int descriptor(size_t index) const { return descriptors_.acquire(index); }
  // File `index` is no longer read through its descriptor (FileDescriptors::release). The
  // thread that acquired it.
  void release_descriptor(size_t index) const { descriptors_.release(index); }
  bool descriptor_in_use(size_t index) const { return descriptors_.in_use(index); }

  // Closes every descriptor; the index stays readable. A read after this opens again (checked
  // as above): callers stop the checkpoint's readers first. Idempotent.
  void close_files() { descriptors_.close_all(); }

  // Throws Error(Io) naming the file when a file's size or modification time differs from what
  // was validated at open, or (a file not in use) its path no longer names it or cannot be
  // stat'ed; the message says how (format::throw_changed_since_open, throw_reopen_failed). Re-stats
  // the descriptor in use, else the path. Any thread.
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
  mutable FileDescriptors descriptors_{files_};
};

// A descriptor of one file of `checkpoint` for the scope: the one in use already, else acquired
// for the scope (checked as Checkpoint::descriptor) and released at its end, so that walking
// every file (mapping them, probing the page cache) holds one or two at a time.
class ScopedDescriptor {
 public:
  // Throws as Checkpoint::descriptor.
  ScopedDescriptor(const Checkpoint& checkpoint, size_t index);
  ~ScopedDescriptor();
  ScopedDescriptor(const ScopedDescriptor&) = delete;
  ScopedDescriptor& operator=(const ScopedDescriptor&) = delete;
  int fd() const { return fd_; }

 private:
  const Checkpoint& checkpoint_;
  size_t index_;
  bool acquired_here_;
  int fd_;
};

}  // namespace instanttensor::format
