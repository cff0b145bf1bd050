#include "format/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {

int64_t nanoseconds(const struct timespec& at) {
  return static_cast<int64_t>(at.tv_sec) * 1'000'000'000 + at.tv_nsec;
}

int64_t mtime_of(const struct stat& st) { return nanoseconds(st.st_mtim); }
int64_t ctime_of(const struct stat& st) { return nanoseconds(st.st_ctim); }

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "named pipe (FIFO)";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  return "special file";
}

CheckpointFile open_file(const std::string& path) {
  CheckpointFile file;
  file.path = path;
  // O_NONBLOCK: opening a named pipe for reading would otherwise wait for a writer forever.
  do {
    file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (file.fd < 0 && errno == EINTR);
  if (file.fd < 0) throw system_error(errno, path, "cannot open");
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) {
    int err = errno;
    ::close(file.fd);
    throw system_error(err, path, "cannot stat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(file.fd);
    throw Error(ErrorKind::Argument, path, "",
                std::string("not a regular file: it is a ") + file_kind(st.st_mode));
  }
  // A regular file: back to ordinary blocking reads.
  ::fcntl(file.fd, F_SETFL, ::fcntl(file.fd, F_GETFL) & ~O_NONBLOCK);
  file.size = static_cast<uint64_t>(st.st_size);
  file.device = st.st_dev;
  file.inode = st.st_ino;
  file.mtime_ns = mtime_of(st);
  file.ctime_ns = ctime_of(st);
  try {
    file.header = read_file_header(file.fd, path, file.size);
  } catch (...) {
    ::close(file.fd);
    throw;
  }
  return file;
}

}  // namespace

bool still_at_its_path(const CheckpointFile& file) {
  struct stat st {};
  if (::stat(file.path.c_str(), &st) != 0) return false;
  return st.st_dev == file.device && st.st_ino == file.inode &&
         static_cast<uint64_t>(st.st_size) == file.size && mtime_of(st) == file.mtime_ns &&
         ctime_of(st) == file.ctime_ns;
}

Checkpoint::Checkpoint(std::vector<std::string> paths) {
  if (paths.empty()) throw Error(ErrorKind::Argument, "", "", "no checkpoint files given");
  std::sort(paths.begin(), paths.end());
  if (std::adjacent_find(paths.begin(), paths.end()) != paths.end()) {
    auto dup = *std::adjacent_find(paths.begin(), paths.end());
    throw Error(ErrorKind::Argument, dup, "", "file listed twice");
  }
  try {
    files_.reserve(paths.size());
    for (const auto& path : paths) files_.push_back(open_file(path));
  } catch (...) {
    for (auto& file : files_) ::close(file.fd);
    throw;
  }
  try {
    for (size_t f = 0; f < files_.size(); ++f) {
      const auto& header = files_[f].header;
      for (const auto& entry : header.tensors) {
        auto [it, inserted] = by_name_.emplace(entry.name, tensors_.size());
        if (!inserted) {
          throw Error(ErrorKind::Format, files_[f].path, entry.name,
                      "DuplicateTensorName: also defined in " +
                          files_[tensors_[it->second].file_index].path);
        }
        tensors_.push_back(
            IndexedTensor{&entry, f, header.data_start() + entry.data_begin, entry.nbytes()});
      }
      if (header.has_metadata) {
        has_metadata_ = true;
        for (const auto& [key, value] : header.metadata) metadata_.emplace(key, value);
      }
    }
  } catch (...) {
    for (auto& file : files_) ::close(file.fd);
    throw;
  }
}

Checkpoint::~Checkpoint() { close_files(); }

void Checkpoint::close_files() {
  for (auto& file : files_) {
    if (file.fd >= 0) ::close(file.fd);
    file.fd = -1;
  }
}

size_t Checkpoint::index_of(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    std::string files = files_.size() == 1 ? files_[0].path
                                           : files_[0].path + " (and " +
                                                 std::to_string(files_.size() - 1) + " more)";
    throw Error(ErrorKind::Key, files, name, "no such tensor in the checkpoint");
  }
  return it->second;
}

void Checkpoint::check_unchanged() const {
  for (size_t i = 0; i < files_.size(); ++i) check_unchanged(i, "");
}

void Checkpoint::check_unchanged(size_t file_index, const std::string& tensor) const {
  const auto& file = files_.at(file_index);
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) throw system_error(errno, file.path, "cannot stat");
  if (static_cast<uint64_t>(st.st_size) != file.size || mtime_of(st) != file.mtime_ns) {
    std::string what =
        static_cast<uint64_t>(st.st_size) != file.size
            ? "size " + std::to_string(file.size) + " -> " + std::to_string(st.st_size)
            : "same size, modified in place";
    throw Error(ErrorKind::Io, file.path, tensor,
                "file changed since it was opened (" + what + ")");
  }
}

}  // namespace instanttensor::format
