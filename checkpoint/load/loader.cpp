#include "stagehand/checkpoint/load/loader.hpp"

#include <algorithm>
#include <chrono>
#include <set>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/interop/hf_folder.hpp"
#include "stagehand/checkpoint/load/load_group.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/parallel_reader.hpp"
#include "stagehand/checkpoint/load/reshard.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/storage/default_file_system.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The blocks of `state` as the checkpoint names them (LoadOptions::sources), without the
/// skipped ones: what the load reads. Tensor handles are shared, not copied.
StateDict as_saved(const StateDict& state, const LoadOptions& options) {
  StateDict query;
  query.objects = state.objects;
  for (const auto& t : state.tensors) {
    if (options.skip.count(t.desc.name) != 0) continue;
    query.tensors.push_back(t);
    if (auto source = options.sources.find(t.desc.name); source != options.sources.end()) {
      query.tensors.back().desc.name = source->second;
    }
  }
  return query;
}

}  // namespace

LoadOptions load_selection_by_name(const StateDict& state, const LoadScope& scope) {
  LoadOptions options;
  for (const auto& t : state.tensors) {
    if (!scope.optimizer && t.desc.name.starts_with("optimizer.")) options.skip.insert(t.desc.name);
  }
  for (const auto& [name, value] : state.objects) {
    const bool optimizer = name.starts_with("optimizer.") || name == "scheduler";
    const bool rng = name.starts_with("rng.");
    if ((optimizer && !scope.optimizer) || (rng && !scope.rng)) options.skip.insert(name);
    if (rng) options.optional_objects.insert(name);
  }
  options.strict = scope.strict;
  options.list_unused = true;
  options.convert_dtypes = true;
  return options;
}

