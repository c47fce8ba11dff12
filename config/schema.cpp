#include "stagehand/config/schema.hpp"

#include <charconv>
#include <cmath>
#include <initializer_list>
#include <type_traits>
#include <utility>

namespace stagehand {

namespace {

// Each bound below is what the program can run with; the error that refuses a value names it.

/// Every wait's deadline is now() plus the timeout in steady_clock nanoseconds, which overflow
/// past about 9.2e9 s; 1e6 s (11.5 days) is beyond any call that still makes progress.
constexpr std::int64_t kMaxCallTimeoutS = 1'000'000;
/// The fully-async trainer keeps this many batches generated ahead and stores them in each
/// checkpoint.
constexpr std::int64_t kMaxStalenessSteps = 1024;
/// The rate limiter schedules each write bytes / rate later on the steady_clock (int64
/// nanoseconds): near 0 one write overflows it, while at 1 KiB/s that takes 292 years of writes.
/// 1 TiB/s is beyond any storage.
constexpr double kMinWriteRateMiBs = 0.001;
constexpr double kMaxWriteRateMiBs = 1 << 20;
/// Adam moves each weight by about learning_rate per step, and the weights start below 1.
constexpr double kMaxLearningRate = 1.0;
/// No job has more ranks (rules.cpp's world-size limit), so no more hosts or copies.
constexpr std::int64_t kMaxRanks = 1024;

/// The shortest text that reads back as `value` ("1", "0.005", "1048576").
std::string number_text(double value) {
  char buffer[32];  // the longest double, -2.2250738585072014e-308, takes 24
  return std::string(buffer, std::to_chars(buffer, buffer + sizeof buffer, value).ptr);
}

/// The member that the chain of member pointers `kFirst, kRest...` reaches from `object`
/// (`&Config::trainer, &TrainerConfig::seed`: `object.trainer.seed`).
template <auto kFirst, auto... kRest, class Object>
auto& member(Object& object) {
  if constexpr (sizeof...(kRest) == 0) {
    return object.*kFirst;
  } else {
    return member<kRest...>(object.*kFirst);
  }
}

template <auto... kMembers>
auto field() {
  using T = std::remove_cvref_t<decltype(member<kMembers...>(std::declval<Config&>()))>;
  return ConfigField<T>{[](Config& c) -> T& { return member<kMembers...>(c); },
                        [](const Config& c) -> const T& { return member<kMembers...>(c); }};
}

template <auto... kMembers>
IntegerKey integer(std::int64_t lowest, std::int64_t highest = INT64_MAX) {
  return {field<kMembers...>(), {lowest, highest}};
}

template <auto... kMembers>
RealKey real(RealRange range) {
  return {field<kMembers...>(), range};
}

template <auto... kMembers>
BooleanKey boolean() {
  return {field<kMembers...>()};
}

template <auto... kMembers>
StringKey string(bool allow_empty) {
  return {field<kMembers...>(), allow_empty};
}

template <auto... kMembers, class E>
NameKey one_of(std::initializer_list<E> values) {
  NameKey key{{}, {}, [](Config& c, int value) { member<kMembers...>(c) = static_cast<E>(value); }};
  for (E value : values) {
    key.names.emplace_back(to_string(value));
    key.values.push_back(static_cast<int>(value));
  }
  return key;
}

Status check_in_range(const std::string& path, const IntegerRange& range, std::int64_t value,
                      const ConfigOrigins& origins) {
  if (range.contains(value)) return Status::ok();
  return origins.error({path}, "must be " + range.to_string() + ", got " + std::to_string(value));
}

constexpr auto kTrainer = &Config::trainer;
constexpr auto kMegatron = &Config::megatron_config;
constexpr auto kParallel = &Config::parallel;
constexpr auto kFullyAsync = &Config::fully_async;
constexpr auto kWeightSync = &Config::weight_sync;
constexpr auto kStorage = &Config::storage;
constexpr auto kS3 = &StorageConfig::s3;
constexpr auto kModel = &Config::model;

std::vector<ConfigKey> make_config_keys() {
  return {
      {"trainer.kind", one_of<kTrainer, &TrainerConfig::kind>(
                           {TrainerKind::sync, TrainerKind::fully_async, TrainerKind::sft})},
      {"trainer.total_steps", integer<kTrainer, &TrainerConfig::total_steps>(1)},
      {"trainer.ckpt_path", string<kTrainer, &TrainerConfig::ckpt_path>(false)},
      {"trainer.ckpt_interval", integer<kTrainer, &TrainerConfig::ckpt_interval>(0)},
      {"trainer.max_ckpts_to_keep", integer<kTrainer, &TrainerConfig::max_ckpts_to_keep>(0)},
      {"trainer.resume_mode", one_of<kTrainer, &TrainerConfig::resume_mode>(
                                  {ResumeMode::none, ResumeMode::latest, ResumeMode::from_path})},
      {"trainer.resume_path", string<kTrainer, &TrainerConfig::resume_path>(true)},
      {"trainer.seed", UnsignedKey{field<kTrainer, &TrainerConfig::seed>()}},
      {"trainer.call_timeout_s",
       integer<kTrainer, &TrainerConfig::call_timeout_s>(1, kMaxCallTimeoutS)},
      {"trainer.overwrite_checkpoints", boolean<kTrainer, &TrainerConfig::overwrite_checkpoints>()},
      {"trainer.init_from", string<kTrainer, &TrainerConfig::init_from>(true)},
      {"trainer.load_optimizer",
       OptionalBooleanKey{field<kTrainer, &TrainerConfig::load_optimizer>()}},
      {"trainer.load_rng", OptionalBooleanKey{field<kTrainer, &TrainerConfig::load_rng>()}},
      {"trainer.load_strict", boolean<kTrainer, &TrainerConfig::load_strict>()},
      {"trainer.export_interval", integer<kTrainer, &TrainerConfig::export_interval>(0)},
      {"trainer.export_path", string<kTrainer, &TrainerConfig::export_path>(true)},
      {"trainer.local_ckpt_path", string<kTrainer, &TrainerConfig::local_ckpt_path>(true)},
      {"trainer.local_ckpt_interval", integer<kTrainer, &TrainerConfig::local_ckpt_interval>(1)},
      {"trainer.local_max_ckpts_to_keep", integer<kTrainer, &TrainerConfig::local_max_ckpts_to_keep>(0)},
      {"trainer.ckpt_reuse_files", boolean<kTrainer, &TrainerConfig::ckpt_reuse_files>()},
      {"trainer.local_ckpt_reuse_files", boolean<kTrainer, &TrainerConfig::local_ckpt_reuse_files>()},
      {"trainer.ranks_per_host", integer<kTrainer, &TrainerConfig::ranks_per_host>(0, kMaxRanks)},
      {"trainer.local_replication_factor", integer<kTrainer, &TrainerConfig::local_replication_factor>(1, kMaxRanks)},
      {"trainer.local_replication_stride", integer<kTrainer, &TrainerConfig::local_replication_stride>(1, kMaxRanks)},
      {"trainer.local_replication_transport", one_of<kTrainer, &TrainerConfig::local_replication_transport>(
                                                  {HostTransport::file_system, HostTransport::network})},

      {"megatron_config.async_dist_ckpt_save",
       boolean<kMegatron, &MegatronConfig::async_dist_ckpt_save>()},
      {"megatron_config.ckpt_save_staging_buckets",
       integer<kMegatron, &MegatronConfig::ckpt_save_staging_buckets>(0)},
      {"megatron_config.ckpt_staging_memory",
       one_of<kMegatron, &MegatronConfig::ckpt_staging_memory>(
           {StagingMemory::persistent, StagingMemory::per_save})},
      {"megatron_config.ckpt_save_thread_count",
       integer<kMegatron, &MegatronConfig::ckpt_save_thread_count>(1, 256)},
      {"megatron_config.ckpt_load_thread_count",
       integer<kMegatron, &MegatronConfig::ckpt_load_thread_count>(1, 256)},
      {"megatron_config.ckpt_writer_low_priority",
       boolean<kMegatron, &MegatronConfig::ckpt_writer_low_priority>()},
      {"megatron_config.ckpt_save_uncached", boolean<kMegatron, &MegatronConfig::ckpt_save_uncached>()},
      {"megatron_config.local_work_dir", string<kMegatron, &MegatronConfig::local_work_dir>(false)},
      {"megatron_config.ckpt_write_rate_limit_mib_s",
       real<kMegatron, &MegatronConfig::ckpt_write_rate_limit_mib_s>(
           {.lowest = kMinWriteRateMiBs, .highest = kMaxWriteRateMiBs, .zero_turns_off = true})},

      {"parallel.tensor_parallel", integer<kParallel, &ParallelConfig::tensor_parallel>(1, 1024)},
      {"parallel.data_parallel", integer<kParallel, &ParallelConfig::data_parallel>(1, 1024)},

      {"fully_async.max_staleness_steps",
       integer<kFullyAsync, &FullyAsyncConfig::max_staleness_steps>(0, kMaxStalenessSteps)},
      {"fully_async.num_generators",
       integer<kFullyAsync, &FullyAsyncConfig::num_generators>(1, 1024)},

      {"weight_sync.transport", one_of<kWeightSync, &WeightSyncConfig::transport>(
                                    {WeightTransport::shm, WeightTransport::tcp, WeightTransport::collective})},
      {"weight_sync.channel", string<kWeightSync, &WeightSyncConfig::channel>(true)},
      {"weight_sync.tensors", string<kWeightSync, &WeightSyncConfig::tensors>(true)},
      {"weight_sync.receivers", integer<kWeightSync, &WeightSyncConfig::receivers>(0, 1024)},
      {"weight_sync.bucket_mib", integer<kWeightSync, &WeightSyncConfig::bucket_mib>(1, 1 << 16)},
      {"weight_sync.receiver_timeout_s",
       integer<kWeightSync, &WeightSyncConfig::receiver_timeout_s>(1, kMaxCallTimeoutS)},

      {"storage.s3.endpoint", string<kStorage, kS3, &S3Config::endpoint>(true)},
      {"storage.s3.region", string<kStorage, kS3, &S3Config::region>(true)},
      {"storage.s3.path_style", boolean<kStorage, kS3, &S3Config::path_style>()},
      {"storage.s3.multipart_threshold_mib",
       integer<kStorage, kS3, &S3Config::multipart_threshold_mib>(5, 1 << 20)},
      {"storage.s3.part_size_mib", integer<kStorage, kS3, &S3Config::part_size_mib>(5, 5 << 10)},
      {"storage.s3.upload_threads", integer<kStorage, kS3, &S3Config::upload_threads>(1, 256)},
      {"storage.s3.max_attempts", integer<kStorage, kS3, &S3Config::max_attempts>(1, 100)},

      // Each size at most 2^24, so that the product of any two fits an int64; what the reference
      // model can run with beyond that, it checks itself (models/bandit_limits.hpp).
      {"model.context_dim", integer<kModel, &ModelConfig::context_dim>(1, 1 << 20)},
      {"model.num_arms", integer<kModel, &ModelConfig::num_arms>(2, 1 << 20)},
      {"model.hidden", integer<kModel, &ModelConfig::hidden>(1, 1 << 24)},
      {"model.batch_size", integer<kModel, &ModelConfig::batch_size>(1, 1 << 24)},
      {"model.group_size", integer<kModel, &ModelConfig::group_size>(1, 1 << 16)},
      {"model.learning_rate", real<kModel, &ModelConfig::learning_rate>(
                                  {.highest = kMaxLearningRate, .lowest_excluded = true})},
      {"model.eval_contexts", integer<kModel, &ModelConfig::eval_contexts>(1, 1 << 24)},
  };
}

}  // namespace

std::string IntegerRange::to_string() const {
  return highest == INT64_MAX ? "at least " + std::to_string(lowest) : both_ends();
}

std::string IntegerRange::both_ends() const {
  return "between " + std::to_string(lowest) + " and " + std::to_string(highest);
}

bool RealRange::contains(double value) const {
  if (!std::isfinite(value)) return false;
  if (zero_turns_off && value == 0) return true;
  return (lowest_excluded ? value > lowest : value >= lowest) && value <= highest;
}

std::string RealRange::to_string() const {
  std::string range =
      lowest_excluded
          ? "greater than " + number_text(lowest) + " and at most " + number_text(highest)
          : "between " + number_text(lowest) + " and " + number_text(highest);
  return zero_turns_off ? "0 or " + range : range;
}

const std::vector<ConfigKey>& config_keys() {
  static const std::vector<ConfigKey> keys = make_config_keys();
  return keys;
}

const ConfigKey* find_config_key(std::string_view path) {
  for (const ConfigKey& key : config_keys()) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

Status check_integer_key(const std::string& path, std::int64_t value,
                         const ConfigOrigins& origins) {
  return check_in_range(path, std::get<IntegerKey>(find_config_key(path)->value).range, value,
                        origins);
}

Status check_key_ranges(const Config& config) {
  const ConfigOrigins& origins = config.origins;
  for (const ConfigKey& key : config_keys()) {
    if (const auto* integer_key = std::get_if<IntegerKey>(&key.value)) {
      SH_RETURN_IF_ERROR(
          check_in_range(key.path, integer_key->range, integer_key->field.read(config), origins));
    } else if (const auto* real_key = std::get_if<RealKey>(&key.value)) {
      const double value = real_key->field.read(config);
      if (!real_key->range.contains(value)) {
        return origins.error({key.path}, "must be a finite number, " + real_key->range.to_string() +
                                             ", got '" + number_text(value) + "'");
      }
    } else if (const auto* string_key = std::get_if<StringKey>(&key.value)) {
      if (!string_key->allow_empty && string_key->field.read(config).empty()) {
        return origins.error({key.path}, "must not be empty");
      }
    }
  }
  return Status::ok();
}

}  // namespace stagehand
