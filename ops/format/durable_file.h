// Writing a file so that its name only ever refers to a complete, durable file (torch-free).
#pragma once

#include <cstdint>
#include <string>

namespace instanttensor::format {

// A new file for `path`, written aside and put in place by commit():
// - where the file system has them, an unnamed file (O_TMPFILE) in path's folder: a crash or
//   SIGKILL before commit leaves nothing behind, since no name ever pointed at it;
// - elsewhere (or with `unnamed` false), "<path>.tmp-instanttensor-<pid>-<n>", unique per call,
//   removed on every error; a temporary left by a process that died (no such pid now) is removed
//   by the next DurableFile for the same path.
// commit() fsyncs the data, names the file (a link, then rename over `path`, atomic), then
// fsyncs the folder, so after it returns the new file survives a power loss; before it, `path`
// keeps whatever it held. Errors are Error(NotFound/Permission/Io) naming `path`. One thread
// per object; several objects may write the same path at once (the last commit wins).
class DurableFile {
 public:
  explicit DurableFile(std::string path, bool unnamed = true);
  ~DurableFile();  // without commit(): the temporary is closed and removed
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, uint64_t count);
  void commit();
  // Whether the data went to an unnamed file (for tests and the README's claims).
  bool unnamed() const { return temp_path_.empty(); }

 private:
  std::string path_;
  std::string folder_;
  std::string temp_path_;  // the named temporary, or empty for an unnamed file
  int fd_ = -1;
  bool committed_ = false;
};

// The prefix of the temporaries DurableFile names for `path`: "<path>.tmp-instanttensor-".
std::string temporary_prefix(const std::string& path);

}  // namespace instanttensor::format
