#pragma once

// The common case in one object, without CAF in sight: save, async save and load of the state
// dicts of one process's ranks. Underneath it runs the same actors and protocol as everything
// else (a CheckpointCluster: coordinator, one Worker and MegatronStrategy per rank, the
// WorkerDispatch driving every save).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

struct CheckpointerOptions {
  /// Where checkpoints go: a local folder, or `s3://bucket/prefix` / `gs://bucket/prefix` (the
  /// AWS_* environment variables say how to reach it; saves there are sync).
  std::string root;
  /// Ranks this process saves, one StateDict each.
  int world_size = 1;
  /// Bucket files and writer threads per rank (megatron_config.ckpt_save_thread_count).
  int thread_count = 2;
  /// Threads reading a checkpoint at once per rank in a load (megatron_config.ckpt_load_thread_count).
  int load_thread_count = 4;
  /// Buckets staged at a time by a sync save (ckpt_save_staging_buckets); 0 stages all at once.
  /// Must be 0 for async_save.
  int staging_buckets = 0;
  /// Where object-store saves are written before upload (megatron_config.local_work_dir).
  std::string local_work_dir = "/tmp/stagehand-work";
  /// Limit of every wait on the actors underneath.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

class Checkpointer;

/// An async save on its way: wait() returns once it is written on every rank and committed (or
/// with why it did not commit). Waiting is optional: the next save, load, finalize() or the
/// Checkpointer's destruction finishes it anyway.
///
/// Thread-safety: as its Checkpointer.
class PendingSave {
 public:
  /// @return ok once step() is committed; otherwise why it was not.
  Status wait();
  std::int64_t step() const { return step_; }
  /// How long async_save blocked its caller (the copy of the state).
  double stall_s() const { return stall_s_; }

 private:
  friend class Checkpointer;
  struct Shared;
  PendingSave(std::shared_ptr<Shared> shared, std::int64_t step, double stall_s)
      : shared_(std::move(shared)), step_(step), stall_s_(stall_s) {}
  std::shared_ptr<Shared> shared_;
  std::int64_t step_;
  double stall_s_;
};

/// Saves and loads the StateDicts of this process's ranks: sync or async chosen per call, one
/// rank's state or one per rank. Tensors are read and written where they are (Tensor::from_blob
/// wraps your own memory), host or GPU.
///
/// The rule for async saves: the bytes of a tensor handed to async_save are copied before it
/// returns; from then on you may modify it. A new save, a load or destruction first finishes the
/// pending save.
///
/// Thread-safety: every method may be called from any thread; calls run one at a time.
class Checkpointer {
 public:
  /// Checks nothing and starts nothing yet: the actors start at the first call, when the state's
  /// structure is known; a bad option is that call's error.
  explicit Checkpointer(CheckpointerOptions options);
  /// finalize(), then stops the actors. A pending save that cannot commit is logged as an error
  /// (call finalize() first to get it as a Status).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Saves `step` and returns once it is committed (written, metadata, tracker).
  /// @pre options.world_size == 1 (else pass one state per rank).
  Status save(std::int64_t step, const StateDict& state);
  Status save(std::int64_t step, const std::vector<StateDict>& states);

  /// Saves `step` in the background: returns after the state's bytes are copied.
  Result<PendingSave> async_save(std::int64_t step, const StateDict& state);
  Result<PendingSave> async_save(std::int64_t step, const std::vector<StateDict>& states);

  /// Fills `state` in place from `path`: a checkpoint root (the step its tracker names) or one
  /// `global_step_N` folder, saved with any sharding. Every chunk read is checked against its
  /// checksum. On an error found before reading (a missing tensor or file, another shape or
  /// dtype) no tensor of `state` is modified; on a read error or a checksum mismatch (the bytes
  /// go straight into the tensors) the tensors' contents are unspecified: do not use them.
  /// Finishes a pending save first.
  Status load(StateDict& state, const std::string& path);
  Status load(std::vector<StateDict>& states, const std::string& path);

  /// Finishes a pending async save: written on every rank and committed.
  /// @return why the pending save did not commit (reported once).
  Status finalize();

 private:
  std::shared_ptr<PendingSave::Shared> shared_;
};

}  // namespace stagehand
