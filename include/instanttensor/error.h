// instanttensor: the one exception type every layer throws.
#pragma once

#include <stdexcept>
#include <string>

namespace instanttensor {

// What went wrong, so that bindings can pick the right exception type (Python maps
// NotFound -> FileNotFoundError, Permission -> PermissionError, Io -> OSError, Format and
// Argument -> ValueError, Key -> KeyError, Internal -> RuntimeError). Internal is a broken
// invariant of the library itself (a bug to report), never a property of the file or the disk.
// OutOfMemory: a device allocation failed (torch's OutOfMemoryError), kept as such when a status
// round carries it to the other ranks of a group.
enum class ErrorKind { NotFound, Permission, Io, Format, Argument, Key, Internal, OutOfMemory };

// Stable lower-case name of a kind; it appears in every message as "[instanttensor:<kind>]".
const char* error_kind_name(ErrorKind kind) noexcept;

// Every failure in the library is an Error. what() reads
// "[instanttensor:<kind>] <file>: tensor '<name>': <detail>" (file and tensor where known), so
// the message survives being re-wrapped as a plain RuntimeError by torch.ops.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& file, const std::string& tensor,
        const std::string& detail);
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// NotFound for ENOENT/ENOTDIR, Permission for EACCES/EPERM, Io for anything else.
ErrorKind error_kind_for_errno(int errno_value) noexcept;

// The system's text for `errno_value` ("No such file or directory"). Any thread: through
// strerror_r, where std::strerror may share one buffer between threads (a libc before 2.32).
std::string errno_message(int errno_value);

// Builds the Error for a failed system call: the kind follows errno (ENOENT -> NotFound,
// EACCES/EPERM -> Permission, anything else -> Io) and errno_message is appended to `what`.
Error system_error(int errno_value, const std::string& file, const std::string& what);

}  // namespace instanttensor
