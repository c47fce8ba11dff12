#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace stagehand {

/// Says whether something still reads a rank's live state in the background. An async save with
/// staging waves returns before its last bucket is staged; it closes the fence, and opens it once
/// every bucket is staged (or the save ended). A Worker's weight push (weight_sync) does the same
/// while it streams the weights to the receivers. Whoever modifies the state (the optimizer step, a load)
/// waits at the fence first: "fence before you modify a tensor you handed to save".
///
/// Thread-safety: every member may be called from any thread.
class StagingFence {
 public:
  /// One more reader of the state in the background (a save staging, a weight push): the fence
  /// stays closed until each of them called open().
  void close();
  /// One reader is done with the state.
  void open();
  /// Blocks until the fence is open (no reader left).
  /// @return the seconds waited (0 when it was open).
  double wait();
  bool is_open() const;
  /// Blocks until someone waits in wait() (about to modify the state) or `at_most` passed: a
  /// reader that could go on reading (a weight push serving late receivers) stops for them.
  /// @return whether someone waits.
  bool wait_for_waiter(std::chrono::milliseconds at_most);

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int readers_ = 0;
  int waiters_ = 0;
};

}  // namespace stagehand
