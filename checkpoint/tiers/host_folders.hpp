#pragma once

// A local tier spread over hosts (trainer.local_ckpt_path with "{host}"): each host's folder holds
// its own ranks' data files and replicas of other hosts', so that losing a host (its processes
// and its folder) loses no committed step; and the check a resume makes before it trusts a step.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"
#include "stagehand/storage/file_system.hpp"

namespace stagehand {

/// The placeholder of trainer.local_ckpt_path that names a host's folder.
inline constexpr const char* kHostPlaceholder = "{host}";

/// Which host holds what: rank r lives on host r / ranks_per_host; its data files are written to
/// its own host and to `replicas - 1` others, host + stride, host + 2 stride, ... (modulo the
/// host count), so that the copies lie in other failure domains.
struct HostPlacement {
  /// The folder pattern: a path holding kHostPlaceholder, replaced by the host's number.
  std::string pattern;
  int hosts = 1;
  int ranks_per_host = 1;
  /// Copies of each data file, its own host's included (1: none elsewhere).
  int replicas = 1;
  int stride = 1;

  /// An error naming what is wrong: no placeholder, a count below 1, more replicas than hosts,
  /// or a stride whose copies land on the same host twice.
  Status check() const;
  /// The host of rank `rank`.
  int host_of(int rank) const { return rank / ranks_per_host; }
  /// The hosts holding rank `rank`'s data files, its own first, then the replicas in order.
  std::vector<int> holders(int rank) const;
  /// Where copies of `path` are looked for: a data file's holders first (data_file_rank), then
  /// every other host in order; anything else in host order.
  std::vector<int> read_order(const std::string& path) const;
  /// `path` (which holds the pattern) on host `host`.
  std::string on_host(const std::string& path, int host) const;
  /// Host `host`'s own folder: the pattern's path component holding the placeholder (its disk),
  /// which must exist; what lies below it is made as needed.
  std::string disk(int host) const;
};

/// Builds the placement of trainer.local_ckpt_path's pattern for a world of `world_size` ranks:
/// `ranks_per_host` 0 puts every rank on one host.
HostPlacement host_placement(const std::string& pattern, int world_size, int ranks_per_host, int replicas,
                             int stride);

/// The rank a data file of the checkpoint layout belongs to ("__<rank>_<bucket>.safetensors"
/// in a step's policy folder), or -1 for any other path.
int data_file_rank(const std::string& path);

/// A FileSystem over `inner` for which every path holding the placement's pattern is the same
/// path in each host's folder:
/// - a data file (data_file_rank() >= 0) is written to every holder of its rank at once (each
///   append, write and sync goes to each; the first failure fails the write, naming the host's
///   path), and read from the first holder that has it, then from any other host;
/// - anything else (metadata.json, trainer_state.json, the tracker, folders, renames, removals,
///   the lock) is done in every host's folder, each in host order, and read from the first host
///   whose folder has it (the tracker: the first whose copy parses); a folder
///   lists what any host's holds, leaving out a host whose folder cannot be read while another
///   answers.
/// Each host's own folder, the one whose name holds the placeholder (its disk), must exist: every
/// change fails naming it when it does not ("is its disk mounted?"; an empty mount point of an
/// unmounted disk is a folder, and is not told apart); below it, what a lost host's folder lacks
/// is made again at the next change. Paths without the pattern go to `inner`
/// unchanged. invalid_argument when the placement does not check (HostPlacement::check).
///
/// Every folder must be reachable from every process of the job through `inner`: by path (the
/// hosts' disks exported to each other, or folders of one machine in tests), or through routes to
/// the other hosts' file servers (storage/routed_file_system.hpp, models/host_servers.hpp) when
/// each disk is seen by its own host only. Each process writes its own ranks' files and their
/// replicas, and the coordinator's process writes the rest.
Result<std::shared_ptr<FileSystem>> host_folders_file_system(std::shared_ptr<FileSystem> inner, HostPlacement placement);

/// The placement of `fs` when it is a host_folders_file_system; null otherwise.
const HostPlacement* host_placement_of(const FileSystem& fs);
/// The file system below `fs` (where each host's folder is reached) when it is a
/// host_folders_file_system; null otherwise.
FileSystem* host_folders_inner(FileSystem& fs);

/// In a local tier's root (in every host's folder): the number of hosts, ranks per host,
/// copies and stride its checkpoints were written with.
inline constexpr const char* kHostRecordFile = "host_folders.json";

/// Refuses, before a run uses the host folders of `root` (on a host_folders_file_system `fs`),
/// a placement with fewer hosts than some host's record says wrote them (the folders of the hosts
/// beyond would never be read, nor cleaned by retention), naming both. Other changes (ranks per
/// host, copies, stride) are allowed: reads fall back to every host, and a resume's check copies
/// parts to their new holders.
/// @return whether the record is owed: some host has none (a new or replaced host), or one of
///         fewer hosts. write_host_record() then, once the run has committed a step.
Result<bool> check_host_record(FileSystem& fs, const std::string& root);
/// Writes the record of `fs`'s placement into every host's folder of `root`.
Status write_host_record(FileSystem& fs, const std::string& root);

/// What check_host_copies found and did.
struct HostCheckReport {
  /// Data files read from a replica because their own host's folder lacks the step (the host
  /// was lost) or cannot be read: "rank 1's part '__1_0.safetensors' from host 2 (host 1's
  /// folder lacks the step)".
  std::vector<std::string> from_replicas;
  /// Copies rewritten from one that verifies: damaged or missing ones read before it, holders'
  /// copies after it that are missing or of the wrong size, and metadata.json where a host's
  /// differs: "host 1's copy of rank 1's part '__1_0.safetensors' from host 2".
  std::vector<std::string> repaired;
  /// Missing or under-sized copies that could not be rewritten (reads do not take them).
  std::vector<std::string> unrepaired;
};

/// Checks, before a resume trusts it, that every file of the committed step `checkpoint_dir`
/// (on a host_folders_file_system `fs`) has a copy that verifies by size and XXH3 against the
/// metadata: a data file on its own host, else on a replica, else anywhere; trainer_state.json on
/// any host. Each copy is read in read order until one verifies; the holders' copies after it are
/// only checked for size (a damaged replica behind a good copy is found when it is needed).
/// Every distinct metadata.json that checks is tried, in host order, and the first whose files
/// all have a good copy is the step's. Only then are copies rewritten (beside, read back, renamed
/// over): those reads would take before the good one, missing ones, replicas of the wrong size,
/// and every host's metadata.json that differs (a rewrite that fails is reported in `unrepaired`,
/// unless reads would take that copy first: then the step is refused). corruption when some file has no copy that
/// verifies, naming the rank, the file and what was wrong with each copy ("rank 3's part
/// '__3_0.safetensors': host 1 has none, host 2's copy has XXH3 ...; no replica verifies"), or
/// when a damaged copy that reads would take cannot be rewritten.
/// Single-threaded: it reads the whole step once. `should_stop` (when set) is asked before each
/// file: true fails the check as aborted, before anything is rewritten.
Result<HostCheckReport> check_host_copies(FileSystem& fs, const std::string& checkpoint_dir,
                                          const std::function<bool()>& should_stop = {});

}  // namespace stagehand
