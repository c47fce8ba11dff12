#include "stagehand/core/status.hpp"

#include <cerrno>
#include <cstring>

namespace stagehand {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::config_error: return "config_error";
    case ErrorCode::not_found: return "not_found";
    case ErrorCode::already_exists: return "already_exists";
    case ErrorCode::permission_denied: return "permission_denied";
    case ErrorCode::no_space: return "no_space";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::corruption: return "corruption";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::aborted: return "aborted";
    case ErrorCode::internal: return "internal";
  }
  return "unknown";
}

Status Status::from_errno(int sys_errno, const std::string& what) {
  ErrorCode code = ErrorCode::io_error;
  switch (sys_errno) {
    case ENOENT:
    case ENOTDIR: code = ErrorCode::not_found; break;
    case EEXIST:
    case ENOTEMPTY: code = ErrorCode::already_exists; break;
    case EACCES:
    case EPERM:
    case EROFS: code = ErrorCode::permission_denied; break;
    case ENOSPC:
    case EDQUOT: code = ErrorCode::no_space; break;
    case EINVAL:
    case ENAMETOOLONG: code = ErrorCode::invalid_argument; break;
    default: break;
  }
  return {code, what + ": " + std::strerror(sys_errno) + " (errno " + std::to_string(sys_errno) + ")",
          sys_errno};
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return {code_, context + ": " + message_, errno_};
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(stagehand::to_string(code_)) + ": " + message_;
}

}  // namespace stagehand
