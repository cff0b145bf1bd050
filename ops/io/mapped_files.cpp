#include "io/mapped_files.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "instanttensor/error.h"
#include "io/fault_injection.h"

namespace instanttensor::io {

MappedFiles::MappedFiles(const std::vector<FileToRead>& files) {
  files_.reserve(files.size());
  try {
    for (const auto& file : files) map_one(file.path, file.buffered_fd, file.size);
  } catch (...) {
    for (const auto& mapped : files_) ::munmap(mapped.data, mapped.size);
    throw;
  }
}

MappedFiles::MappedFiles(const format::Checkpoint& checkpoint) {
  const auto& files = checkpoint.files();
  files_.reserve(files.size());
  try {
    for (size_t index = 0; index < files.size(); ++index) {
      format::ScopedDescriptor descriptor(checkpoint, index);
      map_one(files[index].path, descriptor.fd(), files[index].size);
    }
  } catch (...) {
    for (const auto& mapped : files_) ::munmap(mapped.data, mapped.size);
    throw;
  }
}

void MappedFiles::map_one(const std::string& path, int fd, uint64_t size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw system_error(errno, path, "cannot map the file");
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED) throw system_error(errno, path, "cannot map the file");
  files_.push_back(File{st.st_dev, st.st_ino, size, static_cast<uint8_t*>(map)});
}

MappedFiles::~MappedFiles() {
  for (const auto& file : files_) ::munmap(file.data, file.size);
  files_.clear();
}

size_t MappedFiles::index_of(const struct stat& st) const {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].device == st.st_dev && files_[i].inode == st.st_ino) return i;
  }
  return kNoFile;
}

ReadCompletion copy_from_mapping(const MappedFiles& files, const ReadRequest& request) {
  auto start = std::chrono::steady_clock::now();
  ReadCompletion done;
  done.tag = request.tag;
  done.file = request.file;
  size_t index = MappedFiles::kNoFile;
  struct stat st {};
  if (::fstat(request.fd, &st) != 0) {
    done.error = errno;
  } else if ((index = files.index_of(st)) == MappedFiles::kNoFile) {
    done.error = EBADF;
  }
  while (done.error == 0 && done.bytes < request.length) {
    uint64_t want = request.length - done.bytes;
    if (int fault = injected_fault(&want)) {
      if (fault == EINTR || fault == EAGAIN) continue;
      done.error = fault;
      break;
    }
    if (::fstat(request.fd, &st) != 0) {
      done.error = errno;
      break;
    }
    // Touching mapped pages past the file's end raises SIGBUS: copy only what the file has now.
    uint64_t at = request.offset + done.bytes;
    uint64_t end = std::min<uint64_t>(static_cast<uint64_t>(st.st_size), files.size(index));
    uint64_t got = std::min(want, at < end ? end - at : 0);
    if (got == 0) {
      done.truncated = done.bytes < required_bytes(request);
      break;
    }
    std::memcpy(static_cast<uint8_t*>(request.dest) + done.bytes, files.data(index) + at, got);
    done.bytes += got;
  }
  done.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return done;
}

std::unique_ptr<ReadBackend> make_mapped_copy_pool(std::shared_ptr<const MappedFiles> files,
                                                   int threads, uint32_t idle_spin_us) {
  return make_worker_pool(
      threads,
      [files = std::move(files)](const ReadRequest& request) {
        return copy_from_mapping(*files, request);
      },
      idle_spin_us);
}

}  // namespace instanttensor::io