Status load_checkpoint(FileSystem& fs, const std::string& checkpoint_dir, StateDict& state,
                       const LoadOptions& options, LoadReport* report, LoadGroup* group, int member) {
  const auto start = Clock::now();
  LoadReport local_report;
  LoadReport& out = report != nullptr ? *report : local_report;
  out = LoadReport{};
  bool safetensors_folder = false;
  CheckpointMetadata metadata;
  std::shared_ptr<DataFiles> files;  // open until every read of the group is done
  LoadGroup::Turn turn;
  if (group != nullptr) turn = group->begin(member);
  std::vector<ChunkJob> jobs;
  bool pinned = false;
  // Every check that needs no chunk bytes runs before any read, so that these errors leave the
  // state untouched.
  auto plan = [&]() -> Status {
    if (options.thread_count < 1) {
      return Status{ErrorCode::invalid_argument,
                    "ckpt_load_thread_count must be at least 1, got " + std::to_string(options.thread_count)};
    }
    if (options.max_read_bytes < 1) return Status{ErrorCode::invalid_argument, "max_read_bytes must be at least 1"};
    SH_ASSIGN_OR_RETURN(safetensors_folder, is_safetensors_folder(fs, checkpoint_dir));
    std::vector<std::string> saved_names;  // every tensor of the checkpoint, for unused_tensors
    if (safetensors_folder) {
      SH_ASSIGN_OR_RETURN(metadata, read_safetensors_folder(fs, checkpoint_dir));
      for (const auto& [name, tensor] : metadata.tensors)
        saved_names.push_back(name);
    } else {
      // Listing every saved name costs every rank O(tensors of the whole checkpoint): only for the
      // loads that report or refuse unused tensors (a trainer's), not for the default one.
      const bool list_unused = options.list_unused || options.refuse_unused || !options.strict;
      const bool renamed = !options.sources.empty() || !options.skip.empty();
      const StateDict query = renamed ? as_saved(state, options) : StateDict{};
      SH_ASSIGN_OR_RETURN(metadata,
                          read_checkpoint_metadata_part(fs, checkpoint_dir, renamed ? query : state,
                                                        list_unused ? &saved_names : nullptr));
    }
    SH_RETURN_IF_ERROR(state.validate());
    const std::string folder = safetensors_folder ? checkpoint_dir : CheckpointLayout::policy_dir(checkpoint_dir);
    files = group != nullptr ? group->data_files(turn, fs, folder) : std::make_shared<DataFiles>(fs, folder);
    std::set<std::string> used;  // saved tensors this load reads
    std::set<std::string> live_names;
    for (std::size_t t = 0; t < state.tensors.size(); ++t) {
      ShardedTensor& live = state.tensors[t];
      const ShardedTensorDesc& block = live.desc;
      live_names.insert(block.name);
      if (options.skip.count(block.name) != 0) continue;
      const auto source_name = options.sources.find(block.name);
      const std::string& saved_name =
          source_name == options.sources.end() ? block.name : source_name->second;
      const std::string as =
          saved_name == block.name ? "" : " (from saved tensor '" + saved_name + "')";
      auto fail = [&](const std::string& why) {
        return Status{ErrorCode::invalid_argument,
                      "tensor '" + block.name + "'" + as + " in '" + checkpoint_dir + "': " + why};
      };
      auto found = metadata.tensors.find(saved_name);
      if (found == metadata.tensors.end()) {
        if (!options.strict) {
          out.missing_tensors.push_back(block.name);
          continue;
        }
        return fail("not in the checkpoint");
      }
      used.insert(saved_name);
      const TensorMeta& saved = found->second;
      if (saved.dtype != block.dtype &&
          !(options.convert_dtypes && can_convert(saved.dtype, block.dtype))) {
        return fail("saved as " + std::string(dtype_name(saved.dtype)) + ", live as " +
                    std::string(dtype_name(block.dtype)));
      }
      if (!(saved.global_shape == block.global_shape)) {
        return fail("saved with global shape " + saved.global_shape.to_string() + ", live " +
                    block.global_shape.to_string());
      }
      if (block.local_shape.numel() == 0) continue;
      const bool on_device = live.tensor.device().is_cuda();
      pinned |= on_device;
      // validate_metadata proved that the saved chunks tile the global shape, so their overlaps
      // with this block are disjoint and counting their elements proves that they fill it. A
      // safetensors folder's tensors are one whole chunk each.
      std::int64_t covered = 0;
      for (const auto& chunk : saved.chunks) {
        const std::int64_t overlap = overlap_numel(chunk, block);
        if (overlap == 0) continue;
        auto file = files->get(chunk.file, metadata.files.at(chunk.file).size);
        if (!file.is_ok()) return file.status().with_context("loading tensor '" + block.name + "'");
        const DataFile& data = **file;
        if (!safetensors_folder) {
          SH_RETURN_IF_ERROR(
              check_chunk_in_header(data.header, data.path, saved_name, saved.dtype, chunk));
        }
        ChunkJob job{&live, &chunk, &data, nullptr, saved.dtype, {}};
        if (auto offset = contiguous_offset(chunk, block);
            offset && !on_device && saved.dtype == block.dtype) {
          job.direct = static_cast<std::uint8_t*>(live.tensor.data()) +
                       static_cast<std::size_t>(*offset) * dtype_size(block.dtype);
        }
        jobs.push_back(job);
        covered += overlap;
      }
      if (covered != block.local_shape.numel()) {
        return fail("the checkpoint covers " + std::to_string(covered) + " of the " +
                    std::to_string(block.local_shape.numel()) + " elements of the block at " +
                    block.global_offset.to_string());
      }
    }
    std::sort(out.missing_tensors.begin(), out.missing_tensors.end());
    for (const auto& name : saved_names) {
      if (live_names.count(name) == 0 && used.count(name) == 0) out.unused_tensors.push_back(name);
    }
    if (options.refuse_unused && !out.unused_tensors.empty()) {
      std::string names;
      for (std::size_t i = 0; i < out.unused_tensors.size() && i < 5; ++i) {
        names += (i ? ", '" : "'") + out.unused_tensors[i] + "'";
      }
      if (out.unused_tensors.size() > 5)
        names += " and " + std::to_string(out.unused_tensors.size() - 5) + " more";
      return Status{ErrorCode::invalid_argument, "'" + checkpoint_dir + "' holds " +
                                                     std::to_string(out.unused_tensors.size()) +
                                                     " tensor(s) the state does not have: " + names};
    }
    for (const auto& [name, value] : state.objects) {
      if (options.skip.count(name) != 0 || metadata.objects.count(name) != 0) continue;
      if (options.strict && options.optional_objects.count(name) == 0) {
        return Status{ErrorCode::invalid_argument,
                      "object '" + name + "' is not in '" + checkpoint_dir + "'"};
      }
      out.missing_objects.push_back(name);
    }
    return Status::ok();
  };
  if (Status planned = plan(); !planned.is_ok()) {
    if (group != nullptr) group->abstain(turn);
    out.total_s = seconds_since(start);
    return planned;
  }
  merge_shared_chunks(jobs);
  if (group != nullptr) group->arrive(turn, checkpoint_dir, jobs);
  out.chunks = jobs.size();
  out.direct_chunks = static_cast<std::uint64_t>(
      std::count_if(jobs.begin(), jobs.end(), [](const ChunkJob& j) { return j.direct != nullptr; }));
  // Tasks as large as max_read_bytes; where reads are cheap, each read in pieces that stay in
  // the core's cache while they are hashed.
  const std::uint64_t read_bytes = fs.capabilities(checkpoint_dir).cheap_reads
                                       ? std::min(options.max_read_bytes, kCheapReadBytes)
                                       : options.max_read_bytes;
  Status loaded = read_chunks(jobs, plan_reads(jobs, options.max_read_bytes), options, read_bytes, pinned,
                              !safetensors_folder, out);
  if (group != nullptr) loaded = group->depart(turn, std::move(loaded));
  out.total_s = seconds_since(start);
  SH_RETURN_IF_ERROR(loaded);
  for (auto& [name, value] : state.objects) {
    if (options.skip.count(name) != 0) continue;
    if (auto saved = metadata.objects.find(name); saved != metadata.objects.end())
      value = saved->second;
  }
  return Status::ok();
}

Status load_checkpoint(const std::string& checkpoint_dir, StateDict& state,
                       const ObjectStoreOptions& store) {
  return load_checkpoint(*default_file_system(store), checkpoint_dir, state, LoadOptions{});
}

}  // namespace stagehand
