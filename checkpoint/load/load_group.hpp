#pragma once

// The ranks of one process that load a checkpoint together share their reads.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/core/status.hpp"

namespace stagehand {

/// The ranks of one process whose loads are collective (each rank of a Checkpointer or of
/// stagehand-train's process loads the same step at about the same time): a saved chunk that
/// blocks of several of them need (a resharded load) is read and verified once, by one rank, and
/// copied into every block, so the process reads each byte range of the checkpoint once.
///
/// Protocol for the k-th load of each member (load_checkpoint does it):
/// 1. begin() takes the member's turn in round k; data_files() gives the round's open data files
///    (each file is opened and its header read once for the round).
/// 2. arrive() with the rank's planned jobs, or abstain() when the rank has none to offer (its
///    load failed before reading). arrive() waits until every member of round k has arrived, then
///    leaves in `jobs` those this rank runs: its own and shared chunks, which may fill other
///    members' blocks. If a member is not there within `arrival_limit`, or the members load
///    different folders, round k is not shared: each runs its own jobs.
/// 3. The rank reads, then depart() with its result: it waits until every member that arrived
///    with jobs has read (their reads fill its blocks) and returns the round's first error.
///
/// Thread-safety: members call from their own threads; a member's calls are in order.
class LoadGroup {
 public:
  LoadGroup(int size, std::chrono::milliseconds arrival_limit);

  struct Turn {
    std::uint64_t round = 0;
    /// Set by arrive(): whether the round is shared (then depart() waits for the others).
    bool shared = false;
  };

  /// Rank `member`'s turn at its next load.
  Turn begin(int member);
  /// The data files of `folder` on `fs` for the round of `turn`, shared by its members.
  std::shared_ptr<DataFiles> data_files(const Turn& turn, FileSystem& fs, const std::string& folder);
  /// Arrival with the rank's jobs (replaced by those it runs); `checkpoint_dir` is the folder it
  /// loads.
  void arrive(Turn& turn, const std::string& checkpoint_dir, std::vector<ChunkJob>& jobs);
  /// The rank has no jobs to offer at this turn (it failed before reading).
  void abstain(const Turn& turn);
  /// Rank `member`'s next load has no jobs to offer (it failed before it began).
  void abstain(int member) { abstain(begin(member)); }
  /// The rank has read (`read` is how that went); returns the round's first error.
  Status depart(const Turn& turn, Status read);

  int size() const { return size_; }

 private:
  struct Round {
    int arrived = 0;
    int readers = 0;  // members that arrived with jobs
    int departed = 0;
    int left = 0;  // members done with the round: the last one forgets it
    bool assigned = false;
    bool solo = false;  // not shared: a member was late or the folders differ
    std::string dir;
    std::vector<std::vector<ChunkJob>*> jobs;
    Status first_error;
    std::map<std::pair<const FileSystem*, std::string>, std::shared_ptr<DataFiles>> files;
  };


  void assign(Round& round);
  /// A member is done with round `index` (no reference to it is used after this).
  void leave(std::uint64_t index);

  const int size_;
  const std::chrono::milliseconds arrival_limit_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int, std::uint64_t> loads_;  // member -> loads so far
  std::map<std::uint64_t, Round> rounds_;
};

}  // namespace stagehand
