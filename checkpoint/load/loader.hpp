#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format/format.hpp"
#include "stagehand/core/sharded_tensor.hpp"
#include "stagehand/storage/file_system.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

class LoadGroup;

/// megatron_config.ckpt_load_thread_count's default.
inline constexpr int kDefaultLoadThreadCount = 4;

/// The largest read of a load from a file system whose reads are cheap
/// (FileSystemCapabilities::cheap_reads): small enough that the bytes a read brought are still in
/// the core's cache when they are hashed, so that the hash does not read them back from memory
/// (docs/benchmarks.md, "Reads that stay in the cache"). 256 KiB: warm loads measured 10-12%
/// faster than with 1 MiB (a core's whole L2 on one development machine, half of it on another),
/// 128 KiB no faster, cold loads the same within the disk's noise.
inline constexpr std::uint64_t kCheapReadBytes = 1u << 18;

/// How load_checkpoint reads.
struct LoadOptions {
  /// Reads in flight at once (megatron_config.ckpt_load_thread_count), at least 1.
  int thread_count = kDefaultLoadThreadCount;
  /// Each thread's host buffer for chunks that cannot be read straight into their tensor (a
  /// resharded block, device memory): host memory stays under thread_count x buffer_bytes
  /// whatever the state's size. At least 4096.
  std::size_t buffer_bytes = 8u << 20;
  /// Largest single read (one preadv, one ranged GET): neighbouring chunks of a file are
  /// coalesced up to this size, larger chunks read in reads of this size; each read is hashed
  /// right after it lands. Where reads are cheap (a local file system), each such range is read
  /// in reads of at most kCheapReadBytes, which are still in the CPU's cache when hashed.
  std::uint64_t max_read_bytes = 8u << 20;

  // -- what the load fills (Checkpointable::load_selection) --

  /// Tensors and objects of the state, by name, that the load leaves as they are.
  std::set<std::string> skip;
  /// Tensors of the state filled from a saved tensor of another name: live name -> saved name
  /// (an fp32 master copy filled from the saved weights, say). Needs convert_dtypes when the
  /// dtypes differ.
  std::map<std::string, std::string> sources;
  /// Objects of the state that may be missing from the checkpoint (a rank's RNG in a checkpoint
  /// saved by fewer ranks): left as they are and listed in LoadReport::missing_objects.
  std::set<std::string> optional_objects;
  /// True: a tensor or object of the state that the checkpoint lacks is an error (objects in
  /// optional_objects aside). False: it is left as it is and listed in
  /// LoadReport::missing_tensors or missing_objects.
  bool strict = true;
  /// True: a tensor the checkpoint has but the state neither holds, skips nor takes as a source
  /// (one the model does not have) is an error; false: it is listed in LoadReport::unused_tensors.
  bool refuse_unused = false;
  /// True: LoadReport::unused_tensors is filled (it costs each rank a pass over every tensor name
  /// of the checkpoint). Also on with refuse_unused, or when not strict.
  bool list_unused = false;
  /// True: a saved floating-point tensor of another floating-point dtype than the live one is
  /// converted (round to nearest even) instead of refused.
  bool convert_dtypes = false;
};

/// Which parts of a checkpoint a trainer's load takes (trainer.load_optimizer, trainer.load_rng,
/// trainer.load_strict); each model maps it onto LoadOptions (Checkpointable::load_selection).
struct LoadScope {
  /// The optimizer state (fp32 main weights, moments, its step). False: the model restarts its
  /// optimizer from the loaded weights.
  bool optimizer = true;
  /// Each rank's RNG state. False: re-derived from the seed, the step and the rank.
  bool rng = true;
  /// Tensors the checkpoint lacks, or has but the model does not, are errors (else warnings).
  bool strict = true;
};

/// The LoadOptions fields that a LoadScope sets for a state whose names follow Stagehand's
/// conventions: with `scope.optimizer` false, tensors and objects named `optimizer.*` and the
/// object `scheduler` are skipped; with `scope.rng` false, objects named `rng.*` are skipped;
/// objects named `rng.*` are always optional (a checkpoint saved by fewer ranks lacks some);
/// `strict` follows `scope.strict`; unused tensors are listed, not refused (a rank of a
/// pipeline-parallel model holds only some tensors: whether the model lacks one is known only
/// once every rank's list is in, see WorkerDispatch); dtypes are converted.
LoadOptions load_selection_by_name(const StateDict& state, const LoadScope& scope);

