#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "stagehand/checkpoint/save/planner.hpp"
#include "stagehand/checkpoint/save/report.hpp"
#include "stagehand/checkpoint/save/stager.hpp"
#include "stagehand/checkpoint/save/writer.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/core/thread_pool.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

struct SaveEngineOptions {
  /// Buckets per rank, and writer threads.
  int thread_count = 2;
  /// Host staging memory, in buckets (the largest bucket's bytes each); 0: as much as the
  /// whole shard. See staging_slot_sizes().
  int staging_buckets = 0;
  /// Pin the staging buffers (when the state lives on a GPU).
  bool pinned = false;
  /// Runs once in every writer thread before its first task.
  std::function<void()> writer_thread_start = nullptr;
  /// Free the staging buffers when a save's last bucket is written (ckpt_staging_memory:
  /// per_save); otherwise they are kept for the next save (persistent).
  bool release_after_save = false;
  /// Copy host-resident tensors out through the staging buffers too, as device memory must be
  /// (stagehand-bench --source device on a machine without a GPU). Otherwise a sync save writes
  /// host-resident tensors straight from their memory.
  bool stage_host_memory = false;
  /// Start the write-back of every written range at once (sync_file_range, on a thread of the
  /// save's own: BackgroundWriteback), so that the fsync at the end has little left to do and
  /// dirty pages never pile up.
  bool early_writeback = true;
  /// Write new bucket files around the page cache (O_DIRECT, FileSystem::create_file_uncached;
  /// megatron_config.ckpt_save_uncached): no page allocated, copied into or left dirty. Staged
  /// pieces are placed at the offset within a 4096-byte block that their file bytes have and go
  /// to the device from their slot; a sync save of host-resident tensors copies each
  /// kBounceBytes through a bounce block of the engine's (one per bucket being written).
  /// The partial blocks at a write's ends go through the cache. A retired step's file written
  /// over (reusing_file_system) goes around the cache too (reuse_file_uncached); a folder kept in
  /// memory, and a store without O_DIRECT, are written as usual.
  bool uncached_writes = false;
};

/// One rank's checkpoint writer: plans the rank's chunks into buckets and writes each bucket file
/// on its own writer thread, streaming: chunk and file checksums are taken in the same pass.
///
/// Where the bytes come from:
/// - a sync save of host-resident tensors writes from the tensors' memory with no staging slots:
///   straight from it into cached files, through one bounce block per bucket into uncached ones;
/// - device memory, and every async save (a snapshot), passes through a ring of host staging
///   slots: a piece of a bucket is staged as soon as any slot is free, then hashed and written,
///   and its slot is free again; copies, checksums and writes of different buckets overlap.
/// Writer threads and staging slots are created once and reused by every save.
///
/// Thread-safety: one save at a time (the owner serializes calls).
class SaveEngine {
 public:
  /// Checks the options; errors name the bad option.
  static Result<std::unique_ptr<SaveEngine>> create(int rank, SaveEngineOptions options,
                                                    std::shared_ptr<FileSystem> fs = local_file_system());
  ~SaveEngine();
  SaveEngine(const SaveEngine&) = delete;
  SaveEngine& operator=(const SaveEngine&) = delete;

  // -- properties --

  int rank() const { return rank_; }
  const SaveEngineOptions& options() const { return options_; }
  /// Bytes of host staging buffers held now; may be read from any thread.
  std::size_t staging_bytes() const { return staging_.bytes(); }
  /// Bytes of the blocks a sync save of host memory copies through into uncached files
  /// (uncached_writes): at most one block per writer thread.
  std::size_t bounce_bytes() const { return bounces_.bytes(); }
  /// Whether the last begin_async() left pieces to stage in the background, so that the state
  /// must not change before write_async()'s `on_all_staged`.
  bool stages_in_background() const { return unstaged_.load() > 0; }

  // -- saving --

  /// The plan for `state`, made anew only when its structure changed.
  Result<const SavePlan*> plan_for(const StateDict& state);

  /// Plans `state` and, unless the buffers are freed after every save, allocates the staging
  /// buffers that saves (async ones when `async`) of it will need now, so that the first save
  /// does not pay for them (pinned allocations of gigabytes take about a second). For an async
  /// snapshot of the whole shard (staging_buckets 0), an eighth more: the first save's global
  /// plan may give this rank more to write than its own replicas.
  Status prepare(const StateDict& state, bool async);

  /// Writes every bucket of `state` into `policy_dir`. The first error stops the other buckets
  /// at their next piece.
  /// @post report.buckets holds one result per bucket, in bucket order.
  RankSaveReport save(const StateDict& state, const std::string& policy_dir, std::int64_t step);

  /// Starts an async save of `state`: stages as many pieces as the staging slots hold (every
  /// piece when staging_buckets is 0: the device-to-host copy), and its objects.
  /// With `policy_dir` (the folder write_async() will write) in a folder kept in memory
  /// (FileSystemCapabilities::in_memory: a local tier on /dev/shm) and a state in host memory,
  /// it opens the bucket files now, and a bucket whose file has memory for all its bytes
  /// (WritableFile::memory_at: a file written over, mapped) is staged straight into it, whole,
  /// with no staging slot: the snapshot is one copy, each block hashed from the cache right
  /// after it is copied, and write_async() only commits the file. With staging_buckets k > 0
  /// only the first k such buckets are copied now, and write_async() copies the others (as it
  /// stages what did not fit the slots: the state must stay unchanged until `on_all_staged`).
  /// When every bucket went there, the staging memory is given back.
  /// The calling thread copies too, beside the writer threads: a copy the caller waits for runs
  /// at the caller's priority, not only at the writers' lowered one.
  Status begin_async(const StateDict& state, const std::string& policy_dir = {});

