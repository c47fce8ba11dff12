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

RankSaveReport SaveEngine::save(const StateDict& state, const std::string& policy_dir,
                                std::int64_t step) {
  RankSaveReport report;
  report.rank = rank_;
  report.step = step;
  report.objects = state.objects;
  auto planned = plan_for(state);
  if (!planned.is_ok()) {
    report.status = planned.status().with_context("rank " + std::to_string(rank_));
    return report;
  }
  const SavePlan& plan = **planned;
  const int wave = wave_size();
  Status reserved = staging_.reserve(plan, wave);
  if (!reserved.is_ok()) {
    report.status = reserved.with_context("rank " + std::to_string(rank_));
    return report;
  }

  const int buckets = static_cast<int>(plan.buckets.size());
  for (int first = 0; first < buckets && report.status.is_ok(); first += wave) {
    int last = std::min(buckets, first + wave);
    std::vector<BucketWriteResult> results(static_cast<std::size_t>(last - first));
    std::vector<std::future<void>> done;
    for (int b = first; b < last; ++b) {
      done.push_back(writers_.submit([&, b] {
        const PlannedBucket& bucket = plan.buckets[static_cast<std::size_t>(b)];
        std::uint8_t* buffer = staging_.slot(static_cast<std::size_t>(b - first));
        auto& result = results[static_cast<std::size_t>(b - first)];
        Status staged = stage_bucket(bucket, state, buffer);
        if (!staged.is_ok()) {
          result.bucket = b;
          result.file = bucket.file_name;
          result.status = staged.with_context("rank " + std::to_string(rank_) + " bucket " +
                                              std::to_string(b) + " (" + bucket.file_name + ")");
          return;
        }
        result = write_bucket(*storage_, policy_dir, rank_, bucket, buffer);
      }));
    }
    for (auto& f : done) f.get();
    for (auto& r : results) {
      if (!r.status.is_ok() && report.status.is_ok()) report.status = r.status;
      report.buckets.push_back(std::move(r));
    }
  }
  return report;
}

}  // namespace stagehand
