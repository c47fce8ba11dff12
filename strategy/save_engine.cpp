#include "strategy/save_engine.hpp"

#include <future>

#include "strategy/writer.hpp"

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
  result.status = staged.with_context("rank " + std::to_string(rank_) + " bucket " +
                                      std::to_string(bucket.index) + " (" + bucket.file_name + ")");
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

RankSaveReport SaveEngine::save(const StateDict& state, const std::string& policy_dir,
                                std::int64_t step) {
  RankSaveReport report = make_report(step);
  report.objects = state.objects;
  auto planned = plan_for(state);
  Status st = planned.is_ok() ? staging_.reserve(**planned, wave_size()) : planned.status();
  if (!st.is_ok()) {
    report.status = st.with_context("rank " + std::to_string(rank_));
    return report;
  }
  // Files are written wave after wave but fsynced together at the end: a slot is free for the
  // next wave as soon as its bytes are in the page cache, so waves do not wait for the disk.
  const int buckets = static_cast<int>(plan_->buckets.size());
  std::vector<std::unique_ptr<WritableFile>> unsynced(static_cast<std::size_t>(buckets));
  for (int first = 0; first < buckets && report.status.is_ok(); first += wave_size()) {
    auto results = run_wave(first, std::min(buckets, first + wave_size()),
                            [&](const PlannedBucket& bucket, std::uint8_t* slot) {
                              Status staged = stage_bucket(bucket, state, slot);
                              if (!staged.is_ok()) return stage_result(bucket, staged);
                              return write_bucket(*storage_, policy_dir, rank_, bucket, slot,
                                                  &unsynced[static_cast<std::size_t>(bucket.index)]);
                            });
    for (auto& r : results) {
      if (!r.status.is_ok() && report.status.is_ok()) report.status = r.status;
      report.buckets.push_back(std::move(r));
    }
  }
  finish_all(report, unsynced);
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

Status SaveEngine::stage_all(const StateDict& state) {
  if (wave_size() < options_.thread_count) {
    return {ErrorCode::invalid_argument,
            "an async save stages every bucket at once; ckpt_save_staging_buckets must be 0"};
  }
  auto planned = plan_for(state);
  if (!planned.is_ok()) return planned.status().with_context("rank " + std::to_string(rank_));
  SH_RETURN_IF_ERROR(staging_.reserve(**planned, wave_size()));
  auto results = run_wave(0, static_cast<int>(plan_->buckets.size()),
                          [&](const PlannedBucket& bucket, std::uint8_t* slot) {
                            return stage_result(bucket, stage_bucket(bucket, state, slot));
                          });
  for (const auto& r : results) SH_RETURN_IF_ERROR(r.status);
  staged_objects_ = state.objects;
  return Status::ok();
}

RankSaveReport SaveEngine::write_staged(const std::string& policy_dir, std::int64_t step) {
  RankSaveReport report = make_report(step);
  report.objects = staged_objects_;
  std::vector<std::unique_ptr<WritableFile>> unsynced(plan_->buckets.size());
  report.buckets = run_wave(0, static_cast<int>(plan_->buckets.size()),
                            [&](const PlannedBucket& bucket, std::uint8_t* slot) {
                              return write_bucket(*storage_, policy_dir, rank_, bucket, slot,
                                                  &unsynced[static_cast<std::size_t>(bucket.index)]);
                            });
  finish_all(report, unsynced);
  return report;
}

}  // namespace stagehand
