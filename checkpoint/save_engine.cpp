#include "stagehand/checkpoint/save_engine.hpp"

#include <atomic>
#include <future>
#include <utility>

#include "stagehand/checkpoint/writer.hpp"

namespace stagehand {

Result<std::unique_ptr<SaveEngine>> SaveEngine::create(int rank, SaveEngineOptions options,
                                                       std::shared_ptr<StorageBackend> storage) {
  if (rank < 0) return Status{ErrorCode::invalid_argument, "rank must not be negative"};
  if (options.thread_count < 1) {
    return Status{ErrorCode::invalid_argument, "ckpt_save_thread_count must be at least 1, got " +
                                                   std::to_string(options.thread_count)};
  }
  if (options.staging_buckets < 0 || options.staging_buckets > options.thread_count) {
    return Status{ErrorCode::invalid_argument,
                  "ckpt_save_staging_buckets must be between 0 and ckpt_save_thread_count (" +
                      std::to_string(options.thread_count) + "), got " +
                      std::to_string(options.staging_buckets)};
  }
  if (!storage) return Status{ErrorCode::invalid_argument, "no storage backend"};
  return std::unique_ptr<SaveEngine>(new SaveEngine(rank, std::move(options), std::move(storage)));
}

SaveEngine::SaveEngine(int rank, SaveEngineOptions options, std::shared_ptr<StorageBackend> storage)
    : rank_(rank),
      options_(std::move(options)),
      storage_(std::move(storage)),
      staging_(options_.pinned),
      writers_(options_.thread_count, options_.writer_thread_start) {}

int SaveEngine::wave_size() const {
  return options_.staging_buckets == 0 ? options_.thread_count : options_.staging_buckets;
}

Result<const SavePlan*> SaveEngine::plan_for(const StateDict& state) {
  SH_RETURN_IF_ERROR(state.validate());
  auto descs = state.descriptors();
  if (!plan_ || plan_->signature != structure_signature(descs)) {
    plan_ = plan_save(rank_, descs, options_.thread_count);
  }
  return &*plan_;
}

Status SaveEngine::prepare(const StateDict& state) {
  SH_ASSIGN_OR_RETURN(const SavePlan* plan, plan_for(state));
  if (options_.release_after_save) return Status::ok();
  return staging_.reserve(*plan, wave_size());
}

RankSaveReport SaveEngine::make_report(std::int64_t step) const {
  RankSaveReport report;
  report.rank = rank_;
  report.step = step;
  return report;
}

BucketWriteResult SaveEngine::stage_result(const PlannedBucket& bucket, const Status& staged) const {
  BucketWriteResult result;
  result.bucket = bucket.index;
  result.file = bucket.file_name;
  result.status = staged.with_context(bucket_context(bucket));
  return result;
}

std::vector<BucketWriteResult> SaveEngine::run_wave(
    int first, int last, const std::function<BucketWriteResult(const PlannedBucket&, std::uint8_t*)>& task) {
  std::vector<BucketWriteResult> results(static_cast<std::size_t>(last - first));
  std::vector<std::future<void>> done;
  for (int b = first; b < last; ++b) {
    done.push_back(writers_.submit([&, b] {
      results[static_cast<std::size_t>(b - first)] =
          task(plan_->buckets[static_cast<std::size_t>(b)], staging_.slot(static_cast<std::size_t>(b - first)));
    }));
  }
  for (auto& f : done) f.get();
  return results;
}

std::vector<BucketWriteResult> SaveEngine::write_wave(int first, int last, int parts, const StateDict* state,
                                                      const std::string& policy_dir,
                                                      std::vector<std::unique_ptr<WritableFile>>& unsynced,
                                                      const std::function<void()>& on_staged) {
  const auto n = static_cast<std::size_t>(last - first);
  std::vector<BucketWriteResult> results(n);
  std::vector<std::vector<std::size_t>> bounds(n);
  // Open every file of the wave and write its header.
  auto opened = run_wave(first, last, [&](const PlannedBucket& bucket, std::uint8_t*) {
    BucketWriteResult result;
    result.bucket = bucket.index;
    result.file = bucket.file_name;
    result.chunks.resize(bucket.items.size());
    auto file = open_bucket_file(*storage_, policy_dir, bucket);
    if (file.is_ok()) {
      unsynced[static_cast<std::size_t>(bucket.index)] = std::move(*file);
    } else {
      result.status = file.status().with_context(bucket_context(bucket));
    }
    return result;
  });
  // Stage (for a sync save) and write each bucket in `parts` runs of items, one writer thread each.
  std::vector<std::pair<std::size_t, std::size_t>> tasks;  // (bucket in wave, part)
  for (std::size_t j = 0; j < n; ++j) {
    results[j] = std::move(opened[j]);
    if (!results[j].status.is_ok()) continue;
    bounds[j] = split_items(plan_->buckets[static_cast<std::size_t>(first) + j], parts);
    for (std::size_t p = 0; p + 1 < bounds[j].size(); ++p) tasks.emplace_back(j, p);
  }
  std::vector<Status> part_status(tasks.size());
  std::vector<std::future<void>> done;
  // The last part to finish staging (staged or failed) runs on_staged.
  std::atomic<std::size_t> unstaged{tasks.size()};
  if (tasks.empty() && on_staged) on_staged();
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    done.push_back(writers_.submit([&, t] {
      auto [j, p] = tasks[t];
      const PlannedBucket& bucket = plan_->buckets[static_cast<std::size_t>(first) + j];
      std::uint8_t* slot = staging_.slot(j);
      Status st = state ? stage_items(bucket, bounds[j][p], bounds[j][p + 1], *state, slot) : Status::ok();
      if (unstaged.fetch_sub(1) == 1 && on_staged) on_staged();
      if (st.is_ok()) {
        st = write_bucket_items(*unsynced[static_cast<std::size_t>(bucket.index)], bucket, bounds[j][p],
                                bounds[j][p + 1], slot, results[j].chunks);
      }
      part_status[t] = st.is_ok() ? st : st.with_context(bucket_context(bucket));
    }));
  }
  for (auto& f : done) f.get();
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    auto& result = results[tasks[t].first];
    if (!part_status[t].is_ok() && result.status.is_ok()) result.status = part_status[t];
  }
  // The whole-file checksum, over the staged bytes.
  done.clear();
  for (std::size_t j = 0; j < n; ++j) {
    if (!results[j].status.is_ok()) continue;
    done.push_back(writers_.submit([&, j] {
      const PlannedBucket& bucket = plan_->buckets[static_cast<std::size_t>(first) + j];
      results[j].size = bucket.file_size();
      results[j].xxh3 = bucket_file_xxh3(bucket, staging_.slot(j));
    }));
  }
  for (auto& f : done) f.get();
  return results;
}

