#define BOOST_TEST_MODULE save_engine
#include <boost/test/unit_test.hpp>

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include <filesystem>

#include "bench/synthetic_state.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/save/file_reuse.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/save/save_engine.hpp"
#include "stagehand/checkpoint/save/stager.hpp"
#include "stagehand/checkpoint/save/writer.hpp"
#include "stagehand/core/foreground_gate.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;

namespace {

struct Ranks {
  std::vector<StateDict> states;
  std::vector<std::unique_ptr<SaveEngine>> engines;

  Ranks(const SyntheticStateSpec& spec, SaveEngineOptions options,
        std::shared_ptr<FileSystem> storage = local_file_system()) {
    for (int r = 0; r < spec.ranks; ++r) {
      states.push_back(*make_synthetic_state(spec, r, Device::host()));
      engines.push_back(*SaveEngine::create(r, options, storage));
    }
  }

  Result<std::vector<RankSaveReport>> save(const std::string& root, std::int64_t step) {
    std::vector<SaveEngine*> e;
    std::vector<const StateDict*> s;
    for (std::size_t i = 0; i < states.size(); ++i) {
      e.push_back(engines[i].get());
      s.push_back(&states[i]);
    }
    return save_checkpoint_in_process(root, step, e, s);
  }
};

const SyntheticStateSpec kSpec{3, 3u << 20, 23, 42};

}  // namespace

BOOST_AUTO_TEST_CASE(options_are_checked) {
  BOOST_TEST(!SaveEngine::create(0, {0, 0, false, {}}).is_ok());
  BOOST_TEST(!SaveEngine::create(0, {2, 3, false, {}}).is_ok());
  BOOST_TEST(!SaveEngine::create(0, {2, -1, false, {}}).is_ok());
  BOOST_TEST(SaveEngine::create(0, {2, 2, false, {}}).is_ok());
  // The config's rule (config/rules.hpp), named by its keys.
  BOOST_TEST(SaveEngine::create(0, {2, 3, false, {}}).status().message() ==
             "megatron_config.ckpt_save_staging_buckets: must be at most "
             "megatron_config.ckpt_save_thread_count (2), got 3");
}

BOOST_AUTO_TEST_CASE(waves_give_global_bucket_indices_and_one_report) {
  for (int staging : {0, 1, 2, 3, 8}) {
    BOOST_TEST_CONTEXT("staging " << staging) {
      TempDir dir;
      Ranks ranks(kSpec, {8, staging, false, {}});
      auto reports = ranks.save(dir.path(), 1);
      BOOST_REQUIRE_MESSAGE(reports.is_ok(), reports.status().to_string());
      BOOST_TEST(reports->size() == 3u);
      for (std::size_t r = 0; r < reports->size(); ++r) {
        const auto& report = (*reports)[r];
        BOOST_TEST(report.rank == static_cast<int>(r));
        BOOST_TEST(report.status.is_ok());
        BOOST_REQUIRE(report.buckets.size() == 8u);
        for (int b = 0; b < 8; ++b) {
          BOOST_TEST(report.buckets[static_cast<std::size_t>(b)].bucket == b);
          BOOST_TEST(report.buckets[static_cast<std::size_t>(b)].file ==
                     CheckpointLayout::bucket_file_name(static_cast<int>(r), b));
        }
      }
    }
  }
}

/// Options that copy host memory out through staging slots, as device memory is.
static SaveEngineOptions staged(int threads, int staging) {
  SaveEngineOptions options{threads, staging, false, {}};
  options.stage_host_memory = true;
  return options;
}

BOOST_AUTO_TEST_CASE(sync_saves_of_host_memory_copy_nothing) {
  auto state = *make_synthetic_state({1, 8u << 20, 40, 3}, 0, Device::host());
  for (int staging : {0, 2}) {
    TempDir dir;
    auto engine = *SaveEngine::create(0, {8, staging, false, {}});
    BOOST_REQUIRE(engine->prepare(state, false).is_ok());
    const std::size_t before = staging_memory().current();
    staging_memory().reset_peak();
    auto tmp = *test::prepare_checkpoint_dir(dir.path(), 1);
    auto report = engine->save(state, CheckpointLayout::policy_dir(tmp), 1);
    BOOST_TEST(report.status.is_ok());
    BOOST_TEST(engine->staging_bytes() == 0u);
    BOOST_TEST(staging_memory().peak() == before);
    BOOST_TEST(report.phases.copy_s == 0.0);
    BOOST_TEST(report.phases.write_s > 0.0);
  }
}

