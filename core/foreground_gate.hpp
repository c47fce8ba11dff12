#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace stagehand {

/// Says whether a caller in this process is blocked on the foreground part of an async save
/// (its staging before the return). Background work of async saves (the rest of their staging,
/// hashing and writing, tier copies) waits at the gate before each piece it takes while the gate
/// is held, so that a stall is not stretched by other ranks' background threads competing for
/// the same cores: on a machine with fewer cores than busy threads, a writer thread at nice 10
/// that holds a core delays a thread of the save that wakes up by up to the scheduler's slice.
///
/// Holds nest (one per rank staging, one for a dispatch's whole fan-out). The gate holds work
/// back at most limit() from the moment it was taken after being free: a hold that lasts longer
/// (a rank that stalls, a save that fell back to a sync upload, a caller draining a write that
/// waits here) then lets every waiter go on until the gate is free and taken again.
///
/// Thread-safety: every member may be called from any thread.
class ForegroundGate {
 public:
  using Clock = std::chrono::steady_clock;

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

  static constexpr std::chrono::milliseconds kDefaultLimit{1000};

  Hold hold() { return Hold(*this); }
  /// Blocks while a hold is out, until limit() after the gate was taken.
  /// @return the seconds waited (0 when the gate was free).
  double wait();
  int holds() const;
  /// How long the gate holds work back after it was taken (tests lengthen it, so that a loaded
  /// machine cannot let work through early); a wait already begun keeps its deadline.
  void set_limit(std::chrono::milliseconds limit);
  std::chrono::milliseconds limit() const;

 private:
  void acquire();
  void release_one();

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int holds_ = 0;
  Clock::time_point taken_;
  std::chrono::milliseconds limit_ = kDefaultLimit;
};

/// The process's gate: the cores are the process's, whichever rank's save holds them.
ForegroundGate& foreground_gate();

}  // namespace stagehand
