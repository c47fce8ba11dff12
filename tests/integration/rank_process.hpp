#pragma once

// One process of a multi-process job, started as a cluster launcher starts it (RANK, LOCAL_RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT and Stagehand's STAGEHAND_PORT, both set to `port`); its
// output goes to a file. Killed (SIGKILL) and reaped when destroyed while still running.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/test_util.hpp"

namespace stagehand::test {

struct RankProcess {
  pid_t pid = -1;
  std::string log;

  RankProcess(int rank, int world_size, int port, const std::string& command, const std::string& log_path)
      : log(log_path) {
    // Everything the child needs is built before fork (allocating after fork is unsafe).
    const std::string exec = "RANK=" + std::to_string(rank) + " LOCAL_RANK=" + std::to_string(rank) +
                             " WORLD_SIZE=" + std::to_string(world_size) + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                             std::to_string(port) + " STAGEHAND_PORT=" + std::to_string(port) + " exec " + command;
    pid = ::fork();
    if (pid == 0) {
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execl("/bin/sh", "sh", "-c", exec.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  /// Waits at most `limit`; -1 when still running.
  int wait_for(std::chrono::milliseconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  void kill_now() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~RankProcess() { kill_now(); }
  std::string output() const { return read_file(log); }
};

}  // namespace stagehand::test
