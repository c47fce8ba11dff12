#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <variant>

namespace stagehand {

/// What went wrong, and so whether a retry can help.
enum class ErrorCode : std::uint8_t {
  /// Success; never carried by a failed Status.
  ok = 0,
  /// A caller passed something malformed (argument, path, shape).
  invalid_argument,
  /// The configuration is malformed or inconsistent.
  config_error,
  /// A file or object that must exist does not.
  not_found,
  /// Something that must not exist already does.
  already_exists,
  /// The operating system refused access.
  permission_denied,
  /// The destination is full.
  no_space,
  /// Reading or writing failed; retrying may help.
  io_error,
  /// Stored bytes do not match their checksum, size or format.
  corruption,
  /// The request is valid but this build or destination cannot serve it.
  unsupported,
  /// A wait ran past its time limit; retrying may help.
  timeout,
  /// The operation was cancelled or stopped by an earlier failure.
  aborted,
  /// A broken invariant inside Stagehand.
  internal,
};

/// Returns the stable lowercase name of `code`.
const char* to_string(ErrorCode code);

inline std::ostream& operator<<(std::ostream& os, ErrorCode code) { return os << to_string(code); }

/// An error as a value: a code, a message that names what failed, and the errno when the
/// operating system reported one.
class [[nodiscard]] Status {
 public:
  // -- constructors --

  Status() = default;
  Status(ErrorCode code, std::string message, int sys_errno = 0)
      : code_(code), message_(std::move(message)), errno_(sys_errno) {}

  static Status ok() { return {}; }

  /// Builds an error from `errno` with the matching code (ENOSPC -> no_space, ...).
  static Status from_errno(int sys_errno, const std::string& what);

  // -- properties --

  bool is_ok() const { return code_ == ErrorCode::ok; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  int sys_errno() const { return errno_; }

  /// True when the same call may succeed if tried again (I/O errors, time-outs).
  bool retryable() const { return code_ == ErrorCode::io_error || code_ == ErrorCode::timeout; }

  /// Returns a copy whose message is prefixed with `context: `.
  Status with_context(const std::string& context) const;

  /// "code: message".
  std::string to_string() const;

  /// For CAF's serialization: a Status travels between processes in reports and replies.
  template <class Inspector>
  friend typename Inspector::result_type inspect(Inspector& f, Status& x) {
    return f(x.code_, x.message_, x.errno_);
  }

 private:
  ErrorCode code_ = ErrorCode::ok;
  std::string message_;
  int errno_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, const Status& status) { return os << status.to_string(); }

/// A value or the Status that explains why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : state_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool is_ok() const { return std::holds_alternative<T>(state_); }

  /// @pre is_ok()
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error, or an ok Status when there is a value.
  Status status() const { return is_ok() ? Status::ok() : std::get<Status>(state_); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace stagehand

#define SH_CONCAT_INNER(a, b) a##b
#define SH_CONCAT(a, b) SH_CONCAT_INNER(a, b)

/// Returns the Status of `expr` from the enclosing function when it is an error.
#define SH_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::stagehand::Status sh_status_ = (expr);      \
    if (!sh_status_.is_ok()) return sh_status_;   \
  } while (false)

#define SH_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

/// Evaluates `expr` (a Result); returns its error, or assigns its value to `lhs`.
#define SH_ASSIGN_OR_RETURN(lhs, expr) \
  SH_ASSIGN_OR_RETURN_IMPL(SH_CONCAT(sh_result_, __LINE__), lhs, expr)
