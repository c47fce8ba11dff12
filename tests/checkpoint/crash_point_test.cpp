#define BOOST_TEST_MODULE crash_point
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/interop/export.hpp"
#include "stagehand/checkpoint/metadata/gather.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/format/trainer_state.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/core/xxh3.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "tests/fault_fs.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::DiskImage;
using stagehand::test::FaultFileSystem;
using stagehand::test::FsFault;
using stagehand::test::FsOp;
using stagehand::test::TempDir;

namespace {

// -- saving --

/// Each rank's bytes: small, so that a restart from every crash point takes milliseconds.
constexpr std::uint64_t kRankBytes = 160u << 10;

/// Every rank's state for `seed` (a step's state has its step as seed).
std::vector<StateDict> states_for(int ranks, std::uint64_t seed) {
  std::vector<StateDict> states;
  for (int r = 0; r < ranks; ++r) {
    states.push_back(*make_synthetic_state({ranks, kRankBytes, 6, seed, 256}, r, Device::host()));
  }
  return states;
}

/// How one case saves, and what else its recorded calls do.
struct SaveCase {
  const char* name = "";
  int ranks = 1;
  SaveEngineOptions options{2, 0, false, {}};
  /// begin_async() then write_async(), with a trainer_state.json, as the coordinator drives a
  /// background save; else save_checkpoint_in_process.
  bool async = false;
  /// Steps committed before (each saved from the state of its seed); none: ckpt_path does not
  /// exist yet.
  std::vector<std::int64_t> before{1};
  std::int64_t step = 2;
  /// apply_retention(keep) after the commit (0: none).
  int keep = 0;
  /// An export of the root after the commit.
  bool export_after = false;
};

/// Saves `states` as step `step` of `root` on `fs`, as `c` says.
Status save_step(const std::shared_ptr<FileSystem>& fs, const std::string& root, const SaveCase& c,
                 std::int64_t step, const std::vector<StateDict>& states) {
  std::vector<std::unique_ptr<SaveEngine>> engines;
  std::vector<SaveEngine*> e;
  std::vector<const StateDict*> s;
  for (int r = 0; r < c.ranks; ++r) {
    SH_ASSIGN_OR_RETURN(auto engine, SaveEngine::create(r, c.options, fs));
    engines.push_back(std::move(engine));
    e.push_back(engines.back().get());
    s.push_back(&states[static_cast<std::size_t>(r)]);
  }
  if (!c.async) return save_checkpoint_in_process(root, step, e, s, fs).status();
  SH_ASSIGN_OR_RETURN(std::vector<StateDict> planned, planned_states(s, step));
  const CheckpointStore store(fs, root);
  SH_ASSIGN_OR_RETURN(const std::string policy, store.prepare(step));
  Status st = [&]() -> Status {
    TrainerState trainer;
    trainer.step = step;
    trainer.kind = "crash_point_test";
    SH_ASSIGN_OR_RETURN(FileMeta trainer_meta,
                        store.write_trainer_state(step, trainer_state_to_json(trainer)));
    for (std::size_t r = 0; r < engines.size(); ++r) {
      SH_RETURN_IF_ERROR(engines[r]->begin_async(planned[r]));
    }
    std::vector<RankSaveReport> reports(engines.size());
    std::vector<std::thread> ranks;
    for (std::size_t r = 0; r < engines.size(); ++r) {
      ranks.emplace_back(
          [&, r] { reports[r] = engines[r]->write_async(planned[r], policy, step, {}); });
    }
    for (auto& t : ranks)
      t.join();
    std::vector<const StateDict*> saved;
    for (const StateDict& state : planned) saved.push_back(&state);
    SH_ASSIGN_OR_RETURN(GatheredMetadata metadata, gather_reports(step, reports, c.ranks, descriptors_of_states(saved)));
    metadata.trainer_state = trainer_meta;
    return store.commit(step, metadata).status();
  }();
  if (!st.is_ok()) (void)store.abort(step);
  return st;
}

/// Where a case's files are: the modelled folder holds the checkpoint root and the export.
struct Paths {
  std::string dir;
  std::string root;
  std::string out;
};

Paths paths_in(const TempDir& dir) {
  return {dir.path(), dir / "ckpt", dir / "export"};
}

ExportOptions export_options() {
  ExportOptions options;
  options.what = ExportOptions::What::all;
  // Several files and an index.
  options.max_shard_bytes = 64u << 10;
  return options;
}

/// The calls a case records: the save of its step, then its retention or export.
/// @param committed_at when not null, set to the number of calls once the commit returned.
Status run_case(const std::shared_ptr<FaultFileSystem>& fs, const Paths& paths, const SaveCase& c,
                const std::vector<StateDict>& states, std::size_t* committed_at) {
  SH_RETURN_IF_ERROR(save_step(fs, paths.root, c, c.step, states));
  if (committed_at != nullptr) *committed_at = fs->call_count();
  if (c.keep > 0)
    SH_RETURN_IF_ERROR(CheckpointStore(fs, paths.root).apply_retention(c.keep).status());
  if (c.export_after)
    SH_RETURN_IF_ERROR(export_checkpoint(*fs, paths.root, paths.out, export_options()));
  return Status::ok();
}

// -- checking what a restart finds --

std::uint64_t fingerprint(const DiskImage& image, std::uint64_t flags) {
  Xxh3Stream hash;
  hash.update(&flags, sizeof(flags));
  for (const auto& [path, bytes] : image) {
    hash.update(path.data(), path.size() + 1);
    const char kind = bytes ? 'f' : 'd';
    hash.update(&kind, 1);
    if (bytes) {
      const std::uint64_t size = bytes->size();
      hash.update(&size, sizeof(size));
      hash.update(bytes->data(), bytes->size());
    }
  }
  return hash.digest();
}

/// The image of a folder; empty when it is missing.
DiskImage image_of(const std::string& dir) {
  if (!std::filesystem::exists(dir)) return {};
  auto image = test::read_image(dir);
  BOOST_REQUIRE_MESSAGE(image.is_ok(), image.status().message());
  return *image;
}

/// Paths below `dir` that end with ".tmp".
std::vector<std::string> tmp_leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& [path, bytes] : image_of(dir)) {
    if (path.ends_with(".tmp")) out.push_back(path);
  }
  return out;
}

