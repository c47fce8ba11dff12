#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "stagehand/config/origins.hpp"

namespace stagehand {

enum class TrainerKind { sync, fully_async, sft };
enum class ResumeMode { none, latest, from_path };
/// Host staging buffers: kept for the run, or freed when each save's last bucket is written.
enum class StagingMemory { persistent, per_save };
/// How a process reaches the local tier's folders of other hosts: by path (every host's folder
/// reachable from every process), or through that host's file server over TCP (each disk seen
/// by its own host's processes only).
enum class HostTransport { file_system, network };
/// How the trainer ranks push weights to inference: the weight-sync channel over shared memory
/// (every rank and receiver on one host), or, for the fully-async trainer's generators only, the
/// tensor-parallel group's collectives (ranks on several hosts).
enum class WeightTransport { shm, tcp, collective };

/// The YAML name of each value ("fully_async", "from_path", "per_save").
const char* to_string(TrainerKind kind);
const char* to_string(ResumeMode mode);
const char* to_string(StagingMemory memory);
const char* to_string(HostTransport transport);
const char* to_string(WeightTransport transport);

/// `trainer:` keys.
struct TrainerConfig {
  TrainerKind kind = TrainerKind::sync;
  std::int64_t total_steps = 100;
  std::string ckpt_path = "checkpoints";
  /// Steps between saves; 0 saves only at the last step.
  std::int64_t ckpt_interval = 0;
  /// Committed checkpoints to keep; 0 keeps all.
  std::int64_t max_ckpts_to_keep = 0;
  /// With retention (max_ckpts_to_keep > 0), no local tier and a local ckpt_path: the data files
  /// of the steps retention removes are kept (one per name, in `<ckpt_path>/.spare_files`) and
  /// the next save writes over them, instead of freeing them and allocating as much disk again.
  /// false: freed at once.
  bool ckpt_reuse_files = true;
  ResumeMode resume_mode = ResumeMode::none;
  std::string resume_path;
  std::uint64_t seed = 1234;
  /// Limit of every wait on the dispatch, a Worker or the coordinator, in seconds.
  std::int64_t call_timeout_s = 600;
  /// Lets a run start from scratch (resume_mode none, or latest without a tracker) over a
  /// ckpt_path that already holds committed checkpoints: its saves then replace steps of the same
  /// number, and retention may delete the others. False refuses such a start, naming what exists.
  bool overwrite_checkpoints = false;
  /// A fresh run (nothing to resume) starts from the weights of this checkpoint: a Stagehand
  /// checkpoint root or step folder of any trainer kind and layout, or a Hugging Face safetensors
  /// folder. Empty: from the seeded initialization. A resume takes precedence.
  std::string init_from;
  /// Load the optimizer state (fp32 main weights, moments, step). Unset: yes for a resume, no
  /// for init_from (a fresh optimizer started from the loaded weights).
  std::optional<bool> load_optimizer;
  /// Load each rank's RNG state. Unset: yes for a resume, no for init_from. A rank the
  /// checkpoint has no RNG for re-derives it from the seed and the step.
  std::optional<bool> load_rng;
  /// A tensor the checkpoint lacks, or has but the model does not, fails the load; false lets
  /// the load go on with one warning line naming them.
  bool load_strict = true;
  /// Every this many steps (when > 0; a multiple of ckpt_interval) the committed checkpoint is
  /// also exported to export_path in the Hugging Face layout (model weights as saved), in the
  /// background: no training step waits for it, and a failed export is reported and leaves the
  /// checkpoint untouched.
  std::int64_t export_interval = 0;
  /// Local folder of the periodic exports: `<export_path>/global_step_<N>/`.
  std::string export_path;
  /// The local tier (empty: none): a node-local folder (local disk, /dev/shm) that every save
  /// commits into, in the usual layout with its own tracker, every local_ckpt_interval steps.
  /// ckpt_path is then the durable tier: every ckpt_interval steps (and at the last step) the
  /// committed local checkpoint is copied there in the background, checked by size and XXH3,
  /// its metadata and tracker written last. resume_mode latest takes the newest step that
  /// loads whole from either tier. "{host}" in it (say `/local/{host}/ckpt`) gives each host
  /// its own folder (trainer.ranks_per_host), reached by path from every process or through its
  /// host's file server (local_replication_transport).
  std::string local_ckpt_path;
  /// Steps between saves to the local tier (with local_ckpt_path).
  std::int64_t local_ckpt_interval = 1;
  /// Committed checkpoints the local tier keeps; 0 keeps all. The step being copied into the
  /// durable tier, and the newest one the durable tier lacks, are kept whatever it says.
  std::int64_t local_max_ckpts_to_keep = 2;
  /// The data files of the local tier's retired steps are kept (one per name, in
  /// `<local_ckpt_path>/.spare_files`) and the next save writes over them, instead of freeing
  /// them and allocating as much again (in /dev/shm, zeroed memory). false: freed at once.
  bool local_ckpt_reuse_files = true;
  /// Ranks per host, for a local tier spread over hosts: rank r lives on host r /
  /// ranks_per_host. 0: every rank on one host.
  std::int64_t ranks_per_host = 0;
  /// Copies of each rank's local-tier files, its own host's included: with
  /// local_ckpt_path holding "{host}" (each host's own folder), each rank's data files also go
  /// to the folders of local_replication_factor - 1 other hosts, so that a resume can take a
  /// lost host's parts from them. 1: no replicas.
  std::int64_t local_replication_factor = 1;
  /// Hosts between one copy and the next: rank r's copies are on hosts h, h + stride, ...
  /// (modulo the number of hosts), h its own.
  std::int64_t local_replication_stride = 1;
  /// How each process reaches the other hosts' folders of a local tier with "{host}":
  /// file_system, by their paths (each host's disk exported to the others, or folders of one
  /// machine); network, where each host's disk is seen by its own processes only: the first
  /// rank's process of each host serves its host's folder, and the others' replicas, metadata
  /// and tracker reach it (and a resume's check reads it) through that server over TCP. Needs one
  /// process per rank.
  HostTransport local_replication_transport = HostTransport::file_system;
};

/// Where saves commit: local_ckpt_path when there is a local tier, else ckpt_path.
inline const std::string& save_root(const TrainerConfig& t) {
  return t.local_ckpt_path.empty() ? t.ckpt_path : t.local_ckpt_path;
}

/// `megatron_config:` keys.
struct MegatronConfig {
  bool async_dist_ckpt_save = false;
  /// Buckets staged at a time; 0 stages every bucket at once. With async_dist_ckpt_save, the
  /// save returns once the first N are staged and stages the rest in the background; the state
  /// must then be fenced before it is modified.
  std::int64_t ckpt_save_staging_buckets = 0;
  /// persistent: staging buffers live for the run; per_save: freed after each save.
  StagingMemory ckpt_staging_memory = StagingMemory::persistent;
  /// Buckets (and writer threads) per rank.
  std::int64_t ckpt_save_thread_count = 2;
  /// Threads reading a checkpoint at once when a rank loads (coalesced reads in parallel).
  std::int64_t ckpt_load_thread_count = 4;
  /// Writer threads run at lowered CPU and I/O priority (nice 10, best-effort I/O level 7).
  bool ckpt_writer_low_priority = true;
  /// New data files are written around the page cache (O_DIRECT) where the file system takes it:
  /// no page allocated, copied into or left dirty (SaveEngineOptions::uncached_writes).
  bool ckpt_save_uncached = true;
  /// Where saves to an object store are written before upload.
  std::string local_work_dir = "/tmp/stagehand-work";
  /// Each rank's checkpoint writes together move at most this many MiB/s; 0: unlimited.
  double ckpt_write_rate_limit_mib_s = 0;
};

/// `parallel:` keys.
struct ParallelConfig {
  std::int64_t tensor_parallel = 1;
  std::int64_t data_parallel = 1;
};

/// `fully_async:` keys.
struct FullyAsyncConfig {
  std::int64_t max_staleness_steps = 1;
  std::int64_t num_generators = 2;
};

/// `weight_sync:` keys (docs/weight_sync.md).
struct WeightSyncConfig {
  WeightTransport transport = WeightTransport::shm;
  /// The channel every trainer rank pushes each step's weights to, for receivers outside the run
  /// (stagehand.WeightReceiver): a name with transport shm, trainer rank 0's "HOST:PORT" with
  /// transport tcp; empty: none. The fully-async trainer's generators use it too; without one, a
  /// channel of the run's own (tcp: 127.0.0.1 in one process, the master address and the master
  /// port + 1 across processes).
  std::string channel;
  /// The tensors pushed: those whose names start with this.
  std::string tensors = "model.";
  /// Receivers outside the run each push waits for (at most receiver_timeout_s) before it starts;
  /// 0: a push serves whoever waits then.
  std::int64_t receivers = 0;
  /// MiB of one bucket of a rank's ring (2 buckets).
  std::int64_t bucket_mib = 64;
  /// How long a push waits for one receiver to take a bucket before it drops it from the version.
  std::int64_t receiver_timeout_s = 10;
};

/// `storage.s3:` keys; credentials come from the AWS environment variables.
struct S3Config {
  /// Base URL (http:// or https://); empty: AWS_ENDPOINT_URL, else AWS S3 or Cloud Storage.
  std::string endpoint;
  /// Signing region; empty: AWS_REGION, else us-east-1 (auto for gs://).
  std::string region;
  /// `<endpoint>/<bucket>/<key>` (true) or `<bucket>.<host>/<key>` (false).
  bool path_style = true;
  /// Files of at least this many MiB go up as multipart uploads.
  std::int64_t multipart_threshold_mib = 64;
  /// MiB per part; at least 5 and at most multipart_threshold_mib.
  std::int64_t part_size_mib = 16;
  /// Parts and files each rank uploads at once.
  std::int64_t upload_threads = 4;
  /// Tries per request before giving up (throttling, 5xx, time-outs, broken connections).
  std::int64_t max_attempts = 5;
};

struct StorageConfig {
  S3Config s3;
};

/// `model:` keys of the reference workload (an MLP policy on a contextual bandit).
struct ModelConfig {
  std::int64_t context_dim = 16;
  std::int64_t num_arms = 8;
  /// Hidden width; scales the state from kilobytes to gigabytes. Divisible by tensor_parallel.
  std::int64_t hidden = 64;
  /// Contexts per step across all data-parallel ranks; divisible by data_parallel.
  std::int64_t batch_size = 64;
  /// Actions sampled per context (GRPO group).
  std::int64_t group_size = 8;
  double learning_rate = 0.01;
  std::int64_t eval_contexts = 512;
};

/// The whole YAML configuration with its defaults. load_config_file() and load_config_string()
/// (load.hpp) read one and check it (validate_config(), rules.hpp); the reference model checks
/// its own limits on it (models/bandit_limits.hpp).
struct Config {
  TrainerConfig trainer;
  MegatronConfig megatron_config;
  ParallelConfig parallel;
  FullyAsyncConfig fully_async;
  WeightSyncConfig weight_sync;
  StorageConfig storage;
  ModelConfig model;
  /// Where each key was given, so that a rule checked after loading, here or in a layer above,
  /// names its line or override; empty for a Config built in code.
  ConfigOrigins origins;
};

}  // namespace stagehand
