// Where training starts: the resumed checkpoint (trainer.resume_mode), or trainer.init_from's
// weights, or nothing.
#include <algorithm>
#include <chrono>

#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/trainers/trainer_base.hpp"

namespace stagehand {

namespace {

/// The first eight of `items` joined by `separator` ("a, b and 3 more"; "a; b; and 3 more").
std::string first_eight(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size() && i < 8; ++i) out += (i ? separator : "") + items[i];
  if (items.size() > 8) out += (separator == "; " ? "; and " : " and ") + std::to_string(items.size() - 8) + " more";
  return out;
}

}  // namespace

Result<TrainerBase::Candidates> TrainerBase::resume_candidates() const {
  Candidates found;
  auto add = [&](const CheckpointPolicy& tier, const std::string& name) -> Status {
    SH_ASSIGN_OR_RETURN(auto listed, tier.resume_candidates());
    for (auto step : listed.steps) found.steps.push_back({step, tier.store().step_dir(step), name});
    if (!listed.stale.empty()) found.stale.push_back((name.empty() ? "" : name + " tier: ") + listed.stale);
    return Status::ok();
  };
  SH_RETURN_IF_ERROR(add(policy_, durable_ ? "local" : ""));
  if (durable_) SH_RETURN_IF_ERROR(add(*durable_, "durable"));
  // Newest first; at the same step the local tier's (listed first) before the durable one's.
  std::stable_sort(found.steps.begin(), found.steps.end(),
                   [](const Candidate& a, const Candidate& b) { return a.step > b.step; });
  return found;
}

Result<std::int64_t> TrainerBase::resume_latest(const Candidates& found) {
  std::vector<std::string> rejected;
  for (const auto& stale : found.stale) {
    rejected.push_back(stale);
    warn("resume_mode latest: %s; trying the newest committed step before it\n", stale.c_str());
  }
  std::set<std::int64_t> rejected_steps;
  auto all = [&] {
    std::string out;
    for (std::size_t i = 0; i < rejected.size(); ++i) out += (i ? "; " : "") + rejected[i];
    return out;
  };
  for (const Candidate& c : found.steps) {
    const std::string what = (c.tier.empty() ? "" : c.tier + " ") + "step " + std::to_string(c.step);
    auto started = start_from(c.dir, rejected_steps);
    if (started.is_ok()) {
      if (!rejected.empty()) {
        say("resume_mode latest: resumed %s after rejecting what is newer: %s\n", what.c_str(), all().c_str());
      }
      return started;
    }
    const ErrorCode code = started.status().code();
    if (code != ErrorCode::corruption && code != ErrorCode::not_found) return started.status();
    rejected.push_back(what + " rejected: " + started.status().message());
    rejected_steps.insert(c.step);
    (c.tier == "durable" ? rejected_durable_ : rejected_local_).insert(c.step);
    warn("resume_mode latest: %s rejected: %s\n", what.c_str(), started.status().message().c_str());
  }
  const auto& t = options_.config.trainer;
  const std::string roots = durable_ ? "'" + save_root(t) + "' or '" + t.ckpt_path + "'" : "'" + t.ckpt_path + "'";
  return Status{ErrorCode::corruption, "trainer.resume_mode latest: no committed checkpoint in " + roots +
                                           " could be resumed (" + all() + "); nothing was changed"};
}

Result<std::int64_t> TrainerBase::start_from(const std::optional<std::string>& dir,
                                             const std::set<std::int64_t>& rejected) {
  const auto& t = options_.config.trainer;
  if (!dir) {
    if (!t.init_from.empty()) SH_RETURN_IF_ERROR(init_from(t.init_from));
    SH_RETURN_IF_ERROR(on_start(0, nullptr, ""));
    return std::int64_t{0};
  }
  SH_RETURN_IF_ERROR(check_host_folders(*dir));
  SH_ASSIGN_OR_RETURN(TrainerState state, read_trainer_state(*fs_, *dir));
  const std::string state_file = *dir + "/" + kTrainerStateFile;
  if (state.kind.empty()) return Status{ErrorCode::corruption, "'" + state_file + "': field 'kind' is missing"};
  if (state.kind != name()) {
    return Status{ErrorCode::invalid_argument,
                  "checkpoint '" + *dir + "' was written by the " + state.kind + " trainer, not " + name() +
                      ": it cannot be resumed by this one. To start a " + name() +
                      " run from its weights, set trainer.init_from: '" + *dir + "' with trainer.resume_mode: none"};
  }
  if (state.step > t.total_steps) {
    return Status{ErrorCode::invalid_argument, "checkpoint '" + *dir + "' is at step " + std::to_string(state.step) +
                                                   ", beyond trainer.total_steps " + std::to_string(t.total_steps)};
  }
  SH_RETURN_IF_ERROR(policy_.check_resume(state.step, rejected));
  if (durable_) SH_RETURN_IF_ERROR(durable_->check_resume(state.step, rejected));
  const LoadScope scope{t.load_optimizer.value_or(true), t.load_rng.value_or(true), t.load_strict};
  SH_ASSIGN_OR_RETURN(LoadReport load, load_everywhere(*dir, scope, "resume"));
  say("resumed from %s at step %lld, saved %s (load %.3f s, %llu bytes; slowest rank's thread-seconds: read "
      "%.3f, verify %.3f, copy %.3f)\n",
      dir->c_str(), static_cast<long long>(state.step), describe_layout(state).c_str(), load.total_s,
      static_cast<unsigned long long>(load.bytes), load.read_s, load.verify_s, load.copy_s);
  SH_RETURN_IF_ERROR(on_start(state.step, &state, state_file));
  return state.step;
}