/// Loads the checkpoint at `checkpoint_dir` into every rank's state layout and compares it with
/// `expected`, tensor by tensor.
void check_loads_as(const std::string& checkpoint_dir, const std::vector<StateDict>& expected) {
  for (const auto& state : expected) {
    StateDict loaded = test::zeroed_like(state);
    Status st = load_checkpoint(*local_file_system(), checkpoint_dir, loaded, LoadOptions{});
    BOOST_REQUIRE_MESSAGE(st.is_ok(), st.message());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, state.tensors[i].tensor),
                 "tensor " << state.tensors[i].desc.name);
    }
  }
}

/// What a restart after a power loss must find.
struct Expected {
  /// The step the tracker named before the recorded calls.
  std::optional<std::int64_t> tracked_before;
  /// Every committed step's files, bit for bit: the earlier ones and the new one.
  std::map<std::int64_t, DiskImage> steps;
  /// Steps that retention may remove once the tracker names the new step.
  std::set<std::int64_t> removable;
  /// The commit had returned before the power went: the new step must be tracked.
  bool commit_returned = false;
  /// Likewise the export: it must be there, whole.
  bool export_returned = false;
  DiskImage export_image;
  /// The files of the step saved after a restart, by step (set by the first such restart).
  std::map<std::int64_t, DiskImage> next_saves;
};

