#define BOOST_TEST_MODULE object_store_checkpoint
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "stagehand/actors/checkpoint_coordinator.hpp"
#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/format/trainer_state.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "stagehand/config/config.hpp"
#include "stagehand/core/log.hpp"
#include "stagehand/strategy/megatron_strategy.hpp"
#include "tests/s3_test_util.hpp"
#include "tests/strategy_cluster.hpp"
#include "tests/test_util.hpp"
#include "stagehand/trainers/checkpoint_policy.hpp"

using namespace stagehand;
using namespace stagehand::test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kBucket = "ckpt-bucket";

/// Two ranks, each with a strategy, behind one coordinator; saves to `destination`.
struct Cluster : test::StrategyCluster {
  Cluster(const SyntheticStateSpec& spec, const std::string& destination, bool async, const ObjectStoreOptions& store,
          const std::string& work_dir)
      : test::StrategyCluster(destination, {spec, async, 4, nullptr, work_dir, false, store}) {}

  /// Saves `step` with a trainer state, as the trainers do.
  Result<SaveResult> save(std::int64_t step) {
    return client->save(step, "{\"step\": " + std::to_string(step) + "}\n");
  }
};

void expect_loads(const std::string& path, const SyntheticStateSpec& spec, const ObjectStoreOptions& store) {
  auto resolved = resolve_checkpoint(path, store);
  BOOST_REQUIRE_MESSAGE(resolved.is_ok(), resolved.status().to_string());
  const std::string checkpoint_dir = *resolved;
  for (int r = 0; r < spec.ranks; ++r) {
    auto expected = *make_synthetic_state(spec, r, Device::host());
    StateDict loaded = test::zeroed_like(expected);
    Status st = load_checkpoint(checkpoint_dir, loaded, store);
    BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, expected.tensors[i].tensor));
    }
  }
}

/// Runs tests/integration/s3_check.py (boto3) on `url`; returns its JSON line.
nlohmann::json independent_check(const S3Server& server, const std::string& url, const std::string& local = "") {
  auto run = run_command(server.env() + " python3 " + source_dir() + "/tests/integration/s3_check.py " + url +
                         (local.empty() ? "" : " --compare-local " + local));
  BOOST_TEST(run.code == 0, run.output);
  auto line = run.output.substr(run.output.rfind('{'));
  auto j = nlohmann::json::parse(line, nullptr, false);
  BOOST_REQUIRE_MESSAGE(!j.is_discarded(), run.output);
  return j;
}

const SyntheticStateSpec kSmall{2, 2u << 20, 24, 11};

}  // namespace

BOOST_AUTO_TEST_CASE(an_async_request_to_s3_saves_synchronously_uploads_and_commits) {
  S3Server server({kBucket});
  TempDir work;
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  logger()->sinks().push_back(sink);
  const std::string url = std::string("s3://") + kBucket + "/run/a";
  {
    Cluster cluster(kSmall, url, /*async=*/true, server.options(), work.path());
    for (std::int64_t step : {1, 2}) {
      auto timing = cluster.save(step);
      BOOST_REQUIRE_MESSAGE(timing.is_ok(), timing.status().to_string());
      BOOST_TEST(!timing->async);
      // Committed when save returns: the tracker already names it.
      auto root = test::CloudRoot::open(url, server.options());
      BOOST_REQUIRE(root.is_ok());
      BOOST_TEST(**root->read_tracker() == step);
    }
  }
  logger()->sinks().pop_back();
  std::string text = log.str();
  std::size_t warnings = 0;
  for (auto p = text.find("is in an object store"); p != std::string::npos; p = text.find("is in an object store", p + 1)) {
    ++warnings;
  }
  BOOST_TEST(warnings == 1u, text);
  // The local copies are gone once uploaded.
  BOOST_TEST(!fs::exists(work / "s3/ckpt-bucket/run/a/global_step_2.tmp"));
  BOOST_TEST(!fs::exists(work / "s3/ckpt-bucket/run/a/global_step_2"));

  auto resolved = resolve_checkpoint(url, server.options());
  BOOST_REQUIRE_MESSAGE(resolved.is_ok(), resolved.status().to_string());
  BOOST_TEST(*resolved == url + "/global_step_2");
  expect_loads(*resolved, kSmall, server.options());
  auto verified = verify_checkpoint(*resolved, server.options());
  BOOST_REQUIRE(verified.is_ok());
  BOOST_TEST(verified->ok());
  // Eight data files and the trainer state.
  BOOST_TEST(verified->files_checked == 9u);
  auto state = read_trainer_state(*default_file_system(server.options()), *resolved);
  BOOST_REQUIRE(state.is_ok());
  BOOST_TEST(state->step == 2);

  auto check = independent_check(server, url);
  BOOST_TEST(check["step"] == 2);
  BOOST_TEST(check["files"] == 8);
  BOOST_TEST(check["problems"].empty());
}