BOOST_AUTO_TEST_CASE(staging_slots_bound_host_memory) {
  auto state = *make_synthetic_state({1, 8u << 20, 40, 3}, 0, Device::host());
  for (bool async : {false, true}) {
    for (int staging : {0, 1, 2, 4}) {
      BOOST_TEST_CONTEXT("async " << async << " staging " << staging) {
        auto engine = *SaveEngine::create(0, staged(8, staging));
        const SavePlan& plan = **engine->plan_for(state);
        std::uint64_t largest = 0;
        for (const auto& b : plan.buckets) largest = std::max(largest, b.data_bytes);
        BOOST_REQUIRE(engine->prepare(state, async).is_ok());
        const std::size_t held = engine->staging_bytes();
        BOOST_TEST(held > 0u);
        if (staging > 0) BOOST_TEST(held <= staging * largest);
        // An async snapshot of everything holds the shard and an eighth more (for a first save
        // whose global plan gives the rank more); a ring never more than the shard.
        const std::size_t data = plan.data_bytes();
        if (async && staging == 0) {
          BOOST_TEST(held == data + data / StagingPool::kSlackDivisor);
        } else {
          BOOST_TEST(held <= data);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_state_of_empty_tensors_saves_through_any_path) {
  // No bucket has a byte: no staging slot, and no piece to cut (this divided by zero once).
  StateDict state;
  state.add_full("empty", *Tensor::empty(DType::f32, Shape{0, 4}, Device::host()));
  for (bool copy_out : {false, true}) {
    for (bool per_save : {false, true}) {
      BOOST_TEST_CONTEXT("copied out " << copy_out << ", per save " << per_save) {
        TempDir dir;
        SaveEngineOptions options = staged(2, 0);
        options.stage_host_memory = copy_out;
        options.release_after_save = per_save;
        auto engine = *SaveEngine::create(0, options);
        auto tmp = *test::prepare_checkpoint_dir(dir.path(), 1);
        BOOST_TEST(engine->save(state, CheckpointLayout::policy_dir(tmp), 1).status.is_ok());
        BOOST_REQUIRE(engine->begin_async(state).is_ok());
        BOOST_TEST(engine->write_async(state, CheckpointLayout::policy_dir(tmp), 1, [] {}).status.is_ok());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(an_async_save_s_background_write_waits_at_the_foreground_gate_and_foreground_work_does_not) {
  using namespace std::chrono_literals;
  const test::GateLimit limit(60s);
  for (int staging : {0, 1}) {
    BOOST_TEST_CONTEXT("staging " << staging) {
      TempDir dir;
      auto engine = *SaveEngine::create(0, staged(2, staging));
      const StateDict state = *make_synthetic_state(kSpec, 0, Device::host());
      auto first = *test::prepare_checkpoint_dir(dir.path(), 1);
      auto second = *test::prepare_checkpoint_dir(dir.path(), 2);
      // Another caller blocked on its staging.
      ForegroundGate::Hold held = foreground_gate().hold();
      // Foreground work goes through: a sync save and the staging before an async save returns
      // (each would wait the gate's minute if it waited).
      const auto started = std::chrono::steady_clock::now();
      BOOST_TEST(engine->save(state, CheckpointLayout::policy_dir(first), 1).status.is_ok());
      BOOST_REQUIRE(engine->begin_async(state).is_ok());
      const std::chrono::duration<double> foreground = std::chrono::steady_clock::now() - started;
      BOOST_TEST(foreground.count() < 30.0);
      std::atomic<bool> written{false};
      RankSaveReport report;
      std::thread background([&] {
        report = engine->write_async(state, CheckpointLayout::policy_dir(second), 2, [] {});
        written = true;
      });
      std::this_thread::sleep_for(200ms);
      BOOST_TEST(!written.load());  // Waiting at the gate (a write of 3 MiB takes milliseconds).
      held.release();
      background.join();
      BOOST_TEST(report.status.is_ok(), report.status.to_string());
      BOOST_TEST(test::files_of(first) == test::files_of(second));  // The same bytes either way.
    }
  }
}

BOOST_AUTO_TEST_CASE(staging_buffers_are_reused_across_saves) {
  TempDir dir;
  Ranks ranks({1, 2u << 20, 10, 5}, staged(4, 2));
  BOOST_REQUIRE(ranks.save(dir.path(), 1).is_ok());
  std::size_t before = staging_memory().current();
  std::size_t held = ranks.engines[0]->staging_bytes();
  BOOST_TEST(held > 0u);
  BOOST_REQUIRE(ranks.save(dir.path(), 2).is_ok());
  BOOST_REQUIRE(ranks.save(dir.path(), 3).is_ok());
  BOOST_TEST(staging_memory().current() == before);
  BOOST_TEST(ranks.engines[0]->staging_bytes() == held);
}

BOOST_AUTO_TEST_CASE(staging_memory_held_serves_slots_cut_otherwise_and_only_what_is_more_is_allocated) {
  // The first save's plan (the global plan's, with other ranks' replicas to write and without
  // its own) is cut otherwise than the whole state reserved at start: its slots take the
  // memory held.
  constexpr std::size_t k = 64u << 10;
  StagingPool pool(false);
  BOOST_REQUIRE(pool.reserve({8 * k, 8 * k, 8 * k}).is_ok());
  const std::size_t before = staging_memory().current();
  const std::uint8_t* held = pool.data(0);
  // Up to an eighth less: laid out in what is held, largest first.
  BOOST_REQUIRE(pool.reserve({7 * k, 2 * k, 6 * k, 7 * k}).is_ok());
  BOOST_TEST(pool.data(0) == held);
  BOOST_TEST(pool.data(3) == held + 7 * k);
  BOOST_TEST(pool.data(2) == held + 14 * k);
  BOOST_TEST(pool.data(1) == held + 20 * k);
  BOOST_TEST(staging_memory().current() == before);
  BOOST_TEST(pool.bytes() == 24 * k);
  // Slots are what was reserved: pieces are cut to 7k, a piece over 6k fits slots 0 and 3.
  BOOST_TEST(pool.piece_bytes() == 7 * k);
  std::size_t slot = 0;
  BOOST_REQUIRE(pool.try_acquire(6 * k + 1, slot));
  BOOST_TEST(slot == 0u);
  BOOST_REQUIRE(pool.try_acquire(6 * k + 1, slot));
  BOOST_TEST(slot == 3u);
  BOOST_TEST(!pool.try_acquire(6 * k + 1, slot));
  BOOST_REQUIRE(pool.try_acquire(2 * k, slot));
  BOOST_TEST(slot == 1u);
  for (std::size_t taken : {0, 1, 3}) pool.give_back(taken);
  // More: what does not fit in what is held gets a buffer of its own, of exactly its size.
  BOOST_REQUIRE(pool.reserve({12 * k, 12 * k, 4 * k}).is_ok());
  BOOST_TEST(pool.data(0) == held);
  BOOST_TEST(pool.data(1) == held + 12 * k);
  BOOST_TEST(pool.bytes() == 28 * k);
  BOOST_TEST(staging_memory().current() == before + 4 * k);
  // More than an eighth less: laid out in what is held, the tail no slot takes given back (no
  // new allocation, whose pages would all be touched again), the buffer no slot takes freed.
  BOOST_REQUIRE(pool.reserve({10 * k, 10 * k}).is_ok());
  BOOST_TEST(pool.bytes() == 20 * k);
  BOOST_TEST(pool.data(0) == held);
  BOOST_TEST(pool.data(1) == held + 10 * k);
  BOOST_TEST(staging_memory().current() == before - 4 * k);
  // Growing again after a trim: only what is more gets a buffer of its own.
  BOOST_REQUIRE(pool.reserve({10 * k, 10 * k, 3 * k}).is_ok());
  BOOST_TEST(pool.data(0) == held);
  BOOST_TEST(pool.bytes() == 23 * k);
  BOOST_TEST(staging_memory().current() == before - k);
  std::memset(pool.data(2), 0x5a, 3 * k);
  BOOST_REQUIRE(pool.reserve({10 * k, 10 * k}).is_ok());
  pool.release_all();
  BOOST_TEST(pool.bytes() == 0u);
  BOOST_TEST(pool.slot_count() == 0u);
  BOOST_TEST(staging_memory().current() == before - 24 * k);
}

/// Saves kSpec's rank states through begin_async/write_async, as an async save does.
static std::map<std::string, std::string> async_files(const SaveEngineOptions& options) {
  TempDir dir;
  Ranks ranks(kSpec, options);
  auto tmp = *test::prepare_checkpoint_dir(dir.path(), 4);
  std::vector<RankSaveReport> reports;
  std::vector<const StateDict*> states;
  for (const auto& s : ranks.states) states.push_back(&s);
  auto planned = planned_states(states, 4);  // the writers the coordinator assigns
  BOOST_REQUIRE(planned.is_ok());
  for (std::size_t r = 0; r < ranks.states.size(); ++r) {
    const StateDict& state = (*planned)[r];
    BOOST_REQUIRE(ranks.engines[r]->begin_async(state).is_ok());
    int signalled = 0;
    reports.push_back(ranks.engines[r]->write_async(state, CheckpointLayout::policy_dir(tmp), 4, [&] { ++signalled; }));
    BOOST_TEST(signalled == 1);
    BOOST_REQUIRE_MESSAGE(reports.back().status.is_ok(), reports.back().status.to_string());
  }
  std::vector<const StateDict*> saved;
  for (const StateDict& s : *planned) saved.push_back(&s);
  BOOST_REQUIRE(test::commit_checkpoint(dir.path(), 4, reports, kSpec.ranks, saved).is_ok());
  return test::files_of(dir.path());
}

BOOST_AUTO_TEST_CASE(files_are_byte_identical_whatever_the_source_and_staging) {
  const int threads = 6;
  std::map<std::string, std::string> reference;
  auto compare = [&](const std::map<std::string, std::string>& files) {
    BOOST_TEST(files.count("global_step_4/policy/metadata.json") == 1u);
    BOOST_TEST(files.count("global_step_4/policy/__2_5.safetensors") == 1u);
    if (reference.empty()) {
      reference = files;
      return;
    }
    BOOST_REQUIRE(files.size() == reference.size());
    for (const auto& [name, bytes] : reference) {
      BOOST_TEST((files.at(name) == bytes), name << " differs");
    }
  };
  for (bool copy_out : {false, true}) {
    for (bool uncached : {false, true}) {
      for (int staging : {0, 1, 2, threads}) {
        BOOST_TEST_CONTEXT("sync, copied out " << copy_out << ", uncached " << uncached << ", staging " << staging) {
          TempDir dir;
          SaveEngineOptions options{threads, staging, false, {}};
          options.stage_host_memory = copy_out;
          options.uncached_writes = uncached;
          Ranks ranks(kSpec, options);
          BOOST_REQUIRE(ranks.save(dir.path(), 4).is_ok());
          compare(test::files_of(dir.path()));
        }
      }
    }
  }
  for (bool uncached : {false, true}) {
    for (int staging : {0, 1, 2, threads}) {
      BOOST_TEST_CONTEXT("async, uncached " << uncached << ", staging " << staging) {
        SaveEngineOptions options{threads, staging, false, {}};
        options.uncached_writes = uncached;
        compare(async_files(options));
      }
    }
  }
}

namespace {

/// A precondition: the temporary folder is on a device whose file system takes O_DIRECT
/// (reported as skipped where it is not: tmpfs, whose pages are all in memory, takes O_DIRECT
/// since Linux 6.6).
boost::test_tools::assertion_result temp_takes_direct_io(boost::unit_test::test_unit_id) {
  TempDir dir;
  boost::test_tools::assertion_result result(test::takes_direct_io(dir.path()) &&
                                             !local_file_system()->capabilities(dir.path()).in_memory);
  result.message() << dir.path() << " is in memory or does not take O_DIRECT";
  return result;
}

/// Pages of the data files in `dir`, and how many of them are in the page cache.
std::pair<std::size_t, std::size_t> data_file_pages(const std::string& dir) {
  std::size_t pages = 0;
  std::size_t cached = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    pages += (std::filesystem::file_size(entry.path()) + 4095) / 4096;
    cached += test::cached_pages(entry.path().string());
  }
  return {pages, cached};
}

}  // namespace

BOOST_AUTO_TEST_CASE(uncached_writes_leave_the_staged_bytes_out_of_the_page_cache,
                     *boost::unit_test::precondition(temp_takes_direct_io)) {
  // Pieces of a bucket are staged at their file bytes' offset within a block and go to the
  // device from there; only the blocks at a piece's ends (and the header's) pass the cache. A
  // sync save of host memory copies each block through a bounce block placed so.
  const SyntheticStateSpec spec{1, 24u << 20, 7, 5};
  for (int staging : {0, 2}) {
    for (bool copy_out : {false, true}) {
      BOOST_TEST_CONTEXT("staging " << staging << ", copied out " << copy_out) {
        for (bool uncached : {false, true}) {
          TempDir root;
          SaveEngineOptions options{4, staging, false, {}};
          options.stage_host_memory = copy_out;
          options.uncached_writes = uncached;
          Ranks ranks(spec, options);
          BOOST_REQUIRE(ranks.save(root.path(), 1).is_ok());
          const auto [pages, cached] = data_file_pages(root / "global_step_1/policy");
          BOOST_TEST_CONTEXT("uncached " << uncached << ": " << cached << " of " << pages << " pages cached") {
            BOOST_TEST(pages >= 6000u);
            if (uncached) {
              BOOST_TEST(cached * 20 < pages);
            } else {
              BOOST_TEST(cached * 2 > pages);
            }
          }
          // Sync saves of host memory hold a bounce block per writer thread at most, and only
          // when uncached.
          BOOST_TEST(ranks.engines[0]->bounce_bytes() <= (uncached && !copy_out ? 4u * kBounceBytes : 0u));
          if (uncached && !copy_out) BOOST_TEST(ranks.engines[0]->bounce_bytes() > 0u);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(uncached_saves_write_over_retired_files_around_the_cache_too,
                     *boost::unit_test::precondition(temp_takes_direct_io)) {
  // With retention, a save writes over the data files of a removed step (reusing_file_system):
  // around the cache as well, cut where its bytes end, the same bytes as a save into new files.
  const SyntheticStateSpec spec{1, 24u << 20, 7, 5};
  for (bool copy_out : {false, true}) {
    BOOST_TEST_CONTEXT("copied out " << copy_out) {
      TempDir plain;
      TempDir root;
      SaveEngineOptions options{4, 0, false, {}};
      options.stage_host_memory = copy_out;
      options.uncached_writes = true;
      BOOST_REQUIRE(Ranks(spec, options).save(plain.path(), 2).is_ok());
      auto reusing = reusing_file_system(local_file_system(), {root.path()});
      Ranks ranks(spec, options, reusing);
      BOOST_REQUIRE(ranks.save(root.path(), 1).is_ok());
      // Longer old files than the new ones, so that a file not cut shows; their inodes, to see
      // them written over.
      std::map<std::string, ino_t> inodes;
      for (const auto& entry : std::filesystem::directory_iterator(root / "global_step_1/policy")) {
        if (entry.path().extension() != ".safetensors") continue;
        std::filesystem::resize_file(entry.path(), 30u << 20);
        struct stat st {};
        BOOST_REQUIRE(::stat(entry.path().c_str(), &st) == 0);
        inodes[entry.path().filename().string()] = st.st_ino;
      }
      BOOST_REQUIRE(!inodes.empty());
      BOOST_REQUIRE(reusing->remove_tree(root / "global_step_1").is_ok());
      BOOST_REQUIRE(ranks.save(root.path(), 2).is_ok());
      BOOST_TEST(!std::filesystem::exists(root / "global_step_1"));
      const auto [pages, cached] = data_file_pages(root / "global_step_2/policy");
      BOOST_TEST_CONTEXT(cached << " of " << pages << " pages cached") { BOOST_TEST(cached * 20 < pages); }
      for (const auto& entry : std::filesystem::directory_iterator(plain / "global_step_2/policy")) {
        if (entry.path().extension() != ".safetensors") continue;
        const std::string name = entry.path().filename().string();
        const std::string over = root / ("global_step_2/policy/" + name);
        BOOST_TEST((test::read_file(entry.path().string()) == test::read_file(over)),
                   name << " differs from the same save into a new file");
        struct stat st {};
        BOOST_REQUIRE(::stat(over.c_str(), &st) == 0);
        BOOST_TEST((inodes.count(name) == 1 && inodes[name] == st.st_ino), name << " is not step 1's file written over");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(hashes_are_taken_in_one_pass_over_pieces_of_any_size) {
  // Pieces that cut chunks anywhere (and empty chunks) give the hashes of whole chunks and files.
  auto state = *make_synthetic_state({1, 1u << 20, 17, 11}, 0, Device::host());
  state.add_full("empty", *Tensor::empty(DType::f32, Shape{0, 4}, Device::host()));
  SavePlan plan = plan_save(0, state.descriptors(), 3);
  for (const auto& bucket : plan.buckets) {
    std::string data;
    for (const auto& item : bucket.items) {
      const Tensor& t = state.tensors[item.tensor_index].tensor;
      data.append(static_cast<const char*>(t.data()), t.nbytes());
    }
    for (std::size_t piece : {std::size_t{1}, std::size_t{4095}, std::size_t{65536}, data.size() + 1}) {
      std::vector<ChunkRecord> chunks;
      BucketHasher hasher(bucket, chunks);
      for (std::size_t at = 0; at < data.size(); at += piece) {
        hasher.consume(reinterpret_cast<const std::uint8_t*>(data.data()) + at, std::min(piece, data.size() - at));
      }
      BOOST_REQUIRE(chunks.size() == bucket.items.size());
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        const auto& item = bucket.items[i];
        BOOST_TEST(chunks[i].xxh3 == xxh3(data.data() + item.data_offset, item.nbytes));
        BOOST_TEST(chunks[i].begin == bucket.header.size() + item.data_offset);
      }
      BOOST_TEST(hasher.file_digest() == xxh3((bucket.header + data).data(), bucket.header.size() + data.size()));
    }
  }
}

BOOST_AUTO_TEST_CASE(an_error_in_one_bucket_stops_the_others_and_is_the_one_reported) {
  for (bool copy_out : {false, true}) {
    BOOST_TEST_CONTEXT("copied out " << copy_out) {
      TempDir dir;
      auto storage = std::make_shared<test::FaultStorage>();
      storage->fail_file = "__0_3.safetensors";
      storage->fail_errno = ENOSPC;
      auto state = *make_synthetic_state({1, 2u << 20, 24, 9}, 0, Device::host());
      SaveEngineOptions options{8, 2, false, {}};
      options.stage_host_memory = copy_out;
      auto engine = *SaveEngine::create(0, options, storage);
      auto tmp = *test::prepare_checkpoint_dir(dir.path(), 1);
      auto report = engine->save(state, CheckpointLayout::policy_dir(tmp), 1);
      BOOST_TEST(!report.status.is_ok());
      BOOST_TEST((report.status.code() == ErrorCode::no_space));
      BOOST_TEST(report.status.sys_errno() == ENOSPC);
      BOOST_TEST(report.status.message().find("bucket 3") != std::string::npos);
      BOOST_TEST(report.status.message().find("__0_3.safetensors") != std::string::npos);
      BOOST_REQUIRE(report.buckets.size() == 8u);
      for (const auto& b : report.buckets) {
        // Every other bucket either finished or stopped because of bucket 3.
        if (b.bucket != 3 && !b.status.is_ok()) BOOST_TEST((b.status.code() == ErrorCode::aborted));
      }
      // The same engine saves again once the storage is healthy, with every slot given back.
      storage->fail_file = "none";
      auto again = *test::prepare_checkpoint_dir(dir.path(), 2);
      BOOST_TEST(engine->save(state, CheckpointLayout::policy_dir(again), 2).status.is_ok());
    }
  }
}

BOOST_AUTO_TEST_CASE(a_failed_rank_commits_nothing) {
  TempDir dir;
  Ranks good(kSpec, {2, 0, false, {}});
  BOOST_REQUIRE(good.save(dir.path(), 1).is_ok());
  auto storage = std::make_shared<test::FaultStorage>();
  storage->fail_file = "__1_1.safetensors";
  Ranks bad(kSpec, {2, 0, false, {}}, storage);
  auto result = bad.save(dir.path(), 2);
  BOOST_TEST(!result.is_ok());
  BOOST_TEST(result.status().message().find("rank 1") != std::string::npos);
  BOOST_TEST(!std::filesystem::exists(dir / "global_step_2"));
  BOOST_TEST(!std::filesystem::exists(dir / "global_step_2.tmp"));
  BOOST_TEST(**test::read_tracker(dir.path()) == 1);
}

BOOST_AUTO_TEST_CASE(a_rate_limited_backend_paces_writes_and_keeps_their_bytes) {
  BOOST_TEST((rate_limited(local_file_system(), 0) == local_file_system()));
  test::TempDir dir;
  auto limited = rate_limited(local_file_system(), 1024.0 * 1024.0);
  std::string bytes(512u << 10, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  auto start = std::chrono::steady_clock::now();
  auto file = limited->create_file(dir / "f");
  BOOST_REQUIRE(file.is_ok());
  BOOST_REQUIRE((*file)->append(bytes.data(), bytes.size() / 2).is_ok());
  BOOST_REQUIRE((*file)->write_at(bytes.size() / 2, bytes.data() + bytes.size() / 2, bytes.size() / 2).is_ok());
  BOOST_REQUIRE((*file)->close().is_ok());
  // 512 KiB at 1 MiB/s cannot take less than half a second (sleeping only adds to it).
  BOOST_TEST((std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(450)));
  BOOST_TEST((test::read_file(dir / "f") == bytes));
}

namespace {

/// Set by a BackgroundWriteback's thread start, on its thread.
thread_local bool g_started_here = false;

/// A file that records its start_writeback calls (the range, and whether the thread had run the
/// thread start); with `hold`, each call waits until released.
class WritebackProbe final : public WritableFile {
 public:
  Status append(const void*, std::size_t) override { return Status::ok(); }
  Status write_at(std::uint64_t, const void*, std::size_t) override { return Status::ok(); }
  Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
    std::unique_lock lock(mutex);
    calls.emplace_back(offset, offset + bytes);
    started_here.push_back(g_started_here);
    entered.notify_all();
    released.wait(lock, [&] { return !hold; });
    return Status::ok();
  }
  Status sync() override { return Status::ok(); }
  Status close() override { return Status::ok(); }

  void wait_for_calls(std::size_t n) {
    std::unique_lock lock(mutex);
    entered.wait(lock, [&] { return calls.size() >= n; });
  }
  void release() {
    {
      std::lock_guard lock(mutex);
      hold = false;
    }
    released.notify_all();
  }

  std::mutex mutex;
  std::condition_variable entered;
  std::condition_variable released;
  bool hold = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> calls;
  std::vector<bool> started_here;
};

}  // namespace

BOOST_AUTO_TEST_CASE(background_writeback_merges_a_file_s_queued_ranges_and_forget_drops_and_waits) {
  WritebackProbe a;
  WritebackProbe b;
  a.hold = true;
  {
    BackgroundWriteback writeback;
    writeback.request(a, 0, 10);
    a.wait_for_calls(1);  // [0, 10) runs and is held
    // Queued behind it: a's touching ranges merge into one; b's stays its own.
    writeback.request(a, 10, 10);
    writeback.request(b, 0, 4);
    writeback.request(a, 20, 10);
    writeback.request(a, 100, 5);  // not touching: a range of its own
    // forget(b) drops b's queued range at once, though the thread is held on a.
    writeback.forget(b);
    // forget(a) drops a's queued ranges and waits for the running one: it cannot return while
    // that call is held.
    std::atomic<bool> forgotten{false};
    std::thread forgetting([&] {
      writeback.forget(a);
      forgotten = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    BOOST_TEST(!forgotten.load());
    a.release();
    forgetting.join();
    BOOST_TEST(forgotten.load());
    BOOST_TEST(writeback.started() == 1u);
    // After forget, the file may be used again.
    writeback.request(a, 0, 8);
    a.wait_for_calls(2);
    writeback.forget(a);
  }
  BOOST_TEST(b.calls.empty());
  BOOST_REQUIRE(a.calls.size() == 2u);
  BOOST_TEST((a.calls[0] == std::pair<std::uint64_t, std::uint64_t>{0, 10}));
  BOOST_TEST((a.calls[1] == std::pair<std::uint64_t, std::uint64_t>{0, 8}));

  // Touching ranges queued while the thread is busy run as one.
  WritebackProbe c;
  c.hold = true;
  BackgroundWriteback writeback;
  writeback.request(c, 0, 1);
  c.wait_for_calls(1);
  for (std::uint64_t at = 1; at < 64; ++at) writeback.request(c, at, 1);
  c.release();
  c.wait_for_calls(2);
  writeback.forget(c);
  BOOST_REQUIRE(c.calls.size() == 2u);
  BOOST_TEST((c.calls[1] == std::pair<std::uint64_t, std::uint64_t>{1, 64}));
}

BOOST_AUTO_TEST_CASE(background_writeback_runs_its_thread_start_first) {
  // The writers' priority (nice 10, I/O priority 7) reaches the write-back requests too.
  WritebackProbe file;
  {
    BackgroundWriteback writeback([] { g_started_here = true; });
    writeback.request(file, 0, 4096);
    file.wait_for_calls(1);
    writeback.forget(file);
  }
  BOOST_REQUIRE(file.started_here.size() == 1u);
  BOOST_TEST(file.started_here[0]);
  BOOST_TEST(!g_started_here);  // not on this thread
}

namespace {

/// The local file system, recording for every file the threads that wrote it, the threads that
/// started its write-back, and write-backs that came after its sync. A file's third write waits
/// (at most 10 s) until the write-back of one of its ranges has started, so that the background
/// thread is seen to work however the threads are scheduled.
class WritebackRecorder final : public FileSystemWrapper {
 public:
  WritebackRecorder() : FileSystemWrapper(local_file_system()) {}

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto inner, inner().create_file(path));
    return std::unique_ptr<WritableFile>(std::make_unique<File>(std::move(inner), *this));
  }

  bool wait_for_writeback = false;
  std::mutex mutex;
  std::condition_variable started;
  std::set<std::thread::id> writers;
  std::set<std::thread::id> starters;
  std::uint64_t started_bytes = 0;
  int after_sync = 0;

 private:
  class File final : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> inner, WritebackRecorder& fs) : inner_(std::move(inner)), fs_(fs) {}
    Status append(const void* data, std::size_t bytes) override { return inner_->append(data, bytes); }
    Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
      {
        std::unique_lock lock(fs_.mutex);
        fs_.writers.insert(std::this_thread::get_id());
        if (++writes_ == 3 && fs_.wait_for_writeback) {
          fs_.started.wait_for(lock, std::chrono::seconds(10), [&] { return started_ > 0; });
        }
      }
      return inner_->write_at(offset, data, bytes);
    }
    Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
      {
        std::lock_guard lock(fs_.mutex);
        fs_.starters.insert(std::this_thread::get_id());
        fs_.started_bytes += bytes;
        ++started_;
        if (synced_) ++fs_.after_sync;
      }
      fs_.started.notify_all();
      return inner_->start_writeback(offset, bytes);
    }
    Status sync() override {
      {
        std::lock_guard lock(fs_.mutex);
        synced_ = true;
      }
      return inner_->sync();
    }
    Status close() override { return inner_->close(); }

   private:
    std::unique_ptr<WritableFile> inner_;
    WritebackRecorder& fs_;
    // Under fs_.mutex:
    bool synced_ = false;
    int writes_ = 0;
    int started_ = 0;
  };
};

}  // namespace

BOOST_AUTO_TEST_CASE(early_writeback_starts_off_the_writer_threads_and_never_after_a_file_s_sync) {
  for (bool early : {true, false}) {
    BOOST_TEST_CONTEXT("early_writeback " << early) {
      TempDir dir;
      auto recorder = std::make_shared<WritebackRecorder>();
      recorder->wait_for_writeback = early;
      SaveEngineOptions options;
      options.thread_count = 2;
      options.early_writeback = early;
      // Files of several 2 MiB writes each.
      Ranks ranks(SyntheticStateSpec{2, 24u << 20, 8, 7}, options, recorder);
      auto reports = ranks.save(dir / "ckpt", 1);
      BOOST_REQUIRE_MESSAGE(reports.is_ok(), reports.status().to_string());
      std::lock_guard lock(recorder->mutex);
      BOOST_TEST(!recorder->writers.empty());
      BOOST_TEST(recorder->after_sync == 0);
      if (!early) {
        BOOST_TEST(recorder->starters.empty());
        continue;
      }
      BOOST_TEST(recorder->started_bytes > 0u);
      for (const auto& id : recorder->starters) BOOST_TEST(recorder->writers.count(id) == 0u);
    }
  }
}