/// What a trainer that restarts from the folder as the power loss left it does, and what it
/// must find: clean what interrupted saves left, resume from the tracked step, which verifies
/// and is bit for bit the previous or the new step, with nothing of a committed step lost; an
/// export whole or absent (and then made again); and the next save of the step succeeds.
/// It reads through the local file system; it writes (the export again, the next save) through
/// `fs` with nothing armed, whose fsyncs go no further than its model: what is checked is what
/// the restart finds, not the durability of what it writes.
void check_restart(const Paths& paths, const SaveCase& c, Expected& expected,
                   const std::shared_ptr<FaultFileSystem>& fs) {
  const CheckpointStore store(local_file_system(), paths.root);
  auto cleaned = store.clean_interrupted();
  BOOST_REQUIRE_MESSAGE(cleaned.is_ok(), cleaned.status().message());
  BOOST_TEST(tmp_leftovers(paths.root).empty());
  auto tracked = store.tracker();
  BOOST_REQUIRE_MESSAGE(tracked.is_ok(), tracked.status().message());
  if (expected.commit_returned) {
    BOOST_TEST((*tracked == c.step), "a commit that returned was lost");
  } else {
    BOOST_TEST((*tracked == expected.tracked_before || *tracked == c.step));
  }
  if (*tracked) {
    const std::string dir = store.step_dir(**tracked);
    auto resolved = resolve_checkpoint(*local_file_system(), paths.root);
    BOOST_REQUIRE_MESSAGE(resolved.is_ok(), resolved.status().message());
    BOOST_TEST(*resolved == dir);
    auto verified = verify_checkpoint(*local_file_system(), dir);
    BOOST_REQUIRE_MESSAGE(verified.is_ok(), verified.status().message());
    BOOST_TEST(verified->ok());
    check_loads_as(dir, states_for(c.ranks, static_cast<std::uint64_t>(**tracked)));
  }
  // Every step that counts as committed is whole, bit for bit; none of the earlier ones is gone
  // unless retention removed it after the commit.
  auto committed = store.committed_steps();
  BOOST_REQUIRE(committed.is_ok());
  for (std::int64_t step : *committed) {
    BOOST_REQUIRE_MESSAGE(expected.steps.count(step) != 0, "unknown step " << step);
    BOOST_TEST((image_of(store.step_dir(step)) == expected.steps.at(step)),
               "step " << step << " differs from what was committed");
  }
  for (const auto& [step, image] : expected.steps) {
    if (step == c.step) continue;
    const bool may_be_gone = expected.removable.count(step) != 0 && *tracked == c.step;
    BOOST_TEST((may_be_gone || std::count(committed->begin(), committed->end(), step) == 1),
               "committed step " << step << " was lost");
  }
  BOOST_REQUIRE(fs->reset().is_ok());
  if (c.export_after) {
    const DiskImage out = image_of(paths.out);
    if (expected.export_returned) BOOST_TEST(!out.empty(), "an export that returned was lost");
    if (!out.empty()) BOOST_TEST((out == expected.export_image), "a partial export is in place");
    if (out.empty() && *tracked == c.step) {
      Status again = export_checkpoint(*fs, paths.root, paths.out, export_options());
      BOOST_REQUIRE_MESSAGE(again.is_ok(), again.message());
      BOOST_TEST((image_of(paths.out) == expected.export_image));
    }
    for (const auto& [path, bytes] : image_of(paths.dir)) {
      BOOST_TEST(path.find(".export-") == std::string::npos, "export leftover " << path);
    }
  }
  // The trainer goes on from the tracked step: it saves the step after it.
  const std::int64_t next = *tracked == c.step ? c.step + 1 : c.step;
  const auto next_states = states_for(c.ranks, static_cast<std::uint64_t>(next) + 100);
  Status saved = save_step(fs, paths.root, c, next, next_states);
  BOOST_REQUIRE_MESSAGE(saved.is_ok(), saved.message());
  auto now = store.tracker();
  BOOST_REQUIRE(now.is_ok());
  BOOST_TEST((*now == next));
  const DiskImage resaved = image_of(store.step_dir(next));
  if (expected.next_saves.count(next) == 0) {
    check_loads_as(store.step_dir(next), next_states);
    expected.next_saves[next] = resaved;
  }
  BOOST_TEST((resaved == expected.next_saves.at(next)), "the next save differs");
  for (std::int64_t step : *committed) {
    if (step == next) continue;
    BOOST_TEST((image_of(store.step_dir(step)) == expected.steps.at(step)),
               "the next save changed step " << step);
  }
  BOOST_TEST(tmp_leftovers(paths.root).empty());
}

