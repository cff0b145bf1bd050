// Reading a header from an open file: the length prefix, then the JSON text, each read whole
// (header.h declares read_file_header).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "format/header.h"
#include "instanttensor/error.h"

namespace instanttensor::format {

FileHeader read_file_header(int fd, const std::string& file_name, uint64_t file_size) {
  auto read_exact = [&](void* dest, uint64_t count, uint64_t offset) {
    uint64_t done = 0;
    while (done < count) {
      ssize_t got = ::pread(fd, static_cast<char*>(dest) + done, count - done, offset + done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw system_error(errno, file_name, "reading the header failed");
      if (got == 0) {
        throw Error(ErrorKind::Io, file_name, "", "file shrank while its header was read");
      }
      done += static_cast<uint64_t>(got);
    }
  };
  uint8_t prefix[8] = {};
  uint64_t prefix_size = std::min<uint64_t>(8, file_size);
  read_exact(prefix, prefix_size, 0);
  uint64_t length = parse_length_prefix(file_name, prefix, prefix_size, file_size);
  std::string text(length, '\0');
  read_exact(text.data(), length, 8);
  return parse_header_json(file_name, text.data(), length, file_size);
}

}  // namespace instanttensor::format
