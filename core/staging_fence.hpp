#pragma once

#include <condition_variable>
#include <mutex>

namespace stagehand {

/// Says whether a checkpoint save still reads a rank's live state. An async save with staging
/// waves returns before its last bucket is staged; it closes the fence, and opens it once every
/// bucket is staged (or the save ended). Whoever modifies the state (the optimizer step, a load)
/// waits at the fence first: "fence before you modify a tensor you handed to save".
///
/// Thread-safety: every member may be called from any thread.
class StagingFence {
 public:
  /// A save started reading the state in the background.
  void close();
  /// Nothing reads the state any more.
  void open();
  /// Blocks until the fence is open.
  /// @return the seconds waited (0 when it was open).
  double wait();
  bool is_open() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = true;
};

}  // namespace stagehand