/// What one case covered.
struct Coverage {
  std::size_t calls = 0;
  std::size_t crash_points = 0;
  std::size_t outcomes = 0;
  std::size_t restarts = 0;
};

/// Where the crash points' folders go: in memory (/dev/shm) where there is such a folder. The
/// crash images replace what is on disk, so its durability is never relied on, while a disk's
/// journal makes the thousands of creations and removals of the restarts slow.
std::string scratch_parent() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) {
    return "/dev/shm";
  }
  return std::filesystem::temp_directory_path().string();
}

/// Records the case's calls, then for every k from 0 to their number: runs the case again with
/// the power lost after k calls, and restarts from every distinct state that loss may leave.
Coverage check_every_crash_point(const SaveCase& c) {
  TempDir tmp(scratch_parent());
  const Paths paths = paths_in(tmp);
  Expected expected;
  for (std::int64_t step : c.before) {
    Status st = save_step(local_file_system(), paths.root, c, step,
                          states_for(c.ranks, static_cast<std::uint64_t>(step)));
    BOOST_REQUIRE_MESSAGE(st.is_ok(), st.message());
    expected.steps[step] = image_of(test::local_store(paths.root).step_dir(step));
    expected.tracked_before = step;
  }
  if (c.keep > 0) {
    for (std::size_t i = 0; i + static_cast<std::size_t>(c.keep) <= c.before.size(); ++i) {
      expected.removable.insert(c.before[i]);
    }
  }
  const DiskImage before = image_of(paths.dir);
  // The crash image replaces the disk before anything looks at it: real fsyncs would only cost.
  auto fs = *FaultFileSystem::create(paths.dir, false);
  const auto states = states_for(c.ranks, static_cast<std::uint64_t>(c.step));

  std::size_t committed_at = 0;
  Status full = run_case(fs, paths, c, states, &committed_at);
  BOOST_REQUIRE_MESSAGE(full.is_ok(), full.message());
  Coverage coverage;
  coverage.calls = fs->call_count();
  expected.steps[c.step] = image_of(test::local_store(paths.root).step_dir(c.step));
  if (c.export_after) expected.export_image = image_of(paths.out);

  std::set<std::uint64_t> restarted;
  for (std::size_t k = 0; k <= coverage.calls; ++k) {
    BOOST_REQUIRE(test::write_image(paths.dir, before).is_ok());
    BOOST_REQUIRE(fs->reset().is_ok());
    fs->power_loss_after(k);
    Status st = run_case(fs, paths, c, states, nullptr);
    if (k == coverage.calls) {
      BOOST_REQUIRE_MESSAGE(st.is_ok(), st.message());
      BOOST_REQUIRE(fs->call_count() == coverage.calls);
    }
    const auto calls = fs->calls();
    const std::string last = calls.empty() ? "none" : calls.back().to_string();
    expected.commit_returned = k >= committed_at;
    expected.export_returned = c.export_after && k == coverage.calls;
    ++coverage.crash_points;
    // Taken before any restart: a restart resets the model.
    std::vector<std::pair<std::string, DiskImage>> images;
    for (const auto& outcome : fs->crash_outcomes()) {
      images.emplace_back(outcome.name, fs->crash_image(outcome));
    }
    for (const auto& [outcome, image] : images) {
      ++coverage.outcomes;
      const std::uint64_t flags =
          (expected.commit_returned ? 1u : 0u) | (expected.export_returned ? 2u : 0u);
      if (!restarted.insert(fingerprint(image, flags)).second) continue;
      ++coverage.restarts;
      BOOST_REQUIRE(test::write_image(paths.dir, image).is_ok());
      BOOST_TEST_CONTEXT(c.name << ": power lost after " << k << " calls (the last: " << last
                                << "); " << outcome) {
        check_restart(paths, c, expected, fs);
      }
    }
  }
  return coverage;
}

}  // namespace

// -- the fault file system itself --

