#define BOOST_TEST_MODULE read_count
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "stagehand/actors/checkpointer.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_group.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/storage/file_system.hpp"
#include "tests/integration/spmd_state.hpp"
#include "tests/test_util.hpp"

// Work done once: a load of 4 ranks in one process (each rank a different block of every
// tensor) reads metadata.json in full once (each rank reads its first 64 bytes, which hold
// its checksum, to check that the parsed copy is still that file), the tracker at most once, and
// each byte range of the data files once: a saved chunk that blocks of several ranks need (a
// column slice each) is read by one rank of the process for all (LoadGroup), and so is one that
// two live tensors of one rank take. Then the LoadGroup's ways out: a rank that fails before
// reading, a late rank, a corrupt shared chunk, ranks loading different folders.

using namespace stagehand;
using stagehand::test::TempDir;

namespace {

/// Counts opens and reads by file, and every byte range read.
class CountingFileSystem final : public FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;

  struct Counts {
    int opens = 0;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;  // [begin, end)
  };

  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto inner, FileSystemWrapper::open_file(path));
    std::lock_guard lock(mutex_);
    ++counts_[path].opens;
    return std::unique_ptr<ReadableFile>(std::make_unique<CountingFile>(std::move(inner), this, path));
  }

  std::map<std::string, Counts> counts() {
    std::lock_guard lock(mutex_);
    return counts_;
  }
  void reset() {
    std::lock_guard lock(mutex_);
    counts_.clear();
  }

 private:
  class CountingFile final : public ReadableFile {
   public:
    CountingFile(std::unique_ptr<ReadableFile> inner, CountingFileSystem* fs, std::string path)
        : inner_(std::move(inner)), fs_(fs), path_(std::move(path)) {}
    std::uint64_t size() const override { return inner_->size(); }
    Status read(std::uint64_t offset, void* dst, std::size_t bytes) override {
      fs_->record(path_, offset, bytes);
      return inner_->read(offset, dst, bytes);
    }
    Status read_vectored(std::uint64_t offset, const std::vector<ReadSegment>& segments) override {
      std::uint64_t bytes = 0;
      for (const auto& s : segments) bytes += s.bytes;
      fs_->record(path_, offset, bytes);
      return inner_->read_vectored(offset, segments);
    }

   private:
    std::unique_ptr<ReadableFile> inner_;
    CountingFileSystem* fs_;
    std::string path_;
  };

  void record(const std::string& path, std::uint64_t offset, std::uint64_t bytes) {
    std::lock_guard lock(mutex_);
    counts_[path].ranges.emplace_back(offset, offset + bytes);
  }

  std::mutex mutex_;
  std::map<std::string, Counts> counts_;
};

std::string base_name(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

/// Bytes of data files read, and the size of the union of the ranges read (what reading each
/// byte once would cost).
std::pair<std::uint64_t, std::uint64_t> data_bytes(CountingFileSystem& counting) {
  std::uint64_t read_bytes = 0, distinct_bytes = 0;
  for (auto& [path, c] : counting.counts()) {
    if (base_name(path).find(".safetensors") == std::string::npos) continue;
    auto ranges = c.ranges;
    std::sort(ranges.begin(), ranges.end());
    std::uint64_t reach = 0;
    for (const auto& [begin, end] : ranges) {
      read_bytes += end - begin;
      if (end > reach) distinct_bytes += end - std::max(begin, reach);
      reach = std::max(reach, end);
    }
  }
  return {read_bytes, distinct_bytes};
}

/// A checkpoint of step 3 saved by 4 ranks (tensor 2 x data 2) under `root`; its step folder.
std::string save_four_ranks(const std::string& root) {
  std::vector<std::unique_ptr<test::SpmdRank>> ranks;
  std::vector<StateDict> states;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<test::SpmdRank>(r, test::SpmdLayout{2, 2}, 3));
    states.push_back(ranks.back()->state);
  }
  Checkpointer saver({.root = root, .world_size = 4, .thread_count = 4});
  BOOST_REQUIRE(saver.save(3, states).is_ok());
  auto dir = resolve_checkpoint(*local_file_system(), root);
  BOOST_REQUIRE(dir.is_ok());
  return *dir;
}

/// 4 ranks of tensor 4 x data 1, zeros: each block a column slice of saved chunks that another
/// loading rank also needs.
struct Loaders {
  std::vector<std::unique_ptr<test::SpmdRank>> ranks;
  std::vector<StateDict> states;
  Loaders() {
    for (int r = 0; r < 4; ++r) {
      ranks.push_back(std::make_unique<test::SpmdRank>(r, test::SpmdLayout{4, 1}, 3, /*zeros=*/true));
      states.push_back(ranks.back()->state);
    }
  }
};

