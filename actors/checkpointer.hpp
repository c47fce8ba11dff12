#pragma once

// The common case in one object, without CAF in sight: save, async save and load of the state
// dicts of this process's ranks, collectively with every other process of the job. Underneath
// it runs the same actors and protocol as everything else (a coordinator on rank 0's process,
// one Worker and MegatronStrategy per rank, a WorkerDispatch in each process).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/actors/launch.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

class FileSystem;

struct CheckpointerOptions {
  /// Where checkpoints go: a local folder (shared by every host of the job), or
  /// `s3://bucket/prefix` / `gs://bucket/prefix` (the AWS_* environment variables say how to
  /// reach it; saves there are sync).
  std::string root;

  // -- the job --

  /// The first rank this process holds.
  int rank = 0;
  /// Ranks of the whole job, in all processes.
  int world_size = 1;
  /// Ranks this process holds, one StateDict each per call (ranks rank, rank + 1, ...); 0: all
  /// of `world_size` (one process).
  int local_ranks = 0;
  /// Where the process holding rank 0 listens for the others when the job spans processes: its
  /// host and Stagehand's own control port (STAGEHAND_PORT; never MASTER_PORT, which the
  /// trainer's torch.distributed or NCCL uses).
  std::string master_addr = "127.0.0.1";
  int port = kDefaultControlPort;
  /// How long the processes have to find each other at their first call.
  std::chrono::milliseconds join_timeout = std::chrono::seconds(60);

  // -- saving and loading --

  /// Bucket files and writer threads per rank (megatron_config.ckpt_save_thread_count).
  int thread_count = 2;
  /// Threads reading a checkpoint at once per rank in a load (megatron_config.ckpt_load_thread_count).
  int load_thread_count = 4;
  /// Buckets staged at a time (ckpt_save_staging_buckets): host memory stays near this many
  /// buckets; 0 stages all at once. With async_save, the save returns once these are staged and
  /// stages the rest as slots free up (PendingSave::staged says when the state may change).
  int staging_buckets = 0;
  /// This process's checkpoint writes, all its ranks together, move at most this many MiB per
  /// second (megatron_config.ckpt_write_rate_limit_mib_s: saves that must not crowd shared
  /// storage); 0: unlimited.
  double write_rate_limit_mib_s = 0;
  /// Where files bound for an object store are written before their upload
  /// (megatron_config.local_work_dir).
  std::string local_work_dir = "/tmp/stagehand-work";
  /// Committed checkpoints kept in `root` (trainer.max_ckpts_to_keep): once a save commits, the
  /// oldest steps beyond this many are removed (the newest always stays); 0 keeps all.
  int max_to_keep = 0;
  /// With max_to_keep and a local root (trainer.ckpt_reuse_files): the removed steps' data files
  /// are kept (one per name, in `<root>/.spare_files`, until the Checkpointer closes) and the
  /// next save writes over them instead of creating new files: no disk blocks freed and
  /// allocated again at every save. false: freed at once.
  bool reuse_files = true;
  /// New data files are written around the page cache (O_DIRECT) where the file system takes
  /// it (megatron_config.ckpt_save_uncached): no page allocated, copied into or left dirty, so
  /// the first saves are as fast as later ones; a load right after then reads from the device.
  bool uncached_writes = true;
  /// Where every file goes through; null: the default (local paths, and s3:// or gs:// through
  /// the object store). A test's fault-injecting or slowed file system goes here.
  std::shared_ptr<FileSystem> file_system = nullptr;
  /// Limit of every wait: for the other ranks to begin the same save, for each rank's write,
  /// for the commit.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);

  /// The options of one process of a job launched one process per rank (torchrun,
  /// scripts/launch-local.sh): `rank` and `world_size` from RANK and WORLD_SIZE, `master_addr`
  /// from MASTER_ADDR, `port` from STAGEHAND_PORT (default kDefaultControlPort); without
  /// WORLD_SIZE, one process. Errors name the variable.
  static Result<CheckpointerOptions> from_environment(std::string root);

  /// Ranks this process holds.
  int ranks_here() const { return local_ranks > 0 ? local_ranks : world_size; }
};

class Checkpointer;

/// An async save on its way: staged() says when its tensors may be modified, wait() when it is
/// written on every rank and committed (or why it did not commit). Waiting is optional: the
/// next save, load, finalize() or the Checkpointer's destruction finishes it anyway.
///
/// Thread-safety: as its Checkpointer.
class PendingSave {
 public:
  /// @return ok once step() is committed on every rank; otherwise why it was not.
  Status wait();
  /// Whether wait() would return at once (the commit or its failure is known). Asks the
  /// coordinator (in rank 0's process): one that does not answer within kDonePollLimit is taken
  /// for "not yet", until it has not answered for `timeout` (then wait() reports why).
  bool done() const;
  static constexpr std::chrono::milliseconds kDonePollLimit{500};
  /// Whether the save no longer reads this process's tensors (every bucket is staged), so that
  /// they may be modified; at once true unless staging_buckets > 0.
  bool staged() const;
  /// Blocks until staged(), at most `timeout`; the seconds waited. An error (the staging did
  /// not end within the limit: a disk that does not take the writes the next buckets wait for)
  /// means the save may still read the tensors: they must not be modified before staged().
  Result<double> wait_staged();
  /// The Checkpointer's CheckpointerOptions::timeout, the limit of each of its waits.
  std::chrono::milliseconds timeout() const;
  std::int64_t step() const { return step_; }
  /// How long async_save blocked its caller (the copy of the first buckets).
  double stall_s() const { return stall_s_; }