BOOST_AUTO_TEST_CASE(a_power_loss_keeps_only_what_was_synced) {
  TempDir dir;
  auto fs = *FaultFileSystem::create(dir.path());
  const std::string d = dir / "d";
  BOOST_REQUIRE(fs->create_dir(d).is_ok());
  BOOST_REQUIRE(fs->sync_dir(dir.path()).is_ok());
  auto synced = *fs->create_file(d + "/synced");
  BOOST_REQUIRE(synced->append("abc", 3).is_ok());
  BOOST_REQUIRE(synced->sync().is_ok());
  auto unsynced = *fs->create_file(d + "/unsynced");
  BOOST_REQUIRE(unsynced->append("xyz", 3).is_ok());
  BOOST_REQUIRE(fs->sync_dir(d).is_ok());
  // Written after the sync, and a rename the folder's sync never saw.
  BOOST_REQUIRE(synced->write_at(3, "def", 3).is_ok());
  BOOST_REQUIRE(synced->close().is_ok());
  BOOST_REQUIRE(fs->rename(d + "/synced", d + "/renamed").is_ok());
  // A new folder and a synced file in it, neither folder entry synced.
  BOOST_REQUIRE(fs->create_dir(dir / "e").is_ok());
  auto inner = *fs->create_file(dir / "e/x");
  BOOST_REQUIRE(inner->append("1", 1).is_ok());
  BOOST_REQUIRE(inner->sync().is_ok());
  BOOST_TEST(fs->call_count() == 15u);

  const auto outcomes = fs->crash_outcomes();
  std::set<DiskImage> images;
  for (const auto& o : outcomes)
    images.insert(fs->crash_image(o));
  const DiskImage lost{{"d", std::nullopt}, {"d/synced", "abc"}, {"d/unsynced", ""}};
  DiskImage kept{{"d", std::nullopt},
                 {"d/renamed", "abc"},
                 {"d/unsynced", ""},
                 {"e", std::nullopt},
                 {"e/x", "1"}};
  BOOST_TEST((fs->crash_image(outcomes.at(0)) == lost));
  BOOST_TEST((fs->crash_image(outcomes.at(1)) == kept));
  // Keeping the file in e keeps e; the rename is kept or lost on its own.
  DiskImage only_x = lost;
  only_x["e"] = std::nullopt;
  only_x["e/x"] = "1";
  DiskImage only_rename = kept;
  only_rename.erase("e");
  only_rename.erase("e/x");
  DiskImage only_e = lost;
  only_e["e"] = std::nullopt;
  BOOST_TEST((images == std::set<DiskImage>{lost, kept, only_x, only_e, only_rename}));

  // Put on disk, the state is what the code restarts from; after a reset it is all durable.
  BOOST_REQUIRE(test::write_image(dir.path(), lost).is_ok());
  BOOST_TEST(test::read_file(dir / "d/synced") == "abc");
  BOOST_TEST(!std::filesystem::exists(dir / "e"));
  BOOST_REQUIRE(fs->reset().is_ok());
  BOOST_TEST(fs->crash_outcomes().size() == 1u);
  BOOST_TEST((fs->crash_image(fs->crash_outcomes()[0]) == lost));
}