/// Every rank of `loaders` holds the values of step 3 (and `results`, when given, are all ok).
void expect_loaded(const Loaders& loaders, const std::vector<Status>& results = {}) {
  for (std::size_t r = 0; r < loaders.ranks.size(); ++r) {
    if (!results.empty()) BOOST_TEST(results[r].is_ok(), results[r].to_string());
    const std::string wrong = loaders.ranks[r]->check(3, loaders.states[r]);
    BOOST_TEST(wrong.empty(), "rank " << r << ": " << wrong);
  }
}

/// Loads `dir` into each rank of `loaders` on its own thread through `group`, rank r starting
/// after delays[r]; returns each rank's status.
std::vector<Status> load_in_threads(FileSystem& fs, const std::string& dir, Loaders& loaders, LoadGroup& group,
                                    std::vector<std::chrono::milliseconds> delays = {}) {
  delays.resize(loaders.states.size());
  std::vector<Status> results(loaders.states.size());
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < loaders.states.size(); ++r) {
    threads.emplace_back([&, r] {
      std::this_thread::sleep_for(delays[r]);
      LoadOptions options;
      options.thread_count = 2;
      results[r] = load_checkpoint(fs, dir, loaders.states[r], options, nullptr, &group, static_cast<int>(r));
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_load_of_four_ranks_in_one_process_reads_the_metadata_once) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  save_four_ranks(root);
  auto counting = std::make_shared<CountingFileSystem>(local_file_system());
  Loaders loaders;  // another layout (tensor 4 x data 1): each rank reads other blocks
  CheckpointerOptions options{.root = root, .world_size = 4, .thread_count = 4};
  options.file_system = counting;
  Checkpointer ckpt(options);
  Status loaded = ckpt.load(loaders.states, root);
  BOOST_REQUIRE_MESSAGE(loaded.is_ok(), loaded.to_string());
  expect_loaded(loaders);

  int metadata_opens = 0;
  int metadata_full_reads = 0;
  int tracker_opens = 0;
  for (auto& [path, c] : counting->counts()) {
    const std::string name = base_name(path);
    if (name == "metadata.json") {
      metadata_opens += c.opens;
      for (const auto& [begin, end] : c.ranges) {
        if (end - begin > 64) ++metadata_full_reads;
      }
    }
    if (name.rfind("latest_", 0) == 0) tracker_opens += c.opens;
  }
  const auto [read_bytes, distinct_bytes] = data_bytes(*counting);
  BOOST_TEST_MESSAGE("data bytes read " << read_bytes << ", distinct " << distinct_bytes << " ("
                                        << static_cast<double>(read_bytes) / static_cast<double>(distinct_bytes) << "x)");
  BOOST_TEST(distinct_bytes > 0u);
  BOOST_TEST(read_bytes == distinct_bytes);  // headers included: each file's is read once too
  BOOST_TEST_MESSAGE("metadata.json opens: " << metadata_opens << ", full reads: " << metadata_full_reads
                                             << ", tracker opens: " << tracker_opens);
  BOOST_TEST(metadata_full_reads == 1);
  BOOST_TEST(metadata_opens <= 4 + 2);  // the 64-byte checks of 4 ranks, and the one read after
  BOOST_TEST(tracker_opens <= 1);

  // The next load of the same Checkpointer is the group's next round: once again.
  counting->reset();
  for (auto& l : loaders.ranks) l->weight.assign(l->weight.size(), 0.0f);
  loaded = ckpt.load(loaders.states, root);
  BOOST_REQUIRE_MESSAGE(loaded.is_ok(), loaded.to_string());
  expect_loaded(loaders);
  const auto [again, again_distinct] = data_bytes(*counting);
  BOOST_TEST(again == again_distinct);
}

BOOST_AUTO_TEST_CASE(two_live_tensors_taken_from_one_saved_tensor_read_it_once) {
  TempDir dir;
  const std::string step_dir = save_four_ranks(dir / "ckpt");
  // One rank holding the whole weight twice: as itself and as an fp32 master copy of it.
  std::vector<float> weight(static_cast<std::size_t>(test::kRows * test::kCols)), master(weight.size());
  StateDict state;
  state.add_full("model.w", *Tensor::from_blob(weight.data(), DType::f32, Shape{test::kRows, test::kCols}, Device::host()));
  state.add_full("master.w", *Tensor::from_blob(master.data(), DType::f32, Shape{test::kRows, test::kCols}, Device::host()));
  CountingFileSystem counting(local_file_system());
  LoadOptions options;
  options.sources["master.w"] = "model.w";
  LoadReport report;
  Status loaded = load_checkpoint(counting, step_dir, state, options, &report);
  BOOST_REQUIRE_MESSAGE(loaded.is_ok(), loaded.to_string());
  for (std::int64_t i = 0; i < test::kRows; i += 37) {
    for (std::int64_t j = 0; j < test::kCols; j += 41) {
      const auto at = static_cast<std::size_t>(i * test::kCols + j);
      BOOST_TEST(weight[at] == test::weight_value(3, i, j));
      BOOST_TEST(master[at] == test::weight_value(3, i, j));
    }
  }
  const auto [read_bytes, distinct_bytes] = data_bytes(counting);
  BOOST_TEST(distinct_bytes >= weight.size() * sizeof(float));
  BOOST_TEST(read_bytes == distinct_bytes);
}

BOOST_AUTO_TEST_CASE(a_rank_that_fails_before_reading_does_not_hold_up_the_others) {
  TempDir dir;
  const std::string step_dir = save_four_ranks(dir / "ckpt");
  Loaders loaders;
  std::vector<float> extra(4);
  loaders.states[2].add_full("not.saved", *Tensor::from_blob(extra.data(), DType::f32, Shape{4}, Device::host()));
  LoadGroup group(4, std::chrono::seconds(60));
  const auto start = std::chrono::steady_clock::now();
  auto results = load_in_threads(*local_file_system(), step_dir, loaders, group);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST(results[2].message().find("'not.saved'") != std::string::npos, results[2].to_string());
  for (int r : {0, 1, 3}) {
    BOOST_TEST(results[r].is_ok(), results[r].to_string());
    BOOST_TEST(loaders.ranks[r]->check(3, loaders.states[r]).empty(), loaders.ranks[r]->check(3, loaders.states[r]));
  }
  BOOST_TEST(extra == std::vector<float>(4, 0.0f));  // the failed rank's state is untouched
  BOOST_TEST(seconds < 30.0);  // nobody waited for the arrival limit (60 s)
}

BOOST_AUTO_TEST_CASE(a_late_rank_loads_alone_and_so_do_the_ranks_that_waited_for_it) {
  TempDir dir;
  const std::string step_dir = save_four_ranks(dir / "ckpt");
  Loaders loaders;
  LoadGroup group(4, std::chrono::milliseconds(200));
  using std::chrono::milliseconds;
  auto results = load_in_threads(*local_file_system(), step_dir, loaders, group,
                                 {milliseconds(0), milliseconds(0), milliseconds(0), milliseconds(1500)});
  expect_loaded(loaders, results);
  // The next round is whole again: shared.
  CountingFileSystem counting(local_file_system());
  Loaders again;
  results = load_in_threads(counting, step_dir, again, group);
  expect_loaded(again, results);
  const auto [read_bytes, distinct_bytes] = data_bytes(counting);
  BOOST_TEST(read_bytes == distinct_bytes);
}

BOOST_AUTO_TEST_CASE(a_corrupt_chunk_that_ranks_share_fails_each_of_them) {
  TempDir dir;
  const std::string step_dir = save_four_ranks(dir / "ckpt");
  // Flip a byte of the first saved chunk of model.w (columns 0-255), which loading ranks 0 and 1
  // both need: one of them reads it for both, and both (the whole round) must fail.
  auto metadata = read_checkpoint_metadata(*local_file_system(), step_dir);
  BOOST_REQUIRE(metadata.is_ok());
  const ChunkMeta& chunk = metadata->tensors.at("model.w").chunks.front();
  BOOST_REQUIRE(chunk.offsets.to_string() == Shape({0, 0}).to_string());
  {
    std::fstream f(step_dir + "/policy/" + chunk.file, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(chunk.begin + (chunk.end - chunk.begin) / 2);
    char c = 0;
    f.seekg(at);
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(at);
    f.write(&c, 1);
    BOOST_REQUIRE(f.good());
  }
  Loaders loaders;
  LoadGroup group(4, std::chrono::seconds(60));
  auto results = load_in_threads(*local_file_system(), step_dir, loaders, group);
  for (int r = 0; r < 4; ++r) {
    BOOST_TEST(results[r].code() == ErrorCode::corruption, results[r].to_string());
    BOOST_TEST(results[r].message().find("checksum mismatch") != std::string::npos, results[r].to_string());
  }
}

BOOST_AUTO_TEST_CASE(ranks_that_load_different_folders_each_read_their_own) {
  TempDir dir;
  const std::string first = save_four_ranks(dir / "a");
  const std::string second = save_four_ranks(dir / "b");
  Loaders loaders;
  LoadGroup group(4, std::chrono::seconds(60));
  std::vector<Status> results(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      LoadOptions options;
      results[r] = load_checkpoint(*local_file_system(), r % 2 == 0 ? first : second, loaders.states[r], options,
                                   nullptr, &group, r);
    });
  }
  for (auto& t : threads) t.join();
  expect_loaded(loaders, results);
}