 private:
  friend class Checkpointer;
  class Impl;
  PendingSave(std::shared_ptr<Impl> impl, std::int64_t step, double stall_s)
      : impl_(std::move(impl)), step_(step), stall_s_(stall_s) {}
  std::shared_ptr<Impl> impl_;
  std::int64_t step_;
  double stall_s_;
};

/// Saves and loads the StateDicts of this process's ranks, collectively with every process of
/// the job: every rank calls save, async_save, load and finalize with the same step, and every
/// rank gets the same outcome (committed, or not and why, naming the failing rank). Sync or
/// async is chosen per call; tensors are read and written where they are (Tensor::from_blob
/// wraps your own memory), host or GPU. A sync save from host memory writes straight from the
/// tensors: no copy.
///
/// Before anything is written, the coordinator (in rank 0's process) makes the global plan from
/// every rank's: ranks must agree on the step and on every tensor, the blocks must tile each
/// tensor, replicated blocks are written once, by a balanced choice among their holders (one of
/// which must hold it with replica id 0). A rank that died, stalled or skipped the
/// save fails it on every rank within `timeout`, naming the rank; nothing is committed; once a
/// rank died, every later call says the job is broken. The process holding rank 0 takes the
/// root's lock for the job.
///
/// The rule for async saves: a tensor handed to async_save may be modified once staged() (with
/// staging_buckets 0: once async_save returned). A new save, a load or destruction first
/// finishes the pending save.
///
/// Thread-safety: every method may be called from any thread; calls run one at a time.
class Checkpointer {
 public:
  /// Checks nothing and starts nothing yet: the actors start (and the processes of the job find
  /// each other) at the first call, when the state's structure is known; a bad option is that
  /// call's error.
  explicit Checkpointer(CheckpointerOptions options);
  /// finalize(), then stops the actors; the process holding rank 0 first waits (at most
  /// `timeout`) for the others to close theirs. A pending save that cannot commit is logged as
  /// an error (call finalize() first to get it as a Status).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Optional, as the first call: starts the Checkpointer for `state` now (joining the job when
  /// it spans processes; collective, as save is) and, with `async`, reserves the host staging an
  /// async save of it takes and touches its pages, so that the first async_save's stall is its
  /// copy alone. Without it the first call starts everything, and the first async save
  /// allocates its staging inside its stall, at the price fresh pages have on the machine (on
  /// a virtual machine up to seconds per GiB). The staging held is then what the first async
  /// save would have taken: the whole state (and an eighth more; staging_buckets 0) or the ring
  /// of staging_buckets buckets; none for an object store's root (async saves there are sync).
  /// @return an error naming it after a call that started the Checkpointer (a save, async save,
  ///         load or prepare); it does not finish that call's pending save.
  Status prepare(const StateDict& state, bool async = true);
  Status prepare(StateDict&& state, bool async = true);
  Status prepare(const std::vector<StateDict>& states, bool async = true);
  Status prepare(std::vector<StateDict>&& states, bool async = true);

  /// prepare(states, true) on a thread of its own, as the first call: returns at once, so that
  /// the memory an async save copies into is reserved and touched while the caller goes on
  /// (builds its model, trains its first steps); then the first async_save's stall is its copy
  /// alone without the caller waiting for the reservation. Every later call first waits for it;
  /// if it failed, the next call returns why (once; a state it refused leaves that call to
  /// start the Checkpointer as a first call would).
  /// @return an error naming it after a call that started the Checkpointer.
  Status prepare_in_background(std::vector<StateDict> states);
  Status prepare_in_background(StateDict state);

  /// Saves `step` and returns once it is committed (written by every rank, metadata, tracker).
  /// save, async_save and load first finish a pending async save; if that one failed, the call
  /// returns its error ("the async save of step N failed, and the save of step M was not done
  /// (call it again): ...") without doing its own work, and the next call goes ahead.
  /// @pre this process holds one rank (else pass one state per rank).
  /// A const& state is copied once (its descriptors and tensor handles; never tensor data); a
  /// moved-in one is taken, which saves that copy (with 100,000 tensors, ~40 MB).
  Status save(std::int64_t step, const StateDict& state);
  Status save(std::int64_t step, StateDict&& state);
  Status save(std::int64_t step, const std::vector<StateDict>& states);
  Status save(std::int64_t step, std::vector<StateDict>&& states);

  /// Saves `step` in the background: returns once the first `staging_buckets` buckets (or all)
  /// are copied.
  Result<PendingSave> async_save(std::int64_t step, const StateDict& state);
  Result<PendingSave> async_save(std::int64_t step, StateDict&& state);
  Result<PendingSave> async_save(std::int64_t step, const std::vector<StateDict>& states);
  Result<PendingSave> async_save(std::int64_t step, std::vector<StateDict>&& states);

  /// Returns once no save reads this process's tensors any more (PendingSave::wait_staged).
  /// @return the longest wait of any of its ranks, in seconds.
  Result<double> fence();
  /// Whether fence() would return at once: no save reads this process's tensors.
  bool staged() const;

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
  std::shared_ptr<PendingSave::Impl> impl_;
};

}  // namespace stagehand
