#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/checkpoint/format.hpp"
#include "stagehand/core/status.hpp"
#include "stagehand/storage/object_store.hpp"

namespace stagehand {

/// A checkpoint root (`ckpt_path`) in an object store: the on-disk layout as keys under
/// `s3://bucket/prefix/`. Data objects go first, then trainer_state.json and the metadata, then
/// the tracker object: a step counts only when the tracker names it and its metadata exists.
///
/// Thread-safety: as Bucket; the methods that change the store are called by one owner (the
/// coordinator, or a rank for its own files).
class CloudCheckpoints {
 public:
  static Result<CloudCheckpoints> open(const std::string& url, const ObjectStoreOptions& options);

  // -- properties --

  Bucket& bucket() const { return *bucket_; }
  const ObjectUrl& root() const { return root_; }
  /// `s3://bucket/prefix/global_step_<N>`.
  std::string step_url(std::int64_t step) const;
  /// `prefix/global_step_<N>`.
  std::string step_key(std::int64_t step) const;

  // -- saving --

  /// Fails, each reason with its own error, when the endpoint cannot be reached, the credentials
  /// are refused or the bucket does not exist.
  Status check_access() const;
  /// Uploads one rank's data files of `step` from `local_policy_dir` (multipart when large).
  Status upload_rank_files(std::int64_t step, const std::string& local_policy_dir,
                           const std::vector<std::string>& files) const;
  /// Commits `step` whose data objects are all uploaded: uploads trainer_state.json from
  /// `local_step_dir` (when there), then the metadata, then the tracker.
  Status commit(std::int64_t step, const GatheredMetadata& metadata, const std::string& local_step_dir) const;

  // -- reading --

  /// The step the tracker names; nullopt when there is no tracker.
  Result<std::optional<std::int64_t>> read_tracker() const;
  /// Whether `step`'s metadata exists.
  Result<bool> is_committed(std::int64_t step) const;
  /// Steps whose metadata exists, ascending.
  Result<std::vector<std::int64_t>> committed_steps() const;

  // -- removing --

  /// Deletes every object of `step`, its metadata first so that the step stops counting at once.
  Status remove_step(std::int64_t step) const;
  /// Deletes the objects of steps without metadata (saves that never committed) and aborts the
  /// multipart uploads left open below the root. Call at start-up, before anything is saved.
  /// @return how many steps and uploads were cleaned.
  Result<int> clean_interrupted() const;

 private:
  struct StepObjects {
    std::vector<ObjectInfo> objects;
    /// Its metadata is among them.
    bool committed = false;
  };

  CloudCheckpoints(std::shared_ptr<Bucket> bucket, ObjectUrl root)
      : bucket_(std::move(bucket)), root_(std::move(root)) {}
  /// `prefix/global_step_<N>/policy/metadata.json`.
  std::string metadata_key(std::int64_t step) const;
  /// Every object below the root's `global_step_` keys, grouped by step.
  Result<std::map<std::int64_t, StepObjects>> objects_by_step() const;

  std::shared_ptr<Bucket> bucket_;
  ObjectUrl root_;
};

}  // namespace stagehand
