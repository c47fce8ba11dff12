#pragma once

#include <caf/fwd.hpp>
#include <memory>

#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/staging_fence.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/strategy/protocol.hpp"

namespace stagehand {

struct StrategyOptions {
  int rank = 0;
  /// megatron_config.ckpt_save_thread_count.
  int thread_count = 2;
  /// megatron_config.ckpt_save_staging_buckets.
  int staging_buckets = 0;
  /// Whether async saves are expected (megatron_config.async_dist_ckpt_save): their staging
  /// buffers are then allocated at spawn. Each SaveOrder says whether it is async.
  bool async_save = false;
  /// megatron_config.ckpt_writer_low_priority: writer threads at lowered CPU and I/O priority.
  bool low_priority_writers = true;
  /// Every byte the rank saves or loads goes through it (default_file_system(): local paths and
  /// object stores reached by the AWS environment variables); stagehand-train passes one built
  /// from storage.s3 and rate-limited; tests pass a slowed or failing one.
  std::shared_ptr<FileSystem> file_system = default_file_system();
  /// megatron_config.ckpt_staging_memory is per_save: staging buffers are freed after each save.
  bool staging_per_save = false;
  /// Closed while an async save still stages from the state in the background (staging waves);
  /// whoever modifies the state waits at it. Null: nobody waits (then the state must not be
  /// modified until the save is finalized).
  std::shared_ptr<StagingFence> fence = nullptr;
  /// Sync saves copy host-resident tensors out through staging buffers too, as device memory
  /// must be (stagehand-bench --source device), rather than writing straight from them.
  bool stage_host_memory = false;
  /// Start each written range's write-back at once (SaveEngineOptions::early_writeback).
  bool early_writeback = true;
  /// megatron_config.ckpt_save_uncached (SaveEngineOptions::uncached_writes).
  bool uncached_writes = true;
  /// megatron_config.ckpt_load_thread_count: threads reading a checkpoint at once in a load.
  int load_thread_count = kDefaultLoadThreadCount;
  /// The ranks of this process that load together (one per Checkpointer, CheckpointCluster or
  /// stagehand-train process, sized to its ranks): a saved chunk that several of them need is
  /// read once. Null: this rank reads alone.
  std::shared_ptr<LoadGroup> load_group = nullptr;
};

/// Spawns the MegatronStrategy actor of one rank: it owns the rank's SaveEngine and a persistent
/// AsyncCallsQueue (writer threads and host staging buffers created here, at spawn, for the
/// state's current structure; reused by every save; kept until the actor exits). `state` is the
/// rank's live state; tensor bytes never travel in messages. When a rank's write ends, the
/// strategy pushes its RankSaveReport to `listener` at once.
///
/// Protocol (strategy_actor, strategy/protocol.hpp; every reply a value or an error):
/// - (save_atom, SaveOrder) -> SaveAck: first waits for a pending save; saves the blocks the
///   order names (the global plan's). Async stages (the first `staging_buckets` buckets, or all
///   when 0) and returns while the write, and the staging of the other buckets, run in the
///   background; `fence` stays closed until every bucket is staged. Otherwise writes and
///   returns. A destination whose writes are uploads (an object store:
///   FileSystemCapabilities::uploads) turns an async save into a sync one, with one warning
///   (from rank 0, the first time): each file is uploaded when it is synced.
/// - (finalize_atom) -> bool: drains the queue, pushes the outcome; an error kept from a
///   background write is returned (once) here, or by the next save or load.
/// - (load_atom, LoadOrder) -> LoadReport: drains first, then loads into the live state on
///   `load_thread_count` threads; the folder is a checkpoint root (the step its tracker names)
///   or a `global_step_N` folder; with a `load_group`, with the other ranks of the process (the
///   reply then comes when every member's reads are done). After a failed load the state's
///   tensors are unspecified (load_checkpoint).
/// - (stats_atom) -> StrategyStats.
/// On exit, a pending write is finished and pushed before the actor goes away.
///
/// The actor is detached (its own thread): draining blocks it, never a scheduler thread.
/// @return an error naming the bad option.
Result<strategy_actor> spawn_megatron_strategy(caf::actor_system& system, StrategyOptions options,
                                               std::shared_ptr<StateDict> state, report_listener_actor listener);

}  // namespace stagehand
