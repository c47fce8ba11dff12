#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace stagehand {

/// Says whether a caller in this process is blocked on the foreground part of an async save
/// (its staging before the return). Background work of async saves (the rest of their staging,
/// hashing and writing, tier copies) waits at the gate before each task it takes while the gate
/// is held, so that a stall is not stretched by other ranks' background threads competing for
/// the same cores: on a machine with fewer cores than busy threads, a writer thread at nice 10
/// that holds a core delays a training thread that wakes up by up to the scheduler's slice.
///
/// Holds nest (one per rank staging, one for a dispatch's whole fan-out). A wait is bounded: a
/// gate held longer than the limit (a dispatch waiting on a stalled rank) only slows the
/// background work, never stops it.
///
/// Thread-safety: every member may be called from any thread.
class ForegroundGate {
 public:
  /// One hold, released when destroyed (or by release()).
  class Hold {
   public:
    Hold() = default;
    explicit Hold(ForegroundGate& gate);
    Hold(Hold&& other) noexcept;
    Hold& operator=(Hold&& other) noexcept;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { release(); }
    void release();
    bool held() const { return gate_ != nullptr; }

   private:
    ForegroundGate* gate_ = nullptr;
  };

  Hold hold() { return Hold(*this); }
  /// Blocks while a hold is out, at most `limit`.
  /// @return the seconds waited (0 when the gate was free).
  double wait(std::chrono::milliseconds limit = kDefaultWaitLimit);
  int holds() const;

  /// Longest wait of one background task at a held gate.
  static constexpr std::chrono::milliseconds kDefaultWaitLimit{1000};

 private:
  void acquire();
  void release_one();

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int holds_ = 0;
};

/// The process's gate: the cores are the process's, whichever rank's save holds them.
ForegroundGate& foreground_gate();

}  // namespace stagehand
