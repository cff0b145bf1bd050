// The mmap backend: each file of a checkpoint mapped once, and a worker pool that "reads" by
// copying from the mapping (torch-free).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/checkpoint.h"
#include "io/read_backend.h"

namespace instanttensor::io {

// Every file mapped whole, MAP_PRIVATE with PROT_READ | PROT_WRITE: pages stay shared with the
// page cache until someone writes through a view, which then gets a private copy (never the
// file), so an in-place op on a loaded weight cannot crash the process, as with safetensors'
// mappings. Like every file mapping, a file truncated while views are alive raises SIGBUS on
// access to the pages past its new end (README). Immutable after construction; any thread.
// Hold it through a shared_ptr: storages of views keep it alive past the checkpoint's close.
class MappedFiles {
 public:
  // Maps each file (fds stay owned by the caller; the mapping does not need them afterwards).
  // Throws Error(Io) naming the file when a mapping fails; mappings made so far are undone.
  explicit MappedFiles(const std::vector<FileToRead>& files);
  // Maps each file of `checkpoint` through a descriptor held for the mapping alone (a scoped
  // one where the checkpoint held none: the mapping keeps the validated file, not a descriptor).
  // Throws as above, or Error(Io) when a file is no longer the one validated.
  explicit MappedFiles(const format::Checkpoint& checkpoint);
  ~MappedFiles();
  MappedFiles(const MappedFiles&) = delete;
  MappedFiles& operator=(const MappedFiles&) = delete;

  // First byte of file `index` in the mapping (writable: see above).
  uint8_t* data(size_t index) const { return files_[index].data; }
  uint64_t size(size_t index) const { return files_[index].size; }
  // The file mapped that `st` (an fstat of a descriptor) describes, by device and inode (a
  // descriptor's number may name another file later), or kNoFile.
  size_t index_of(const struct stat& st) const;
  static constexpr size_t kNoFile = static_cast<size_t>(-1);

 private:
  struct File {
    dev_t device = 0;
    ino_t inode = 0;
    uint64_t size = 0;
    uint8_t* data = nullptr;
  };
  // Maps the file `fd` reads (of `size` bytes), or throws Error(Io) naming `path`.
  void map_one(const std::string& path, int fd, uint64_t size);
  std::vector<File> files_;
};

// One "read" of the mmap backend: memcpy from the mapping (size re-checked first). Any thread.
// A pool of `threads` workers whose reads are memcpy from `files` (requests name the buffered
// fds the mapping was made from). Each copy first re-checks the file's size with fstat, so a
// file that shrank is a truncated read, not SIGBUS, on this path. Same contract as the pread
// pool otherwise.
ReadCompletion copy_from_mapping(const MappedFiles& files, const ReadRequest& request);
std::unique_ptr<ReadBackend> make_mapped_copy_pool(std::shared_ptr<const MappedFiles> files,
                                                   int threads, uint32_t idle_spin_us = 0);

}  // namespace instanttensor::io