BOOST_AUTO_TEST_CASE(injected_errors_read_like_the_local_file_systems) {
  TempDir dir;
  auto fs = *FaultFileSystem::create(dir.path());
  // The same errno on the same path, injected or real: the same message.
  const std::string missing = dir / "no/such/file";
  auto real = local_file_system()->create_file(missing);
  fs->inject({FsOp::create_file, "no/such/file", 1, ENOENT, std::nullopt, false});
  auto injected = fs->create_file(missing);
  BOOST_REQUIRE(!real.is_ok());
  BOOST_REQUIRE(!injected.is_ok());
  BOOST_TEST(injected.status().message() == real.status().message());
  BOOST_TEST((injected.status().code() == ErrorCode::not_found));

  // The second write fails after 2 of its 4 bytes reach the file.
  fs->inject({FsOp::append, "short", 2, ENOSPC, 2, false});
  auto file = *fs->create_file(dir / "short");
  BOOST_REQUIRE(file->append("ab", 2).is_ok());
  Status st = file->append("cdef", 4);
  BOOST_TEST(st.message() ==
             "write to '" + dir / "short" + "': No space left on device (errno 28)");
  BOOST_TEST((st.code() == ErrorCode::no_space));
  BOOST_TEST(test::read_file(dir / "short") == "abcd");
  // A torn write reports success; the bytes after its first one read as zeros.
  fs->inject({FsOp::write_at, "short", 1, EIO, 1, true});
  BOOST_REQUIRE(file->write_at(1, "XYZ", 3).is_ok());
  BOOST_TEST(test::read_file(dir / "short") == std::string("aX\0\0", 4));
  fs->inject({FsOp::rename, "short", 1, EXDEV, std::nullopt, false});
  st = fs->rename(dir / "short", dir / "long");
  BOOST_TEST(st.message().find("cannot rename '" + dir / "short" + "' to '" + dir / "long" +
                               "': Invalid cross-device link") != std::string::npos,
             st.message());
  fs->inject({FsOp::sync_dir, "", 1, EACCES, std::nullopt, false});
  st = fs->sync_dir(dir.path());
  BOOST_TEST(st.message() == "fsync of folder '" + dir.path() + "': Permission denied (errno 13)");
  // The calls are numbered in order, each with its answer.
  const auto calls = fs->calls();
  BOOST_REQUIRE(calls.size() == 7u);
  BOOST_TEST(calls[0].status.message() == real.status().message());
  BOOST_TEST(calls[4].to_string() == "4 write_at '" + dir / "short" + "' [1, +3)");
  BOOST_TEST((calls[6].op == FsOp::sync_dir));
}

// -- a power loss at every point of a save --

BOOST_AUTO_TEST_CASE(a_power_loss_at_any_point_of_a_save_leaves_a_checkpoint_to_resume_from) {
  SaveEngineOptions staged{8, 2, false, {}};
  staged.stage_host_memory = true;
  std::vector<SaveCase> cases;
  cases.emplace_back();
  cases.back().name = "sync save";
  cases.emplace_back();
  cases.back().name = "async save of 2 ranks, with a trainer state";
  cases.back().ranks = 2;
  cases.back().async = true;
  cases.back().options = {2, 1, false, {}};
  cases.emplace_back();
  cases.back().name = "sync save staged through 2 of 8 buckets";
  cases.back().options = staged;
  cases.emplace_back();
  cases.back().name = "save, then retention keeping 2";
  cases.back().before = {1, 2};
  cases.back().step = 3;
  cases.back().keep = 2;
  cases.emplace_back();
  cases.back().name = "save, then an export";
  cases.back().export_after = true;
  cases.emplace_back();
  cases.back().name = "first save into a ckpt_path that does not exist yet";
  cases.back().before = {};
  cases.back().step = 1;
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.name) {
      const auto start = std::chrono::steady_clock::now();
      const Coverage coverage = check_every_crash_point(c);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      BOOST_TEST_MESSAGE(c.name << ": " << coverage.calls << " calls, " << coverage.crash_points
                                << " crash points, " << coverage.outcomes << " outcomes, "
                                << coverage.restarts << " distinct states restarted from, in "
                                << seconds << " s");
      BOOST_TEST(coverage.restarts > 0u);
    }
  }
}

// -- failed calls --

