#include "stagehand/config/rules.hpp"

#include <cctype>
#include <filesystem>
#include <numeric>
#include <string>

#include "stagehand/config/schema.hpp"
#include "stagehand/storage/destination.hpp"

namespace stagehand {

namespace {

/// Each rank is a Worker with its own writer threads, and in-process ranks share one process.
constexpr std::int64_t kMaxWorldSize = 1024;

constexpr const char* kThreadCount = "megatron_config.ckpt_save_thread_count";
constexpr const char* kStagingBuckets = "megatron_config.ckpt_save_staging_buckets";
/// trainer.local_ckpt_path's placeholder for the host (checkpoint/tiers/host_folders.hpp's kHostPlaceholder).
constexpr const char* kHost = "{host}";

Status check_world_size(const ParallelConfig& parallel, const ConfigOrigins& origins) {
  // Each dimension is within its range (check_key_ranges ran first): the product cannot overflow.
  const std::int64_t world_size = parallel.tensor_parallel * parallel.data_parallel;
  if (world_size <= kMaxWorldSize) return Status::ok();
  return origins.error(
      {"parallel.data_parallel", "parallel.tensor_parallel"},
      "parallel.tensor_parallel x parallel.data_parallel (the world size) must be at most " +
          std::to_string(kMaxWorldSize) + ", got " + std::to_string(world_size));
}

Status check_part_size(const S3Config& s3, const ConfigOrigins& origins) {
  if (s3.part_size_mib <= s3.multipart_threshold_mib) return Status::ok();
  return origins.error({"storage.s3.part_size_mib", "storage.s3.multipart_threshold_mib"},
                       "must be at most storage.s3.multipart_threshold_mib (" +
                           std::to_string(s3.multipart_threshold_mib) + "), got " +
                           std::to_string(s3.part_size_mib));
}

Status check_resume(const TrainerConfig& t, const ConfigOrigins& origins) {
  if (t.resume_mode != ResumeMode::from_path || !t.resume_path.empty()) return Status::ok();
  return origins.error({"trainer.resume_mode", "trainer.resume_path"},
                       "from_path needs trainer.resume_path");
}

/// Whether `path` names an object store rather than a local folder: storage's test, the one
/// that routes the path to its file system.
bool is_object_store_url(const std::string& path) { return is_cloud(path); }

/// `path` made absolute, with symbolic links, "." and ".." resolved where it exists, ending in
/// one '/', for comparing two settings' folders.
std::string normalized(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  if (ec) p = std::filesystem::path(path).lexically_normal();
  std::string out = p.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out + "/";
}

Status check_exports(const TrainerConfig& t, const ConfigOrigins& origins) {
  if (t.export_interval > 0 && (t.ckpt_interval == 0 || t.export_interval % t.ckpt_interval != 0)) {
    return origins.error(
        {"trainer.export_interval", "trainer.ckpt_interval"},
        "must be a multiple of trainer.ckpt_interval (" + std::to_string(t.ckpt_interval) +
            "): only committed checkpoints are exported, got " + std::to_string(t.export_interval));
  }
  if (t.export_interval > 0 && t.export_path.empty()) {
    return origins.error({"trainer.export_interval", "trainer.export_path"},
                         "trainer.export_interval needs trainer.export_path, the folder to export "
                         "into");
  }
  if (is_object_store_url(t.export_path)) {
    return origins.error({"trainer.export_path"}, "must be a local folder, got '" + t.export_path + "'");
  }
  if (t.export_path.empty()) return Status::ok();
  // Exports inside a tier's root would lie among the files (global_step_N folders among them)
  // that its retention, resumes and verify take for the tier's own.
  const std::string exports = normalized(t.export_path);
  for (const auto& [key, root] : {std::pair{"trainer.ckpt_path", &t.ckpt_path},
                                  std::pair{"trainer.local_ckpt_path", &t.local_ckpt_path}}) {
    if (root->empty() || is_object_store_url(*root) || root->find(kHost) != std::string::npos) continue;
    if (exports.starts_with(normalized(*root))) {
      return origins.error({"trainer.export_path", key}, "must be a folder outside " + std::string(key) + " '" + *root +
                                                             "', whose files its retention and resumes take for "
                                                             "checkpoints, got '" + t.export_path + "'");
    }
  }
  return Status::ok();
}

/// The local tier's hosts and copies: "{host}" in local_ckpt_path for more than one copy, and
/// every rank's copies on distinct hosts.
Status check_replication(const Config& c, const ConfigOrigins& origins) {
  const TrainerConfig& t = c.trainer;
  if (t.ckpt_path.find(kHost) != std::string::npos) {
    return origins.error({"trainer.ckpt_path"}, "holds " + std::string(kHost) +
                                                    ", which only trainer.local_ckpt_path may (each host's own folder "
                                                    "of the local tier); the durable tier is one folder");
  }
  const bool per_host = t.local_ckpt_path.find(kHost) != std::string::npos;
  if (t.local_replication_factor > 1 && !per_host) {
    return origins.error({"trainer.local_replication_factor", "trainer.local_ckpt_path"},
                         "copies on other hosts need each host's own folder: trainer.local_ckpt_path must hold " +
                             std::string(kHost) + (t.local_ckpt_path.empty() ? " (there is no local tier)" : ", got '" + t.local_ckpt_path + "'"));
  }
  if (t.local_replication_transport == HostTransport::network && !per_host) {
    return origins.error({"trainer.local_replication_transport", "trainer.local_ckpt_path"},
                         "network reaches other hosts' folders of the local tier: trainer.local_ckpt_path must hold " +
                             std::string(kHost) + (t.local_ckpt_path.empty() ? " (there is no local tier)" : ", got '" + t.local_ckpt_path + "'"));
  }
  if (!per_host) return Status::ok();
  const std::int64_t world = c.parallel.tensor_parallel * c.parallel.data_parallel;
  const std::int64_t per = t.ranks_per_host > 0 ? t.ranks_per_host : world;
  const std::int64_t hosts = (world + per - 1) / per;
  // Each host's folder, as check_local_tier compares the pattern, apart from the durable tier.
  if (!is_object_store_url(t.ckpt_path)) {
    const std::string durable = normalized(t.ckpt_path);
    for (std::int64_t h = 0; h < hosts; ++h) {
      std::string folder = t.local_ckpt_path;
      for (std::size_t at; (at = folder.find(kHost)) != std::string::npos;) folder.replace(at, std::string(kHost).size(), std::to_string(h));
      const std::string local = normalized(folder);
      if (local.starts_with(durable) || durable.starts_with(local)) {
        return origins.error({"trainer.local_ckpt_path", "trainer.ckpt_path"},
                             "host " + std::to_string(h) + "'s folder '" + folder + "' of the local tier and the durable tier '" +
                                 t.ckpt_path + "' must be separate folders, neither inside the other");
      }
    }
  }
  // Rank r's copies are on h, h + stride, ...: distinct while factor <= hosts / gcd(stride, hosts).
  const std::int64_t distinct = hosts / std::gcd(t.local_replication_stride, hosts);
  if (t.local_replication_factor <= distinct) return Status::ok();
  return origins.error({"trainer.local_replication_factor", "trainer.local_replication_stride", "trainer.ranks_per_host"},
                       std::to_string(t.local_replication_factor) + " copies of each rank's files, hosts " +
                           std::to_string(t.local_replication_stride) + " apart, over the " + std::to_string(hosts) +
                           " host(s) of " + std::to_string(world) + " ranks at " + std::to_string(per) +
                           " per host would put two on one host: at most " + std::to_string(distinct));
}

Status check_local_tier(const TrainerConfig& t, const ConfigOrigins& origins) {
  if (t.local_ckpt_path.empty()) return Status::ok();
  if (is_object_store_url(t.local_ckpt_path)) {
    return origins.error({"trainer.local_ckpt_path"},
                         "must be a node-local folder (a local disk, /dev/shm), got '" + t.local_ckpt_path +
                             "'; the object store belongs in trainer.ckpt_path, the durable tier");
  }
  // An object store cannot be inside a local folder, nor hold one.
  if (is_object_store_url(t.ckpt_path)) return Status::ok();
  const std::string local = normalized(t.local_ckpt_path);
  const std::string durable = normalized(t.ckpt_path);
  if (local.starts_with(durable) || durable.starts_with(local)) {
    return origins.error({"trainer.local_ckpt_path", "trainer.ckpt_path"},
                         "the local tier '" + t.local_ckpt_path + "' and the durable tier '" + t.ckpt_path +
                             "' must be separate folders, neither inside the other");
  }
  return Status::ok();
}

}  // namespace

Status check_save_buckets(std::int64_t thread_count, std::int64_t staging_buckets,
                          const ConfigOrigins& origins) {
  SH_RETURN_IF_ERROR(check_integer_key(kThreadCount, thread_count, origins));
  SH_RETURN_IF_ERROR(check_integer_key(kStagingBuckets, staging_buckets, origins));
  if (staging_buckets <= thread_count) return Status::ok();
  return origins.error({kStagingBuckets, kThreadCount},
                       "must be at most " + std::string(kThreadCount) + " (" +
                           std::to_string(thread_count) + "), got " +
                           std::to_string(staging_buckets));
}

/// A shm channel names POSIX shared-memory segments ("/stagehand-<channel>-s<rank>"), a tcp one
/// is trainer rank 0's HOST:PORT; the collective transport carries only the fully-async
/// trainer's generators' weights.
Status check_weight_sync(const Config& c, const ConfigOrigins& origins) {
  const WeightSyncConfig& w = c.weight_sync;
  if (w.transport == WeightTransport::tcp && !w.channel.empty()) {
    const auto colon = w.channel.rfind(':');
    const std::string port = colon == std::string::npos ? "" : w.channel.substr(colon + 1);
    const bool numeric = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
    if (colon == 0 || !numeric || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return origins.error({"weight_sync.channel", "weight_sync.transport"},
                           "with transport tcp is trainer rank 0's HOST:PORT (port 1 to 65535), got '" + w.channel + "'");
    }
  }
  for (char ch : w.transport == WeightTransport::tcp ? std::string() : w.channel) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '-')) {
      return origins.error({"weight_sync.channel"}, "may hold only letters, digits, '_', '.' and '-', got '" +
                                                        w.channel + "'");
    }
  }
  if (w.channel.size() > 200) return origins.error({"weight_sync.channel"}, "must be at most 200 characters");
  if (w.transport == WeightTransport::collective) {
    if (!w.channel.empty()) {
      return origins.error({"weight_sync.channel", "weight_sync.transport"},
                           "receivers outside the run need weight_sync.transport shm or tcp, got collective");
    }
    if (c.trainer.kind != TrainerKind::fully_async) {
      return origins.error({"weight_sync.transport", "trainer.kind"},
                           "collective carries only the fully-async trainer's generators' weights; trainer.kind is " +
                               std::string(to_string(c.trainer.kind)));
    }
  }
  if (w.receivers > 0 && w.channel.empty()) {
    return origins.error({"weight_sync.receivers", "weight_sync.channel"},
                         "receivers outside the run need weight_sync.channel");
  }
  return Status::ok();
}

Status validate_config(const Config& config) {
  const ConfigOrigins& origins = config.origins;
  SH_RETURN_IF_ERROR(check_key_ranges(config));
  SH_RETURN_IF_ERROR(check_save_buckets(config.megatron_config.ckpt_save_thread_count,
                                        config.megatron_config.ckpt_save_staging_buckets, origins));
  SH_RETURN_IF_ERROR(check_world_size(config.parallel, origins));
  SH_RETURN_IF_ERROR(check_part_size(config.storage.s3, origins));
  SH_RETURN_IF_ERROR(check_resume(config.trainer, origins));
  SH_RETURN_IF_ERROR(check_local_tier(config.trainer, origins));
  SH_RETURN_IF_ERROR(check_replication(config, origins));
  SH_RETURN_IF_ERROR(check_weight_sync(config, origins));
  return check_exports(config.trainer, origins);
}

}  // namespace stagehand