BOOST_AUTO_TEST_CASE(local_and_cloud_checkpoints_of_the_same_state_hold_identical_data) {
  S3Server server({kBucket});
  TempDir work;
  TempDir local;
  const std::string url = std::string("s3://") + kBucket + "/same";
  {
    Cluster to_cloud(kSmall, url, false, server.options(), work.path());
    BOOST_REQUIRE(to_cloud.save(5).is_ok());
  }
  {
    Cluster to_disk(kSmall, local / "ckpt", false, server.options(), work.path());
    BOOST_REQUIRE(to_disk.save(5).is_ok());
  }
  auto check = independent_check(server, url, local / "ckpt");
  BOOST_TEST(check["problems"].empty(), check.dump());
  // The metadata is the same document too.
  auto remote = test::CloudRoot::open(url, server.options());
  BOOST_REQUIRE(remote.is_ok());
  auto metadata = remote->bucket().get("same/global_step_5/policy/metadata.json");
  BOOST_REQUIRE(metadata.is_ok() && metadata->has_value());
  BOOST_TEST(**metadata == read_file(local / "ckpt/global_step_5/policy/metadata.json"));
}

BOOST_AUTO_TEST_CASE(large_files_go_up_in_parts_and_come_back_byte_identical) {
  S3Server server({kBucket});
  TempDir work;
  auto store = server.options();
  store.multipart_threshold = 5 << 20;
  store.part_size = 5 << 20;
  // 2 ranks x 40 MiB in 4 buckets: every bucket file is about 10 MiB, two or three parts.
  const SyntheticStateSpec spec{2, 40u << 20, 16, 3};
  const std::string url = std::string("s3://") + kBucket + "/big";
  {
    Cluster cluster(spec, url, false, store, work.path());
    BOOST_REQUIRE(cluster.save(1).is_ok());
  }
  auto check = independent_check(server, url);
  BOOST_TEST(check["problems"].empty(), check.dump());
  BOOST_TEST(check["multipart"].size() == check["files"].get<std::size_t>(), check.dump());
  expect_loads(url, spec, store);
}

BOOST_AUTO_TEST_CASE(loads_fetch_only_the_byte_ranges_a_rank_needs) {
  S3Server server({kBucket}, /*proxy=*/true);
  TempDir work;
  const SyntheticStateSpec spec{2, 8u << 20, 16, 5};
  const std::string url = std::string("s3://") + kBucket + "/ranged";
  {
    Cluster cluster(spec, url, false, server.options(), work.path());
    BOOST_REQUIRE(cluster.save(1).is_ok());
  }
  auto metadata = read_checkpoint_metadata(url + "/global_step_1", server.options());
  BOOST_REQUIRE(metadata.is_ok());
  std::uint64_t total = 0;
  for (const auto& [name, f] : metadata->files) total += f.size;
  BOOST_REQUIRE(server.command("reset_stats") == "ok");
  auto expected = *make_synthetic_state(spec, 0, Device::host());
  StateDict loaded = test::zeroed_like(expected);
  BOOST_REQUIRE(load_checkpoint(url + "/global_step_1", loaded, server.options(true)).is_ok());
  for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
    BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, expected.tensors[i].tensor));
  }
  std::uint64_t needed = 0;
  for (const auto& t : expected.tensors) needed += t.desc.nbytes();
  auto stats = nlohmann::json::parse(server.command("stats"));
  std::uint64_t received = stats["received"];
  // Rank 0's blocks (its shards and the replicated tensors) plus HTTP overhead, far from every file.
  BOOST_TEST(received >= needed);
  BOOST_TEST(received < needed + (needed / 10) + (256u << 10), "received " << received << ", needed " << needed);
  BOOST_TEST(received < total * 3 / 4, "received " << received << " of " << total);
}

