#include "stagehand/core/priority.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

namespace stagehand {

namespace {

// From linux/ioprio.h, which glibc does not wrap.
constexpr int kIoprioWhoProcess = 1;
constexpr int kIoprioClassShift = 13;
constexpr int kIoprioClassBestEffort = 2;

pid_t thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

}  // namespace

Status lower_current_thread_priority() {
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(thread_id()), kWriterNice) != 0) {
    return Status::from_errno(errno, "setpriority of a checkpoint writer thread");
  }
  int prio = kIoprioClassBestEffort << kIoprioClassShift | kWriterIoPriorityLevel;
  if (::syscall(SYS_ioprio_set, kIoprioWhoProcess, thread_id(), prio) != 0) {
    return Status::from_errno(errno, "ioprio_set of a checkpoint writer thread");
  }
  return Status::ok();
}

int current_thread_nice() {
  errno = 0;
  return ::getpriority(PRIO_PROCESS, static_cast<id_t>(thread_id()));
}

int current_thread_io_priority() {
  return static_cast<int>(::syscall(SYS_ioprio_get, kIoprioWhoProcess, thread_id()));
}

double thread_cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

}  // namespace stagehand