namespace {

/// What an error must say: the path (below the root; empty: the root) and the errno.
void check_names_path_and_errno(const Status& st, const std::string& path, int error) {
  BOOST_TEST(!st.is_ok());
  BOOST_TEST(st.message().find("'" + path + "'") != std::string::npos, st.message());
  const std::string errno_text =
      std::string(std::strerror(error)) + " (errno " + std::to_string(error) + ")";
  BOOST_TEST(st.message().find(errno_text) != std::string::npos, st.message());
}

/// A save that failed on one injected fault.
struct FailedSave {
  const char* what;
  FsFault fault;
  /// The path the error names, below the root (empty: the root).
  std::string path;
  /// The fault came after the rename: the new step stays in place, complete, untracked.
  bool in_place = false;
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_save_that_fails_names_the_path_and_errno_and_keeps_the_previous_checkpoint) {
  auto fault = [](FsOp op, const char* suffix, int error,
                  std::optional<std::uint64_t> written = {}) {
    return FsFault{op, suffix, 1, error, written, false};
  };
  const std::vector<FailedSave> cases{
      {"EIO on the fsync of a bucket file", fault(FsOp::sync, "/__0_0.safetensors", EIO),
       "global_step_2.tmp/policy/__0_0.safetensors"},
      {"EIO on the close of a bucket file", fault(FsOp::close, "/__0_1.safetensors", EIO),
       "global_step_2.tmp/policy/__0_1.safetensors"},
      {"ENOSPC in the middle of a bucket",
       fault(FsOp::write_at, "/__0_1.safetensors", ENOSPC, 4096),
       "global_step_2.tmp/policy/__0_1.safetensors"},
      {"EACCES creating metadata.json", fault(FsOp::create_file, "/metadata.json.tmp", EACCES),
       "global_step_2.tmp/policy/metadata.json.tmp"},
      {"EIO on the fsync of metadata.json", fault(FsOp::sync, "/metadata.json.tmp", EIO),
       "global_step_2.tmp/policy/metadata.json.tmp"},
      {"EIO on the fsync of the policy folder",
       fault(FsOp::sync_dir, "global_step_2.tmp/policy", EIO), "global_step_2.tmp/policy"},
      {"EIO on the fsync of the step folder", fault(FsOp::sync_dir, "/global_step_2.tmp", EIO),
       "global_step_2.tmp"},
      {"EACCES on the rename of the step folder", fault(FsOp::rename, "/global_step_2.tmp", EACCES),
       "global_step_2.tmp"},
      {"EXDEV on the rename of the step folder", fault(FsOp::rename, "/global_step_2.tmp", EXDEV),
       "global_step_2.tmp"},
      {"EIO on the fsync of ckpt_path after the rename", fault(FsOp::sync_dir, "/ckpt", EIO), "",
       true},
      {"ENOSPC writing the tracker",
       fault(FsOp::append, "/latest_ckpt_global_step.txt.tmp", ENOSPC),
       "latest_ckpt_global_step.txt.tmp", true},
      {"EIO on the fsync of the tracker",
       fault(FsOp::sync, "/latest_ckpt_global_step.txt.tmp", EIO),
       "latest_ckpt_global_step.txt.tmp", true},
      {"EIO on the rename of the tracker",
       fault(FsOp::rename, "/latest_ckpt_global_step.txt.tmp", EIO),
       "latest_ckpt_global_step.txt.tmp", true},
  };
  const SaveCase save;
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      TempDir tmp;
      const Paths paths = paths_in(tmp);
      const CheckpointStore store(local_file_system(), paths.root);
      BOOST_REQUIRE(save_step(local_file_system(), paths.root, save, 1, states_for(1, 1)).is_ok());
      const DiskImage step1 = image_of(store.step_dir(1));
      auto fs = *FaultFileSystem::create(paths.dir);
      fs->inject(c.fault);
      Status st = save_step(fs, paths.root, save, 2, states_for(1, 2));
      check_names_path_and_errno(st, c.path.empty() ? paths.root : paths.root + "/" + c.path,
                                 c.fault.error);
      BOOST_TEST(tmp_leftovers(paths.root).empty());
      BOOST_TEST(**store.tracker() == 1);
      BOOST_TEST((image_of(store.step_dir(1)) == step1));
      if (c.in_place) {
        BOOST_TEST(st.message().find("is complete and in place") != std::string::npos,
                   st.message());
        BOOST_TEST((*store.committed_steps() == std::vector<std::int64_t>{1, 2}));
        BOOST_TEST(verify_checkpoint(*local_file_system(), store.step_dir(2))->ok());
        check_loads_as(store.step_dir(2), states_for(1, 2));
      } else {
        BOOST_TEST((*store.committed_steps() == std::vector<std::int64_t>{1}));
        BOOST_TEST(!std::filesystem::exists(store.step_dir(2)));
      }
      // The fault has passed: the next save succeeds.
      Status again = save_step(fs, paths.root, save, 2, states_for(1, 2));
      BOOST_REQUIRE_MESSAGE(again.is_ok(), again.message());
      BOOST_TEST(**store.tracker() == 2);
    }
  }
}

