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
  for (const auto& file : files) {
    void* map =
        ::mmap(nullptr, file.size, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.buffered_fd, 0);
    if (map == MAP_FAILED) {
      int error = errno;
      for (const auto& mapped : files_) ::munmap(mapped.data, mapped.size);
      throw system_error(error, file.path, "cannot map the file");
    }
    files_.push_back(File{file.buffered_fd, file.size, static_cast<uint8_t*>(map)});
  }
}

MappedFiles::~MappedFiles() {
  for (const auto& file : files_) ::munmap(file.data, file.size);
  files_.clear();
}

size_t MappedFiles::index_of_fd(int fd) const {
  for (size_t i = 0; i < files_.size(); ++i) {
    if (files_[i].fd == fd) return i;
  }
  return kNoFile;
}

ReadCompletion copy_from_mapping(const MappedFiles& files, const ReadRequest& request) {
  auto start = std::chrono::steady_clock::now();
  ReadCompletion done;
  done.tag = request.tag;
  size_t index = files.index_of_fd(request.fd);
  if (index == MappedFiles::kNoFile) done.error = EBADF;
  while (done.error == 0 && done.bytes < request.length) {
    uint64_t want = request.length - done.bytes;
    if (int fault = injected_fault(&want)) {
      if (fault == EINTR || fault == EAGAIN) continue;
      done.error = fault;
      break;
    }
    struct stat st {};
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
                                                   int threads) {
  return make_worker_pool(threads, [files = std::move(files)](const ReadRequest& request) {
    return copy_from_mapping(*files, request);
  });
}

}  // namespace instanttensor::io
