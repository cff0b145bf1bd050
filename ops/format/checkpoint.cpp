#include "format/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "instanttensor/error.h"

namespace instanttensor::format {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "named pipe (FIFO)";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  return "special file";
}

// Validates the file at `path` through the descriptor `*fd` (the caller's on success; closed on
// failure).
CheckpointFile open_file(const std::string& path, int* fd) {
  CheckpointFile file;
  file.path = path;
  struct stat st {};
  *fd = open_for_reading(path, &st);
  if (*fd < 0) throw system_error(errno, path, "cannot open");
  try {
    if (!S_ISREG(st.st_mode)) {
      throw Error(ErrorKind::Argument, path, "",
                  std::string("not a regular file: it is a ") + file_kind(st.st_mode));
    }
    record_identity(file, st);
    file.header = read_file_header(*fd, path, file.size);
  } catch (...) {
    ::close(*fd);
    throw;
  }
  return file;
}

}  // namespace

Checkpoint::Checkpoint(std::vector<std::string> paths) {
  if (paths.empty()) throw Error(ErrorKind::Argument, "", "", "no checkpoint files given");
  std::sort(paths.begin(), paths.end());
  if (std::adjacent_find(paths.begin(), paths.end()) != paths.end()) {
    auto dup = *std::adjacent_find(paths.begin(), paths.end());
    throw Error(ErrorKind::Argument, dup, "", "file listed twice");
  }
  files_.reserve(paths.size());
  for (const auto& path : paths) {
    int fd = -1;
    files_.push_back(open_file(path, &fd));
    descriptors_.adopt(files_.size() - 1, fd);
  }
  for (size_t f = 0; f < files_.size(); ++f) {
    const auto& header = files_[f].header;
    for (const auto& entry : header.tensors) {
      auto [it, inserted] = by_name_.emplace(entry.name, tensors_.size());
      if (!inserted) {
        throw Error(
            ErrorKind::Format, files_[f].path, entry.name,
            "DuplicateTensorName: also defined in " + files_[tensors_[it->second].file_index].path);
      }
      tensors_.push_back(
          IndexedTensor{&entry, f, header.data_start() + entry.data_begin, entry.nbytes()});
    }
    if (header.has_metadata) {
      has_metadata_ = true;
      for (const auto& [key, value] : header.metadata) metadata_.emplace(key, value);
    }
  }
}

Checkpoint::~Checkpoint() { close_files(); }

ScopedDescriptor::ScopedDescriptor(const Checkpoint& checkpoint, size_t index)
    : checkpoint_(checkpoint),
      index_(index),
      acquired_here_(!checkpoint.descriptor_in_use(index)),
      fd_(checkpoint.descriptor(index)) {}

ScopedDescriptor::~ScopedDescriptor() {
  if (acquired_here_) checkpoint_.release_descriptor(index_);
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
  const struct stat st = descriptors_.stat_now(file_index, tensor);
  if (!same_contents(file, st)) throw_changed_since_open(file, tensor, st);
}

}  // namespace instanttensor::format