std::string SaveEngine::bucket_context(const PlannedBucket& bucket) const {
  return "rank " + std::to_string(rank_) + " bucket " + std::to_string(bucket.index) + " (" + bucket.file_name + ")";
}

RankSaveReport SaveEngine::save(const StateDict& state, const std::string& policy_dir,
                                std::int64_t step) {
  auto planned = plan_for(state);
  Status st = planned.is_ok() ? staging_.reserve(**planned, wave_size()) : planned.status();
  if (!st.is_ok()) {
    if (options_.release_after_save) staging_.release();
    RankSaveReport report = make_report(step);
    report.status = st.with_context("rank " + std::to_string(rank_));
    return report;
  }
  return save_in_waves(state, false, policy_dir, step, {});
}

RankSaveReport SaveEngine::save_in_waves(const StateDict& state, bool first_wave_staged,
                                         const std::string& policy_dir, std::int64_t step,
                                         const std::function<void()>& on_all_staged) {
  RankSaveReport report = make_report(step);
  report.objects = first_wave_staged ? staged_objects_ : state.objects;
  bool signalled = false;
  auto all_staged = [&] {
    if (std::exchange(signalled, true)) return;
    if (on_all_staged) on_all_staged();
  };
  // A wave of fewer buckets than writer threads splits each bucket among the idle threads, so
  // waves write as many streams at once as staging everything would. Files are fsynced together
  // at the end: a slot is free for the next wave once its bytes are written, not yet durable.
  const int buckets = static_cast<int>(plan_->buckets.size());
  const int parts = std::max(1, options_.thread_count / wave_size());
  std::vector<std::unique_ptr<WritableFile>> unsynced(static_cast<std::size_t>(buckets));
  for (int first = 0; first < buckets && report.status.is_ok(); first += wave_size()) {
    const int last = std::min(buckets, first + wave_size());
    const bool staged = first == 0 && first_wave_staged;
    std::function<void()> on_staged;
    if (last == buckets) on_staged = all_staged;
    if (staged && on_staged) on_staged();
    auto results = write_wave(first, last, parts, staged ? nullptr : &state, policy_dir, unsynced,
                              staged ? std::function<void()>{} : on_staged);
    for (auto& r : results) {
      if (!r.status.is_ok() && report.status.is_ok()) report.status = r.status;
      report.buckets.push_back(std::move(r));
    }
  }
  // Ended early on an error, or a plan without buckets: nothing reads the state any more.
  all_staged();
  finish_all(report, unsynced);
  if (options_.release_after_save) staging_.release();
  return report;
}

void SaveEngine::finish_all(RankSaveReport& report, std::vector<std::unique_ptr<WritableFile>>& unsynced) {
  std::vector<std::future<void>> done;
  for (auto& result : report.buckets) {
    auto& file = unsynced[static_cast<std::size_t>(result.bucket)];
    if (!file) continue;
    done.push_back(writers_.submit([&] { finish_bucket(rank_, std::move(file), result); }));
  }
  for (auto& f : done) f.get();
  for (const auto& r : report.buckets) {
    if (!r.status.is_ok() && report.status.is_ok()) report.status = r.status;
  }
}

Status SaveEngine::begin_async(const StateDict& state) {
  Status st = [&]() -> Status {
    auto planned = plan_for(state);
    if (!planned.is_ok()) return planned.status().with_context("rank " + std::to_string(rank_));
    SH_RETURN_IF_ERROR(staging_.reserve(**planned, wave_size()));
    const int buckets = static_cast<int>(plan_->buckets.size());
    auto results = run_wave(0, std::min(buckets, wave_size()), [&](const PlannedBucket& bucket, std::uint8_t* slot) {
      return stage_result(bucket, stage_bucket(bucket, state, slot));
    });
    for (const auto& r : results) SH_RETURN_IF_ERROR(r.status);
    return Status::ok();
  }();
  if (!st.is_ok()) {
    // No write follows to free them.
    if (options_.release_after_save) staging_.release();
    return st;
  }
  staged_objects_ = state.objects;
  return Status::ok();
}

RankSaveReport SaveEngine::write_async(const StateDict& state, const std::string& policy_dir, std::int64_t step,
                                       const std::function<void()>& on_all_staged) {
  return save_in_waves(state, true, policy_dir, step, on_all_staged);
}

}  // namespace stagehand
