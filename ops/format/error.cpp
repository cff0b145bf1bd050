#include "instanttensor/error.h"

#include <cerrno>
#include <cstring>

namespace instanttensor {

const char* error_kind_name(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::NotFound:
      return "not_found";
    case ErrorKind::Permission:
      return "permission";
    case ErrorKind::Io:
      return "io";
    case ErrorKind::Format:
      return "format";
    case ErrorKind::Argument:
      return "argument";
    case ErrorKind::Key:
      return "key";
    case ErrorKind::Internal:
      return "internal";
    case ErrorKind::OutOfMemory:
      return "out_of_memory";
  }
  return "io";
}

static std::string compose(ErrorKind kind, const std::string& file, const std::string& tensor,
                           const std::string& detail) {
  std::string message = std::string("[instanttensor:") + error_kind_name(kind) + "] ";
  if (!file.empty()) message += file + ": ";
  if (!tensor.empty()) message += "tensor '" + tensor + "': ";
  return message + detail;
}

Error::Error(ErrorKind kind, const std::string& file, const std::string& tensor,
             const std::string& detail)
    : std::runtime_error(compose(kind, file, tensor, detail)), kind_(kind) {}

ErrorKind error_kind_for_errno(int errno_value) noexcept {
  if (errno_value == ENOENT || errno_value == ENOTDIR) return ErrorKind::NotFound;
  if (errno_value == EACCES || errno_value == EPERM) return ErrorKind::Permission;
  return ErrorKind::Io;
}

std::string errno_message(int errno_value) {
  char text[256];
  // GNU strerror_r: returns the text (a static one, or `text` filled).
  return ::strerror_r(errno_value, text, sizeof text);
}

Error system_error(int errno_value, const std::string& file, const std::string& what) {
  return Error(error_kind_for_errno(errno_value), file, "",
               what + ": " + errno_message(errno_value));
}

}  // namespace instanttensor