BOOST_AUTO_TEST_CASE(
    a_failed_retention_removal_names_the_path_and_errno_and_removes_no_tracked_step) {
  struct Case {
    const char* what;
    FsFault fault;
    const char* path;
    /// The step was retired (renamed to .tmp, which nothing takes for committed) before the
    /// error: its folder is what the next start cleans.
    bool retired;
  };
  const std::vector<Case> cases{
      {"EACCES retiring the oldest step",
       {FsOp::rename, "/global_step_1", 1, EACCES, {}, false},
       "global_step_1",
       false},
      {"EIO on the fsync of ckpt_path after retiring it",
       {FsOp::sync_dir, "/ckpt", 1, EIO, {}, false},
       "",
       true},
      // The first remove_tree of it clears a stale one before the rename.
      {"EIO removing the retired step",
       {FsOp::remove_tree, "/global_step_1.tmp", 2, EIO, {}, false},
       "global_step_1.tmp",
       true},
  };
  const SaveCase save;
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      TempDir tmp;
      const Paths paths = paths_in(tmp);
      const CheckpointStore store(local_file_system(), paths.root);
      std::map<std::int64_t, DiskImage> steps;
      for (std::int64_t step : {1, 2, 3}) {
        BOOST_REQUIRE(save_step(local_file_system(), paths.root, save, step,
                                states_for(1, static_cast<std::uint64_t>(step)))
                          .is_ok());
        steps[step] = image_of(store.step_dir(step));
      }
      auto fs = *FaultFileSystem::create(paths.dir);
      fs->inject(c.fault);
      auto removed = CheckpointStore(fs, paths.root).apply_retention(2);
      check_names_path_and_errno(
          removed.status(), std::string(c.path).empty() ? paths.root : paths.root + "/" + c.path,
          c.fault.error);
      BOOST_TEST(removed.status().message().find("retention") != std::string::npos,
                 removed.status().message());
      BOOST_TEST(**store.tracker() == 3);
      for (std::int64_t step : {2, 3})
        BOOST_TEST((image_of(store.step_dir(step)) == steps[step]));
      if (c.retired) {
        BOOST_TEST((*store.committed_steps() == std::vector<std::int64_t>{2, 3}));
        BOOST_TEST((tmp_leftovers(paths.root) == std::vector<std::string>{"global_step_1.tmp"}));
        BOOST_TEST(*store.clean_interrupted() == 1);
      } else {
        BOOST_TEST((*store.committed_steps() == std::vector<std::int64_t>{1, 2, 3}));
        BOOST_TEST((image_of(store.step_dir(1)) == steps[1]));
      }
      BOOST_TEST(tmp_leftovers(paths.root).empty());
      // The fault has passed: retention finishes.
      auto again = CheckpointStore(fs, paths.root).apply_retention(2);
      BOOST_REQUIRE_MESSAGE(again.is_ok(), again.status().message());
      BOOST_TEST((*store.committed_steps() == std::vector<std::int64_t>{2, 3}));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_torn_write_that_reports_success_is_found_by_verify_and_refused_by_load) {
  TempDir tmp;
  const Paths paths = paths_in(tmp);
  auto fs = *FaultFileSystem::create(paths.dir);
  // The bytes after the first 100 of a bucket's data never reach the file; the call says they did.
  fs->inject({FsOp::write_at, "/__0_0.safetensors", 1, EIO, 100, true});
  const SaveCase save;
  BOOST_REQUIRE(save_step(fs, paths.root, save, 1, states_for(1, 1)).is_ok());
  const std::string dir = test::local_store(paths.root).step_dir(1);
  auto verified = verify_checkpoint(*local_file_system(), dir);
  BOOST_REQUIRE(verified.is_ok());
  BOOST_REQUIRE(!verified->ok());
  BOOST_TEST(verified->problems.front().find("__0_0.safetensors") != std::string::npos,
             verified->problems.front());
  StateDict loaded = test::zeroed_like(states_for(1, 1)[0]);
  Status st = load_checkpoint(*local_file_system(), dir, loaded, LoadOptions{});
  BOOST_TEST((st.code() == ErrorCode::corruption), st.message());
}