BOOST_AUTO_TEST_CASE(a_server_that_stops_mid_upload_fails_the_save_and_keeps_the_previous_checkpoint) {
  S3Server server({kBucket}, /*proxy=*/true);
  TempDir work;
  auto store = server.options(/*through_proxy=*/true);
  store.multipart_threshold = 5 << 20;
  store.part_size = 5 << 20;
  store.upload_threads = 2;
  const SyntheticStateSpec spec{2, 40u << 20, 16, 9};
  const std::string url = std::string("s3://") + kBucket + "/outage";
  {
    Cluster cluster(spec, url, false, store, work.path());
    BOOST_REQUIRE(cluster.save(1).is_ok());
    // The server goes away after about 30 MB of the second save and stays away.
    BOOST_REQUIRE(server.command("down_after 30000000") == "ok");
    auto second = cluster.save(2);
    BOOST_REQUIRE(!second.is_ok());
    const std::string why = second.status().message();
    BOOST_TEST(why.find("global_step_2/policy/__") != std::string::npos, why);
    BOOST_TEST(why.find("gave up after 4 attempts") != std::string::npos, why);
    BOOST_TEST(why.find("cannot reach the object store") != std::string::npos, why);
    BOOST_REQUIRE(server.command("up") == "ok");
  }
  auto root = test::CloudRoot::open(url, server.options());
  BOOST_REQUIRE(root.is_ok());
  BOOST_TEST(**root->read_tracker() == 1);
  BOOST_TEST(!*root->is_committed(2));
  expect_loads(url, spec, server.options());
  // What the dead server kept (parts, objects of step 2) is cleaned at the next start.
  TrainerConfig trainer;
  trainer.ckpt_path = url;
  CheckpointPolicy policy(trainer, default_file_system(server.options()));
  BOOST_REQUIRE(policy.clean_interrupted_saves().is_ok());
  BOOST_TEST(root->bucket().open_uploads("outage/")->empty());
  BOOST_TEST(root->bucket().list("outage/global_step_2")->empty());
  // Eight data objects, the trainer state and the metadata.
  BOOST_TEST(root->bucket().list("outage/global_step_1")->size() == 10u);
  auto check = independent_check(server, url);
  BOOST_TEST(check["problems"].empty(), check.dump());
}

BOOST_AUTO_TEST_CASE(retention_deletes_old_steps_objects_after_a_commit) {
  S3Server server({kBucket});
  TempDir work;
  const std::string url = std::string("s3://") + kBucket + "/keep";
  TrainerConfig trainer;
  trainer.ckpt_path = url;
  trainer.max_ckpts_to_keep = 2;
  CheckpointPolicy policy(trainer, default_file_system(server.options()));
  {
    Cluster cluster(kSmall, url, false, server.options(), work.path());
    for (std::int64_t step : {1, 2, 3, 4}) {
      BOOST_REQUIRE(cluster.save(step).is_ok());
      BOOST_REQUIRE(policy.apply_retention().is_ok());
    }
  }
  auto root = test::CloudRoot::open(url, server.options());
  BOOST_TEST((*root->committed_steps() == std::vector<std::int64_t>{3, 4}));
  BOOST_TEST(root->bucket().list("keep/global_step_1")->empty());
  BOOST_TEST(root->bucket().list("keep/global_step_2")->empty());
  expect_loads(url + "/global_step_3", kSmall, server.options());
}