/// What one load did and where its time went. The phase times are summed over the loader's
/// threads (thread-seconds: with several threads they may add up to more than `total_s`).
struct LoadReport {
  /// Wall time of the whole load, metadata and headers included.
  double total_s = 0;
  /// Waiting for reads (file system or ranged GETs).
  double read_s = 0;
  /// Hashing chunks (XXH3).
  double verify_s = 0;
  /// Copying from the loader's buffers into tensors (host memory or device).
  double copy_s = 0;
  /// Chunk bytes read (headers not included).
  std::uint64_t bytes = 0;
  /// Reads issued for chunk bytes, after coalescing.
  std::uint64_t reads = 0;
  /// Chunks read, and how many of them straight into their tensor's memory.
  std::uint64_t chunks = 0;
  std::uint64_t direct_chunks = 0;
  /// Host buffer bytes the load held at once at most (also charged to staging_memory()).
  std::uint64_t buffer_peak_bytes = 0;
  /// Threads that read.
  int thread_count = 0;
  /// Tensors of the state the checkpoint lacks (LoadOptions::strict false), sorted.
  std::vector<std::string> missing_tensors;
  /// Objects the checkpoint lacks that the load let pass (optional ones, or any when not strict),
  /// sorted.
  std::vector<std::string> missing_objects;
  /// Tensors of the checkpoint the load did not use (neither in the state, skipped nor a
  /// source), sorted; listed only with LoadOptions::list_unused or refuse_unused, or when not
  /// strict.
  std::vector<std::string> unused_tensors;
};

// -- for CAF's serialization: scopes, selections and reports travel between actors --

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadOptions& x) {
  return f(x.thread_count, x.buffer_bytes, x.max_read_bytes, x.skip, x.sources, x.optional_objects, x.strict,
           x.refuse_unused, x.list_unused, x.convert_dtypes);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadScope& x) {
  return f(x.optimizer, x.rng, x.strict);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LoadReport& x) {
  return f(x.total_s, x.read_s, x.verify_s, x.copy_s, x.bytes, x.reads, x.chunks, x.direct_chunks,
           x.buffer_peak_bytes, x.thread_count, x.missing_tensors, x.missing_objects, x.unused_tensors);
}

/// Fills every tensor of `state` from the checkpoint (replicas included), and every object that
/// `state` names (a rank's own objects, not the other ranks').
/// Only the byte ranges of chunks that overlap each local block are read (ranged GETs from an
/// object store), on `options.thread_count` threads; neighbouring ranges of one file are
/// coalesced into one read (coalesce_ranges). A saved chunk that fills contiguous memory of a
/// host tensor (the same shape as the block, or a run of whole rows) is read straight into the
/// tensor; any other (a resharded block, device memory) goes through the threads' bounded host
/// buffers. Each chunk is checked against its file's safetensors header entry before anything is
/// read, and its XXH3 after. The saved and the live sharding may differ: the saved chunks are
/// proven to tile each tensor (validate_metadata), so every element of every local block is
/// filled from exactly one chunk.
/// @post on an error found before reading (metadata, a tensor missing or of another dtype or
///       shape, elements not covered, a missing or truncated file, a header entry that disagrees,
///       a missing object), no tensor or object of `state` has been modified. On an error while
///       reading or verifying (an I/O error, a checksum mismatch) the objects are unmodified but
///       the tensors' contents are unspecified (bytes are read straight into them): the load
///       failed and the state must not be used as loaded (the Worker, the dispatch, the trainers
///       and Checkpointer report such a load as a failure).
/// `checkpoint_dir` is a committed `global_step_N` folder or a safetensors folder on `fs`
/// (resolve_checkpoint turns a root into one).
/// A saved chunk that several blocks of `state` need (two live tensors from one saved one) is
/// read once and copied into each.
/// @param report when not null, filled (also on error, with what was done).
/// @param group when not null, the ranks of this process that load together (`member` is this
///        rank): a chunk that blocks of several of them need is read once for all (LoadGroup);
///        the load then returns when every member's reads are done, with the group's first error.
Status load_checkpoint(FileSystem& fs, const std::string& checkpoint_dir, StateDict& state,
                       const LoadOptions& options, LoadReport* report = nullptr, LoadGroup* group = nullptr,
                       int member = 0);

/// load_checkpoint on default_file_system(store) with the default LoadOptions.
Status load_checkpoint(const std::string& checkpoint_dir, StateDict& state,
                       const ObjectStoreOptions& store = ObjectStoreOptions::from_environment());

}  // namespace stagehand
