#define BOOST_TEST_MODULE read_count
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>

#include "stagehand/actors/checkpointer.hpp"
#include "stagehand/storage/file_system.hpp"
#include "tests/integration/spmd_state.hpp"
#include "tests/test_util.hpp"

// Work done once: a load of 4 ranks in one process (each rank a different block of every
// tensor) reads metadata.json in full once (each rank reads its first 64 bytes, which hold
// its checksum, to check that the parsed copy is still that file) and the tracker at most once. Bytes of data files read by
// more than one rank are counted and printed: a rank whose block is a column slice of a saved
// chunk reads the whole chunk, so two ranks sharing a saved chunk both read it (not yet shared
// between the ranks of a process).

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

}  // namespace

BOOST_AUTO_TEST_CASE(a_load_of_four_ranks_in_one_process_reads_the_metadata_once) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  auto counting = std::make_shared<CountingFileSystem>(local_file_system());
  std::vector<std::unique_ptr<test::SpmdRank>> ranks;
  std::vector<StateDict> states;
  for (int r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<test::SpmdRank>(r, test::SpmdLayout{2, 2}, 3));
    states.push_back(ranks.back()->state);
  }
  {
    Checkpointer saver({.root = root, .world_size = 4, .thread_count = 4});
    BOOST_REQUIRE(saver.save(3, states).is_ok());
  }
  // Load into zeros under another layout (tensor 4 x data 1): each rank reads other blocks.
  std::vector<std::unique_ptr<test::SpmdRank>> loaders;
  std::vector<StateDict> targets;
  for (int r = 0; r < 4; ++r) {
    loaders.push_back(std::make_unique<test::SpmdRank>(r, test::SpmdLayout{4, 1}, 3, /*zeros=*/true));
    targets.push_back(loaders.back()->state);
  }
  CheckpointerOptions options{.root = root, .world_size = 4, .thread_count = 4};
  options.file_system = counting;
  Checkpointer ckpt(options);
  Status loaded = ckpt.load(targets, root);
  BOOST_REQUIRE_MESSAGE(loaded.is_ok(), loaded.to_string());
  for (int r = 0; r < 4; ++r) BOOST_TEST(loaders[r]->check(3, targets[r]).empty(), loaders[r]->check(3, targets[r]));

  int metadata_opens = 0;
  int metadata_full_reads = 0;
  int tracker_opens = 0;
  std::uint64_t read_bytes = 0, distinct_bytes = 0;
  for (auto& [path, c] : counting->counts()) {
    const std::string name = base_name(path);
    if (name == "metadata.json") {
      metadata_opens += c.opens;
      for (const auto& [begin, end] : c.ranges) {
        if (end - begin > 64) ++metadata_full_reads;
      }
    }
    if (name.rfind("latest_", 0) == 0) tracker_opens += c.opens;
    if (name.find(".safetensors") == std::string::npos) continue;
    std::uint64_t file_bytes = 0;
    for (const auto& [begin, end] : c.ranges) file_bytes += end - begin;
    read_bytes += file_bytes;
    // The union of the ranges: what a read of each byte once would cost.
    auto ranges = c.ranges;
    std::sort(ranges.begin(), ranges.end());
    std::uint64_t reach = 0;
    for (const auto& [begin, end] : ranges) {
      if (end > reach) distinct_bytes += end - std::max(begin, reach);
      reach = std::max(reach, end);
    }
  }
  BOOST_TEST_MESSAGE("data bytes read " << read_bytes << ", distinct " << distinct_bytes << " ("
                                        << static_cast<double>(read_bytes) / static_cast<double>(distinct_bytes) << "x)");
  BOOST_TEST(distinct_bytes > 0u);
  BOOST_TEST_MESSAGE("metadata.json opens: " << metadata_opens << ", full reads: " << metadata_full_reads
                                             << ", tracker opens: " << tracker_opens);
  BOOST_TEST(metadata_full_reads == 1);
  BOOST_TEST(metadata_opens <= 4 + 2);  // the 64-byte checks of 4 ranks, and the one read after
  BOOST_TEST(tracker_opens <= 1);
}