BOOST_AUTO_TEST_CASE(a_committed_step_in_the_store_is_never_overwritten) {
  S3Server server({kBucket});
  TempDir work;
  const std::string url = std::string("s3://") + kBucket + "/once";
  Cluster cluster(kSmall, url, false, server.options(), work.path());
  BOOST_REQUIRE(cluster.save(3).is_ok());
  auto again = cluster.save(3);
  BOOST_REQUIRE(!again.is_ok());
  BOOST_TEST(again.status().message().find("already committed") != std::string::npos, again.status().message());
  expect_loads(url, kSmall, server.options());
}

BOOST_AUTO_TEST_CASE(destination_checks_name_each_failure) {
  S3Server server({kBucket});
  auto check = [&](const std::string& url, const ObjectStoreOptions& store) {
    TrainerConfig trainer;
    trainer.ckpt_path = url;
    return CheckpointPolicy(trainer, default_file_system(store)).check_destination();
  };
  BOOST_TEST(check(std::string("s3://") + kBucket + "/ok", server.options()).is_ok());
  auto wrong = server.options();
  wrong.secret_access_key = "wrong";
  Status st = check(std::string("s3://") + kBucket + "/ok", wrong);
  BOOST_TEST((st.code() == ErrorCode::permission_denied));
  BOOST_TEST(st.message().find("trainer: ckpt_path 's3://ckpt-bucket/ok'") != std::string::npos, st.message());
  st = check("s3://missing-bucket/ok", server.options());
  BOOST_TEST((st.code() == ErrorCode::not_found));
  BOOST_TEST(st.message().find("bucket 'missing-bucket' does not exist") != std::string::npos, st.message());
  auto nowhere = server.options();
  nowhere.endpoint = "http://127.0.0.1:1";
  st = check(std::string("s3://") + kBucket + "/ok", nowhere);
  BOOST_TEST(st.message().find("cannot reach the object store") != std::string::npos, st.message());
}

BOOST_AUTO_TEST_CASE(gs_urls_use_the_same_protocol) {
  S3Server server({kBucket});
  TempDir work;
  const std::string url = std::string("gs://") + kBucket + "/gcs-run";
  {
    Cluster cluster(kSmall, url, false, server.options(), work.path());
    BOOST_REQUIRE(cluster.save(7).is_ok());
  }
  auto resolved = resolve_checkpoint(url, server.options());
  BOOST_REQUIRE(resolved.is_ok());
  BOOST_TEST(*resolved == url + "/global_step_7");
  expect_loads(url, kSmall, server.options());
  auto check = independent_check(server, std::string("s3://") + kBucket + "/gcs-run");
  BOOST_TEST(check["problems"].empty(), check.dump());
}

BOOST_AUTO_TEST_CASE(start_up_cleaning_says_what_it_removes) {
  S3Server server({kBucket});
  const std::string url = std::string("s3://") + kBucket + "/leftovers";
  auto root = test::CloudRoot::open(url, server.options());
  BOOST_REQUIRE(root.is_ok());
  // A killed save left two data objects of step 4 (no metadata) and two open uploads.
  BOOST_REQUIRE(root->bucket().put("leftovers/global_step_4/policy/__0_0.safetensors", "x").is_ok());
  BOOST_REQUIRE(root->bucket().put("leftovers/global_step_4/policy/__1_0.safetensors", "y").is_ok());
  for (const char* key : {"leftovers/global_step_4/policy/__0_1.safetensors", "leftovers/global_step_4/policy/__1_1.safetensors"}) {
    BOOST_REQUIRE(server.command(std::string("open_upload ") + kBucket + " " + key) == "ok");
  }
  // It was spooling a file into its local work folder when it was killed; a live process's spool
  // file beside it stays.
  TempDir work;
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string stale = work / (".spool-" + std::to_string(dead) + "-AbCdEf");
  const std::string live = work / (".spool-" + std::to_string(::getpid()) + "-AbCdEf");
  std::ofstream(stale) << "x";
  std::ofstream(live) << "y";
  auto options = server.options();
  options.spool_dir = work.path();
  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  logger()->sinks().push_back(sink);
  TrainerConfig trainer;
  trainer.ckpt_path = url;
  Status cleaned = CheckpointPolicy(trainer, default_file_system(options)).clean_interrupted_saves();
  logger()->sinks().pop_back();
  BOOST_REQUIRE_MESSAGE(cleaned.is_ok(), cleaned.to_string());
  const std::string text = log.str();
  BOOST_TEST(text.find("removing the files of uncommitted step 4 under '" + url + "'") != std::string::npos, text);
  BOOST_TEST(text.find("aborted 2 unfinished upload(s) under '" + url + "'") != std::string::npos, text);
  BOOST_TEST(text.find("removing '" + stale + "', spooled by a process that is gone") != std::string::npos, text);
  BOOST_TEST(fs::exists(live));
  BOOST_TEST(root->bucket().list("leftovers/")->empty());
  BOOST_TEST(root->bucket().open_uploads("leftovers/")->empty());
  BOOST_TEST(!fs::exists(stale));
}