Status TrainerBase::check_host_folders(const std::string& dir) {
  if (dir.find(kHostPlaceholder) == std::string::npos || host_placement_of(*fs_) == nullptr) return Status::ok();
  const auto started = std::chrono::steady_clock::now();
  SH_ASSIGN_OR_RETURN(HostCheckReport check, check_host_copies(*fs_, dir));
  say("checked every file of %s against its metadata across %d host folders (%.3f s)\n", dir.c_str(),
      host_placement_of(*fs_)->hosts,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  auto listed = [](const std::vector<std::string>& items) { return first_eight(items, "; "); };
  if (!check.from_replicas.empty()) {
    warn("%s: %zu part(s) whose own host has no copy are read from their replicas: %s\n", dir.c_str(),
         check.from_replicas.size(), listed(check.from_replicas).c_str());
  }
  if (!check.unrepaired.empty()) {
    warn("%s: %zu missing or short copies could not be rewritten (reads do not take them): %s\n", dir.c_str(),
         check.unrepaired.size(), listed(check.unrepaired).c_str());
  }
  if (!check.repaired.empty()) {
    warn("%s: %zu damaged or missing copies rewritten from copies that verify: %s\n", dir.c_str(),
         check.repaired.size(), listed(check.repaired).c_str());
  }
  return Status::ok();
}

Status TrainerBase::init_from(const std::string& path) {
  const auto& t = options_.config.trainer;
  const LoadScope scope{t.load_optimizer.value_or(false), t.load_rng.value_or(false), t.load_strict};
  auto dir = resolve_checkpoint(*fs_, path);
  if (!dir.is_ok()) return dir.status().with_context("trainer.init_from");
  std::string source = "a safetensors folder";
  SH_ASSIGN_OR_RETURN(bool safetensors, is_safetensors_folder(*fs_, *dir));
  if (!safetensors) {
    auto state = read_trainer_state(*fs_, *dir);
    source = state.is_ok() ? "the " + state->kind + " trainer's step " + std::to_string(state->step) + ", saved " +
                                 describe_layout(*state)
                           : "a checkpoint without a trainer state";
  }
  SH_ASSIGN_OR_RETURN(LoadReport load, load_everywhere(*dir, scope, "trainer.init_from"));
  say("initialized from %s (%s): weights%s%s (load %.3f s, %llu bytes); training starts at step 1\n", dir->c_str(),
      source.c_str(), scope.optimizer ? ", optimizer state" : ", a fresh optimizer", scope.rng ? ", RNG" : "",
      load.total_s, static_cast<unsigned long long>(load.bytes));
  return Status::ok();
}

Result<LoadReport> TrainerBase::load_everywhere(const std::string& dir, const LoadScope& scope, const char* what) {
  auto reply = client_.load(dir, scope);
  if (!reply.is_ok()) {
    return reply.status().with_context(std::string(what) + (scope.strict ? "" : " (trainer.load_strict: false)"));
  }
  LoadReport load = std::move(*reply);
  auto names = [](const std::vector<std::string>& list) { return first_eight(list, ", "); };
  if (!load.missing_tensors.empty()) {
    warn("%s: %zu tensor(s) not in '%s', left as initialized (trainer.load_strict: false): %s\n", what,
         load.missing_tensors.size(), dir.c_str(), names(load.missing_tensors).c_str());
  }
  if (!load.unused_tensors.empty() && scope.strict) {
    return Status{ErrorCode::invalid_argument,
                  std::string(what) + ": '" + dir + "' holds " + std::to_string(load.unused_tensors.size()) +
                      " tensor(s) the model does not have: " + names(load.unused_tensors) +
                      " (trainer.load_strict: false loads without them)"};
  }
  if (!load.unused_tensors.empty() && !scope.strict) {
    warn("%s: %zu tensor(s) of '%s' that the model does not have were ignored (trainer.load_strict: false): %s\n",
         what, load.unused_tensors.size(), dir.c_str(), names(load.unused_tensors).c_str());
  }
  std::vector<std::string> rng;
  std::vector<std::string> objects;
  for (const auto& name : load.missing_objects) (name.starts_with("rng.") ? rng : objects).push_back(name);
  if (!objects.empty()) {
    warn("%s: %zu object(s) not in '%s', left as initialized (trainer.load_strict: false): %s\n", what,
         objects.size(), dir.c_str(), names(objects).c_str());
  }
  if (!rng.empty() && scope.rng) {
    warn("%s: '%s' has no RNG state for %s (saved by fewer ranks): re-derived from trainer.seed, the step "
         "and the rank\n",
         what, dir.c_str(), names(rng).c_str());
  }
  return load;
}

std::string TrainerBase::describe_layout(const TrainerState& state) {
  if (!state.layout) return "with an unrecorded layout";
  return "with tensor_parallel " + std::to_string(state.layout->tensor_parallel) + " x data_parallel " +
         std::to_string(state.layout->data_parallel);
}

}  // namespace stagehand