  /// Finishes what begin_async() started, into `policy_dir`: writes the staged pieces, and
  /// stages and writes the rest from `state` as slots free up. `on_all_staged` runs once, as soon
  /// as every piece is staged (at once when begin_async staged them all), or when the save ends
  /// early on an error; from then on the save never reads `state` again, so the state may be
  /// modified. May run on another thread than begin_async, never concurrently with another call
  /// on this engine.
  /// @pre the last begin_async() succeeded, with the same `state` (and the same `policy_dir`
  ///      if it was given one), which is not modified before `on_all_staged` runs
  RankSaveReport write_async(const StateDict& state, const std::string& policy_dir, std::int64_t step,
                             const std::function<void()>& on_all_staged);

 private:
  SaveEngine(int rank, SaveEngineOptions options, std::shared_ptr<FileSystem> fs);
  /// The copy stream that stages `bucket`'s pieces.
  CopyStream stream_of(const PlannedBucket& bucket) const;

  /// Whether saves of `state` copy it out through staging slots even when sync.
  bool copies_out(const StateDict& state) const;
  /// @param headroom an eighth more allocated and touched now (StagingPool::reserve).
  /// @param ahead called ahead of the saves (prepare): new memory is touched now, on every thread
  Status reserve_staging(const StateDict& state, bool async, bool headroom = false, bool ahead = false);
  RankSaveReport make_report(std::int64_t step) const;
  /// Writes every bucket, one writer thread each, straight from the state (`direct`) or through
  /// staging slots; `on_all_staged` as for write_async. `background`: an async save's write,
  /// which waits at the process's foreground gate (foreground_gate.hpp) before each piece of
  /// work while a caller is blocked on another save's staging.
  RankSaveReport write_buckets(const StateDict& state, bool direct, const std::string& policy_dir, std::int64_t step,
                               const std::function<void()>& on_all_staged, bool background);
  /// @param uploads `policy_dir` is in an object store (its sync is the upload).
  /// @param writeback where the write-back of written ranges starts (null: left to the fsync).
  /// @param background as for write_buckets.
  BucketWriteResult write_bucket(const PlannedBucket& bucket, const StateDict& state, bool direct,
                                 const std::string& policy_dir, bool uploads, const std::function<void()>& all_staged,
                                 BackgroundWriteback* writeback, bool background);
  std::string bucket_context(const PlannedBucket& bucket) const;
  /// Where staging slot `slot` holds the piece of `bucket` that starts at data byte `begin`
  /// (StagingPool::block_offset of its file offset).
  std::uint8_t* piece_memory(std::size_t slot, const PlannedBucket& bucket, std::uint64_t begin);
  /// Drops what a begin_async() prepared for its write_async(): gives back its slots, closes
  /// the files it opened.
  void drop_begun();
  /// Gives back the slots of staged pieces that no bucket will write any more.
  void give_back_prestaged(std::size_t bucket, std::size_t from_piece);

  int rank_;
  SaveEngineOptions options_;
  /// The process's copy engine and this engine's streams on it (one per writer thread).
  CopyEngine& copies_ = copy_engine();
  std::vector<CopyStream> streams_;
  std::shared_ptr<FileSystem> fs_;
  std::optional<SavePlan> plan_;
  /// Objects of the state that begin_async() staged.
  std::map<std::string, std::string> staged_objects_;
  StagingPool staging_;
  /// Per bucket, the slots of its first pieces, staged by begin_async().
  std::vector<std::vector<std::size_t>> prestaged_;
  /// By bucket: the file begin_async() opened (null: write_bucket opens it), and the memory of
  /// its data section when begin_async() staged the bucket straight into it (else null).
  std::vector<std::unique_ptr<WritableFile>> opened_;
  std::vector<std::uint8_t*> in_file_;
  /// By bucket: the checksums begin_async() took as it copied the bucket into its file (taken:
  /// write_async() only commits the file).
  struct InFileHash {
    bool taken = false;
    std::vector<ChunkRecord> chunks;
    std::uint64_t xxh3 = 0;
    double hash_s = 0;
  };
  std::vector<InFileHash> hashed_;
  /// By bucket: staged into its file by write_async(), not begin_async() (staging_buckets).
  std::vector<bool> copy_later_;
  /// Seconds begin_async() spent copying, and its threads' CPU seconds.
  double prestage_copy_s_ = 0;
  double prestage_cpu_s_ = 0;
  /// Seconds begin_async() spent opening files.
  double prestage_open_s_ = 0;
  /// Pieces of the current save not staged yet.
  std::atomic<std::size_t> unstaged_{0};
  /// Bounce blocks (hash_and_write) free for the next bucket, kept from save to save unless
  /// release_after_save.
  BlockPool bounces_{kBounceBytes};
  /// Set by the first bucket that fails: the others stop at their next piece.
  std::atomic<bool> failed_{false};
  ThreadPool writers_;
};

}  // namespace stagehand