// -- the process dying at any request of a save to an object store --

namespace {

/// The store as a process that dies at its `die_at`-th call that changes something (counted from
/// 1; 0: never): that call and every later one fail and reach nothing, as after a SIGKILL. On an
/// object store an upload (at a file's sync or close; writes before go to a local spool) either
/// completed or never happened, and nothing completed is lost later, so "request k failing and
/// the process dying there" is this whole model.
class DyingFileSystem final : public FileSystemWrapper {
 public:
  DyingFileSystem(std::shared_ptr<FileSystem> inner, std::size_t die_at)
      : FileSystemWrapper(std::move(inner)), die_at_(die_at) {}

  std::size_t calls() const { return calls_.load(); }

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    SH_RETURN_IF_ERROR(call(path));
    SH_ASSIGN_OR_RETURN(auto file, inner().create_file(path));
    return std::unique_ptr<WritableFile>(new File(*this, path, std::move(file)));
  }
  Status remove_file(const std::string& path) override {
    SH_RETURN_IF_ERROR(call(path));
    return inner().remove_file(path);
  }
  Status create_dir(const std::string& path) override {
    SH_RETURN_IF_ERROR(call(path));
    return inner().create_dir(path);
  }
  Status remove_tree(const std::string& path) override {
    SH_RETURN_IF_ERROR(call(path));
    return inner().remove_tree(path);
  }
  Status sync_dir(const std::string& path) override {
    SH_RETURN_IF_ERROR(call(path));
    return inner().sync_dir(path);
  }

 private:
  class File final : public WritableFile {
   public:
    File(DyingFileSystem& fs, std::string path, std::unique_ptr<WritableFile> inner)
        : fs_(fs), path_(std::move(path)), inner_(std::move(inner)) {}
    Status append(const void* data, std::size_t bytes) override {
      SH_RETURN_IF_ERROR(fs_.call(path_));
      return inner_->append(data, bytes);
    }
    Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
      SH_RETURN_IF_ERROR(fs_.call(path_));
      return inner_->write_at(offset, data, bytes);
    }
    Status sync() override {
      SH_RETURN_IF_ERROR(fs_.call(path_));
      return inner_->sync();
    }
    Status close() override {
      // A dead process closes nothing: what it had not uploaded never reaches the store.
      SH_RETURN_IF_ERROR(fs_.call(path_));
      return inner_->close();
    }

   private:
    DyingFileSystem& fs_;
    std::string path_;
    std::unique_ptr<WritableFile> inner_;
  };

  Status call(const std::string& path) {
    const std::size_t n = ++calls_;
    if (die_at_ == 0 || n < die_at_) return Status::ok();
    return {ErrorCode::io_error, "'" + path + "': the process died at request " + std::to_string(die_at_)};
  }

  std::size_t die_at_;
  std::atomic<std::size_t> calls_{0};
};

/// Saves the synthetic state of `seed` as `step` of `root`, two ranks in this process.
/// The small two-rank state of `seed` (a step's state has its step as seed).
SyntheticStateSpec seeded_spec(std::uint64_t seed) { return {2, 96u << 10, 6, seed, 256}; }

Status save_seeded(const std::shared_ptr<FileSystem>& fs, const std::string& root, std::int64_t step,
                   std::uint64_t seed) {
  const SyntheticStateSpec spec = seeded_spec(seed);
  std::vector<StateDict> states;
  std::vector<std::unique_ptr<SaveEngine>> engines;
  std::vector<SaveEngine*> e;
  std::vector<const StateDict*> s;
  for (int r = 0; r < spec.ranks; ++r) states.push_back(*make_synthetic_state(spec, r, Device::host()));
  for (int r = 0; r < spec.ranks; ++r) {
    // One file per rank: the fewest calls that still cover every kind (data files, metadata,
    // tracker), so that each crash point costs little.
    SH_ASSIGN_OR_RETURN(auto engine, SaveEngine::create(r, SaveEngineOptions{1, 0, false, {}}, fs));
    engines.push_back(std::move(engine));
    e.push_back(engines.back().get());
    s.push_back(&states[static_cast<std::size_t>(r)]);
  }
  return save_checkpoint_in_process(root, step, e, s, fs).status();
}

/// What a restart finds: after start-up cleaning, the step the tracker names verifies and holds,
/// bit for bit, the state of that step's seed; returns that step.
std::int64_t check_restart(const std::shared_ptr<FileSystem>& fs, const std::string& url, const ObjectStoreOptions& store) {
  TrainerConfig trainer;
  trainer.ckpt_path = url;
  Status cleaned = CheckpointPolicy(trainer, fs).clean_interrupted_saves();
  BOOST_REQUIRE_MESSAGE(cleaned.is_ok(), cleaned.to_string());
  auto tracked = CheckpointStore(fs, url).tracker();
  BOOST_REQUIRE_MESSAGE(tracked.is_ok() && tracked->has_value(), "no tracker under " + url);
  const std::int64_t step = **tracked;
  auto dir = resolve_checkpoint(*fs, url);
  BOOST_REQUIRE_MESSAGE(dir.is_ok(), dir.status().to_string());
  auto verified = verify_checkpoint(*fs, *dir);
  BOOST_REQUIRE_MESSAGE(verified.is_ok(), verified.status().to_string());
  BOOST_TEST(verified->ok(), url << ": " << (verified->problems.empty() ? "" : verified->problems[0]));
  expect_loads(url, seeded_spec(static_cast<std::uint64_t>(step)), store);
  return step;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_process_dying_at_any_request_of_a_save_leaves_a_checkpoint_to_resume_from) {
  S3Server server({kBucket});
  TempDir work;
  auto options = server.options();
  options.spool_dir = work.path();
  auto store_fs = default_file_system(options);
  const std::string base = std::string("s3://") + kBucket + "/dying";
  // The requests of step 2's save (after step 1), counted once.
  std::size_t requests = 0;
  {
    BOOST_REQUIRE(save_seeded(store_fs, base + "/count", 1, 1).is_ok());
    auto counting = std::make_shared<DyingFileSystem>(store_fs, 0);
    BOOST_REQUIRE(save_seeded(counting, base + "/count", 2, 2).is_ok());
    requests = counting->calls();
  }
  BOOST_REQUIRE(requests > 4u);
  int previous = 0;
  int next = 0;
  for (std::size_t k = 1; k <= requests; ++k) {
    const std::string url = base + "/k" + std::to_string(k);
    BOOST_REQUIRE(save_seeded(store_fs, url, 1, 1).is_ok());
    auto dying = std::make_shared<DyingFileSystem>(store_fs, k);
    BOOST_TEST(!save_seeded(dying, url, 2, 2).is_ok(), "request " << k);
    // The restart: a fresh process on the same store.
    const std::int64_t found = check_restart(store_fs, url, options);
    BOOST_TEST((found == 1 || found == 2), url << ": the tracker names step " << found);
    ++(found == 1 ? previous : next);
    // And the next save goes through.
    BOOST_REQUIRE(save_seeded(store_fs, url, 3, 3).is_ok());
    BOOST_TEST(check_restart(store_fs, url, options) == 3);
  }
  BOOST_TEST_MESSAGE("object store: " << requests << " crash points (one per request of the save); the restart "
                                      << "found the previous step after " << previous << " and the new one after "
                                      << next);
  BOOST_TEST(previous > 0);
}
