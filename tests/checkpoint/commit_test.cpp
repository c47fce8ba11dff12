#define BOOST_TEST_MODULE commit
#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <filesystem>
#include <functional>

#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/load/load_plan.hpp"
#include "stagehand/checkpoint/load/resolve.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "stagehand/storage/default_file_system.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {

Result<std::vector<RankSaveReport>> save_synthetic(const std::string& root, std::int64_t step, std::uint64_t seed) {
  auto state = *make_synthetic_state({1, 256u << 10, 6, seed}, 0, Device::host());
  auto engine = *SaveEngine::create(0, {2, 0, false, {}});
  return save_checkpoint_in_process(root, step, {engine.get()}, {&state});
}

/// Runs `body` in a child process as the unprivileged user "nobody" (root ignores permissions).
int run_as_nobody(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::getuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(99);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// The local file system with one step of write_file_atomic failing: the write, the sync, the
/// close or the rename of a file (or the sync of a folder).
class FailingStep final : public FileSystemWrapper {
 public:
  explicit FailingStep(std::string step) : FileSystemWrapper(local_file_system()), step_(std::move(step)) {}

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto inner, inner().create_file(path));
    return std::unique_ptr<WritableFile>(std::make_unique<File>(std::move(inner), step_));
  }
  Status rename(const std::string& from, const std::string& to) override {
    if (step_ == "rename") return injected(step_);
    return inner().rename(from, to);
  }
  Status sync_dir(const std::string& path) override {
    if (step_ == "sync_dir") return injected(step_);
    return inner().sync_dir(path);
  }

 private:
  static Status injected(const std::string& step) { return {ErrorCode::io_error, "injected: " + step + " failed"}; }

  class File final : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> inner, std::string step) : inner_(std::move(inner)), step_(std::move(step)) {}
    Status append(const void* data, std::size_t bytes) override {
      if (step_ == "append") return injected(step_);
      return inner_->append(data, bytes);
    }
    Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
      if (step_ == "append") return injected(step_);
      return inner_->write_at(offset, data, bytes);
    }
    Status sync() override { return step_ == "sync" ? injected(step_) : inner_->sync(); }
    Status close() override {
      Status closed = inner_->close();
      return step_ == "close" ? injected(step_) : closed;
    }

   private:
    std::unique_ptr<WritableFile> inner_;
    std::string step_;
  };

  std::string step_;
};

}  // namespace

BOOST_AUTO_TEST_CASE(commit_moves_tracker_last) {
  TempDir dir;
  BOOST_TEST(!test::read_tracker(dir.path())->has_value());
  BOOST_REQUIRE(save_synthetic(dir.path(), 5, 1).is_ok());
  BOOST_TEST(**test::read_tracker(dir.path()) == 5);
  BOOST_REQUIRE(save_synthetic(dir.path(), 10, 2).is_ok());
  BOOST_TEST(**test::read_tracker(dir.path()) == 10);
  BOOST_TEST((test::committed_steps(dir.path()) == std::vector<std::int64_t>{5, 10}));
  BOOST_TEST(test::read_file(dir / "latest_ckpt_global_step.txt") == "10\n");
  BOOST_TEST(!fs::exists(dir / "global_step_10.tmp"));
}

BOOST_AUTO_TEST_CASE(recommitting_a_step_swaps_it_whole) {
  TempDir dir;
  BOOST_REQUIRE(save_synthetic(dir.path(), 3, 1).is_ok());
  auto first = *read_checkpoint_metadata(dir / "global_step_3");
  BOOST_REQUIRE(save_synthetic(dir.path(), 3, 2).is_ok());
  auto second = *read_checkpoint_metadata(dir / "global_step_3");
  BOOST_TEST(first.files.begin()->second.xxh3 != second.files.begin()->second.xxh3);
  BOOST_TEST(!fs::exists(dir / "global_step_3.tmp"));
  BOOST_TEST(verify_checkpoint(dir / "global_step_3")->ok());
}

BOOST_AUTO_TEST_CASE(missing_parent_is_a_clear_error) {
  TempDir dir;
  std::string root = dir / "no/such/parent/ckpts";
  auto result = save_synthetic(root, 1, 1);
  BOOST_TEST(!result.is_ok());
  BOOST_TEST(result.status().message().find("does not exist") != std::string::npos, result.status().message());
  BOOST_TEST(!fs::exists(dir / "no"));
}

BOOST_AUTO_TEST_CASE(read_only_destination_is_a_clear_error) {
  TempDir dir;
  fs::create_directories(dir / "ro");
  // A read-only parent of a missing ckpt_path, and a read-only ckpt_path that holds a checkpoint.
  BOOST_REQUIRE(save_synthetic(dir / "ro/existing", 1, 1).is_ok());
  std::string before = test::read_file(dir / "ro/existing/global_step_1/policy/metadata.json");
  fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read |
                                  fs::perms::others_exec | fs::perms::group_read | fs::perms::group_exec);
  fs::permissions(dir / "ro/existing", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::others_read |
                                           fs::perms::others_exec | fs::perms::group_read | fs::perms::group_exec);
  fs::permissions(dir.path(), fs::perms::all);
  int code = run_as_nobody([&] {
    auto missing = save_synthetic(dir / "ro/new", 1, 1);
    if (missing.is_ok() || missing.status().message().find("Permission denied") == std::string::npos) return 1;
    auto existing = save_synthetic(dir / "ro/existing", 2, 1);
    if (existing.is_ok() || existing.status().message().find("Permission denied") == std::string::npos) return 2;
    // Refused before anything is created, naming the folder.
    if (existing.status().message().find("ro/existing'") == std::string::npos) return 3;
    return 0;
  });
  BOOST_TEST(code == 0);
  BOOST_TEST(test::read_file(dir / "ro/existing/global_step_1/policy/metadata.json") == before);
  BOOST_TEST(**test::read_tracker(dir / "ro/existing") == 1);
  fs::permissions(dir / "ro/existing", fs::perms::owner_all);
  fs::permissions(dir / "ro", fs::perms::owner_all);
}

BOOST_AUTO_TEST_CASE(missing_or_extra_rank_reports_are_refused) {
  auto state = *make_synthetic_state({2, 64u << 10, 4, 1}, 0, Device::host());
  auto engine = *SaveEngine::create(0, {2, 0, false, {}});
  TempDir dir;
  auto tmp = *test::prepare_checkpoint_dir(dir.path(), 1);
  RankSaveReport report = engine->save(state, CheckpointLayout::policy_dir(tmp), 1);
  Status st = test::commit_checkpoint(dir.path(), 1, {report}, 2, {&state});
  BOOST_TEST(st.message().find("rank 1 did not report") != std::string::npos, st.message());
  BOOST_TEST(!fs::exists(dir / "global_step_1"));
  BOOST_TEST(!test::read_tracker(dir.path())->has_value());
}

namespace {

/// The descriptors the chunks of rows_report name, by rank (deques: the ones before stay in
/// place as more are added).
std::map<int, std::deque<ShardedTensorDesc>>& planned_rows() {
  static std::map<int, std::deque<ShardedTensorDesc>> planned;
  return planned;
}

/// The plans' descriptors as the coordinator holds them, for rows_report's chunks.
DescriptorOf planned_rows_of() {
  return [](int rank, std::uint32_t tensor) -> const ShardedTensorDesc* {
    auto& planned = planned_rows();
    auto found = planned.find(rank);
    return found != planned.end() && tensor < found->second.size() ? &found->second[tensor] : nullptr;
  };
}

/// A rank's report of one bucket holding a chunk of a [rows, 4] f32 tensor `name` for each of
/// `row_offsets` (one row each); its descriptors go into planned_rows().
RankSaveReport rows_report(int rank, const std::string& name, std::int64_t rows, std::vector<std::int64_t> row_offsets,
                           DType dtype = DType::f32) {
  RankSaveReport r;
  r.rank = rank;
  r.step = 1;
  BucketWriteResult b;
  b.file = CheckpointLayout::bucket_file_name(rank, 0);
  std::uint64_t at = kDataAlignment;
  for (std::int64_t row : row_offsets) {
    ShardedTensorDesc desc;
    desc.name = name;
    desc.dtype = dtype;
    desc.global_shape = Shape{rows, 4};
    desc.global_offset = Shape{row, 0};
    desc.local_shape = Shape{1, 4};
    auto& planned = planned_rows()[rank];
    planned.push_back(std::move(desc));
    ChunkRecord c;
    c.tensor = static_cast<std::uint32_t>(planned.size() - 1);
    c.begin = at;
    c.end = at + 4 * dtype_size(dtype);
    c.xxh3 = static_cast<std::uint64_t>(rank * 100 + row);
    at = c.end;
    b.chunks.push_back(c);
  }
  b.size = at;
  b.xxh3 = static_cast<std::uint64_t>(rank);
  r.buckets.push_back(b);
  return r;
}

std::string gathered_error(const std::vector<RankSaveReport>& reports, int world_size) {
  auto gathered = gather_reports(1, reports, world_size, planned_rows_of());
  return gathered.is_ok() ? "" : gathered.status().message();
}

}  // namespace

BOOST_AUTO_TEST_CASE(gathered_reports_list_chunks_by_offset_whatever_order_they_came_in) {
  // Rank 0 holds the last rows and reports them backwards; the reports come in reverse rank order.
  std::vector<RankSaveReport> reports = {rows_report(1, "w", 4, {0, 1}), rows_report(0, "w", 4, {3, 2}),
                                         rows_report(1, "b", 2, {0}), rows_report(0, "b", 2, {1})};
  reports[0].buckets.push_back(reports[2].buckets[0]);
  reports[0].buckets.back().file = CheckpointLayout::bucket_file_name(1, 1);
  reports[1].buckets.push_back(reports[3].buckets[0]);
  reports[1].buckets.back().file = CheckpointLayout::bucket_file_name(0, 1);
  reports.resize(2);
  auto gathered = gather_reports(1, reports, 2, planned_rows_of());
  BOOST_REQUIRE_MESSAGE(gathered.is_ok(), gathered.status().message());
  BOOST_REQUIRE(gathered->tensors.size() == 2u);
  BOOST_TEST(gathered->tensors[0].name() == "b");
  BOOST_TEST(gathered->tensors[1].name() == "w");
  std::vector<std::int64_t> rows;
  for (const auto& c : gathered->tensors[1].chunks) rows.push_back(c.desc->global_offset[0]);
  BOOST_TEST((rows == std::vector<std::int64_t>{0, 1, 2, 3}));
  BOOST_TEST(*gathered->tensors[1].chunks[3].file == "__0_0.safetensors");
  BOOST_REQUIRE(gathered->tensors[0].chunks.size() == 2u);
  BOOST_TEST(gathered->tensors[0].chunks[0].desc->global_offset[0] == 0);
  BOOST_TEST(*gathered->tensors[0].chunks[0].file == "__1_1.safetensors");
  // It reads back, and the metadata read back writes the same text: one text either way.
  const std::string text = metadata_to_json(*gathered);
  auto copied = metadata_from_json(text, "gathered");
  BOOST_REQUIRE_MESSAGE(copied.is_ok(), copied.status().message());
  BOOST_TEST(text == metadata_to_json(*copied));
}

BOOST_AUTO_TEST_CASE(gathering_refuses_reports_that_do_not_make_a_checkpoint) {
  BOOST_TEST(gathered_error({rows_report(0, "w", 2, {0}), rows_report(1, "w", 2, {1})}, 2) == "");
  // Two ranks claim row 0: overlapping blocks.
  BOOST_TEST(gathered_error({rows_report(0, "w", 2, {0}), rows_report(1, "w", 2, {0})}, 2).find(
                 "tensor 'w' has two chunks at [0, 0]") != std::string::npos);
  // Out of order first, then the same row twice.
  BOOST_TEST(gathered_error({rows_report(0, "w", 3, {2}), rows_report(1, "w", 3, {0, 2})}, 2).find(
                 "two chunks at [2, 0]") != std::string::npos);
  // A row nobody holds.
  BOOST_TEST(gathered_error({rows_report(0, "w", 3, {0}), rows_report(1, "w", 3, {2})}, 2).find(
                 "the saved chunks hold 8 of its 12 elements") != std::string::npos);
  BOOST_TEST(gathered_error({rows_report(0, "w", 2, {0}), rows_report(1, "w", 2, {1}, DType::bf16)}, 2)
                 .find("tensor 'w' has a different dtype or global shape on rank 1") != std::string::npos);
  BOOST_TEST(gathered_error({rows_report(0, "w", 2, {0}), rows_report(1, "w", 3, {1, 2})}, 2)
                 .find("different dtype or global shape on rank 1") != std::string::npos);
  auto same_file = rows_report(1, "w", 2, {1});
  same_file.buckets[0].file = CheckpointLayout::bucket_file_name(0, 0);
  BOOST_TEST(gathered_error({rows_report(0, "w", 2, {0}), same_file}, 2).find(
                 "file '__0_0.safetensors' reported twice") != std::string::npos);
  BOOST_TEST(gathered_error({rows_report(0, "\xff", 1, {0})}, 1).find("must be UTF-8") != std::string::npos);
  // A chunk of a tensor its rank did not plan (its index past the plan's descriptors).
  auto unplanned = rows_report(0, "w", 1, {0});
  unplanned.buckets[0].chunks[0].tensor = static_cast<std::uint32_t>(planned_rows()[0].size());
  BOOST_TEST(gathered_error({unplanned}, 1).find("rank 0 reported a chunk of its tensor " +
                                                 std::to_string(planned_rows()[0].size()) +
                                                 ", which its plan does not hold") != std::string::npos,
             gathered_error({unplanned}, 1));
  // Of several bad tensors, the first by name is named, whatever the order of the reports.
  for (const std::string& first : {std::string("a"), std::string("z")}) {
    RankSaveReport both = rows_report(0, "a", 2, {0});
    both.buckets[0].chunks.push_back(rows_report(0, "m", 2, {0}).buckets[0].chunks[0]);
    both.buckets[0].chunks.push_back(rows_report(0, "z", 2, {0}).buckets[0].chunks[0]);
    if (first == "z") std::reverse(both.buckets[0].chunks.begin(), both.buckets[0].chunks.end());
    BOOST_TEST(gathered_error({both}, 1).find("tensor 'a': the saved chunks hold 4 of its 8") != std::string::npos,
               gathered_error({both}, 1));
  }
}

namespace {

/// Passes writes to `inner` until `appends_left` appends have gone through, then fails them.
class FailingFile final : public WritableFile {
 public:
  FailingFile(WritableFile& inner, int appends_left) : inner_(inner), appends_left_(appends_left) {}
  Status append(const void* data, std::size_t bytes) override {
    if (appends_left_-- <= 0) return {ErrorCode::io_error, "injected: disk full"};
    return inner_.append(data, bytes);
  }
  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
    return inner_.write_at(offset, data, bytes);
  }
  Status sync() override { return inner_.sync(); }
  Status close() override { return inner_.close(); }

 private:
  WritableFile& inner_;
  int appends_left_;
};

}  // namespace

BOOST_AUTO_TEST_CASE(metadata_streamed_to_its_file_in_pieces_is_the_text_with_its_checksum_in_place) {
  // 8 ranks x 8,000 one-row chunks: about 7 MiB of text, more than one piece.
  std::vector<RankSaveReport> reports;
  for (int rank = 0; rank < 8; ++rank) {
    std::vector<std::int64_t> rows;
    for (std::int64_t i = 0; i < 8000; ++i) rows.push_back(rank * 8000 + i);
    reports.push_back(rows_report(rank, "w", 64000, rows));
  }
  auto gathered = gather_reports(1, reports, 8, planned_rows_of());
  BOOST_REQUIRE(gathered.is_ok());
  const std::string text = metadata_to_json(*gathered);
  BOOST_REQUIRE(text.size() > (5u << 20));
  TempDir dir;
  const std::string path = dir / "metadata.json";
  BOOST_REQUIRE(write_file_atomic(*local_file_system(), path,
                                [&](WritableFile& file) { return write_metadata_json(*gathered, file); })
                    .is_ok());
  const std::string written = test::read_file(path);
  BOOST_TEST((written == text));
  auto read = metadata_from_json(written, path);
  BOOST_REQUIRE_MESSAGE(read.is_ok(), read.status().message());
  BOOST_TEST(read->tensors.at("w").chunks.size() == 64000u);

  // A write that fails part way is the error, and leaves neither the file nor its temp file.
  const std::string other = dir / "other.json";
  Status st = write_file_atomic(*local_file_system(), other, [&](WritableFile& file) {
    FailingFile failing(file, 1);
    return write_metadata_json(*gathered, failing);
  });
  BOOST_TEST(st.message().find("injected: disk full") != std::string::npos, st.message());
  BOOST_TEST(!fs::exists(other));
  BOOST_TEST(!fs::exists(other + ".tmp"));
}

BOOST_AUTO_TEST_CASE(a_failed_atomic_write_leaves_the_old_file_and_no_temporary_file) {
  for (std::string step : {"append", "sync", "close", "rename"}) {
    BOOST_TEST_CONTEXT(step) {
      TempDir dir;
      const std::string path = dir / "tracker.txt";
      BOOST_REQUIRE(write_file_atomic(*local_file_system(), path, "old\n").is_ok());
      FailingStep failing(step);
      Status st = write_file_atomic(failing, path, "new\n");
      BOOST_TEST(!st.is_ok());
      BOOST_TEST(st.message().find("injected: " + step + " failed") != std::string::npos, st.message());
      BOOST_TEST(test::read_file(path) == "old\n");
      BOOST_TEST(!fs::exists(path + ".tmp"));
      BOOST_TEST((test::files_of(dir.path()) == std::map<std::string, std::string>{{"tracker.txt", "old\n"}}));
    }
  }
  // Past the rename the new content is in place; a failed sync of the folder is still the error.
  TempDir dir;
  const std::string path = dir / "tracker.txt";
  FailingStep failing("sync_dir");
  BOOST_TEST(write_file_atomic(failing, path, "new\n").message().find("injected: sync_dir failed") != std::string::npos);
  BOOST_TEST((test::files_of(dir.path()) == std::map<std::string, std::string>{{"tracker.txt", "new\n"}}));
}

BOOST_AUTO_TEST_CASE(stale_tmp_dirs_are_ignored_and_cleaned) {
  TempDir dir;
  BOOST_REQUIRE(save_synthetic(dir.path(), 1, 1).is_ok());
  fs::create_directories(dir / "global_step_2.tmp/policy");
  BOOST_TEST(*resolve_checkpoint(dir.path()) == dir / "global_step_1");
  BOOST_TEST(!resolve_checkpoint(dir / "global_step_2.tmp").is_ok());
  BOOST_TEST((test::committed_steps(dir.path()) == std::vector<std::int64_t>{1}));
  BOOST_TEST(*test::clean_stale_tmp_dirs(dir.path()) == 1);
  BOOST_TEST(!fs::exists(dir / "global_step_2.tmp"));
  BOOST_TEST(fs::exists(dir / "global_step_1"));
}

BOOST_AUTO_TEST_CASE(bad_trackers_are_named) {
  TempDir dir;
  std::ofstream(dir / "latest_ckpt_global_step.txt") << "banana\n";
  auto step = test::read_tracker(dir.path());
  BOOST_TEST(step.status().message().find("latest_ckpt_global_step.txt") != std::string::npos);
  std::ofstream(dir / "latest_ckpt_global_step.txt") << "7\n";
  auto resolved = resolve_checkpoint(dir.path());
  BOOST_TEST(resolved.status().message().find("names step 7") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_new_root_with_a_trailing_slash_is_accepted) {
  TempDir dir;
  BOOST_TEST(test::local_store(dir / "new/").check_destination().is_ok(),
             test::local_store(dir / "new/").check_destination().message());
  BOOST_REQUIRE(save_synthetic(dir / "new/", 1, 1).is_ok());
  BOOST_TEST(**test::read_tracker(dir / "new") == 1);
  Status missing = test::local_store(dir / "no/such/").check_destination();
  BOOST_TEST(missing.message().find("the parent folder '" + dir / "no' of") != std::string::npos, missing.message());
}

BOOST_AUTO_TEST_CASE(a_failed_tracker_update_says_the_folder_is_in_place_and_leaves_no_temp_file) {
  struct Case {
    const char* what;
    /// Makes the tracker update of the next commit fail.
    std::function<void(const TempDir&, test::FaultStorage&)> spoil;
    const char* error;
    /// What the message says of the tracker as it is.
    const char* tracker_now;
  };
  const std::vector<Case> cases{
      {"the disk is full", [](const TempDir&, test::FaultStorage& storage) {
         storage.fail_file = "latest_ckpt_global_step.txt.tmp";
         storage.fail_errno = ENOSPC;
       }, "No space left on device", "(it still names step 1)"},
      {"a folder stands where the tracker goes", [](const TempDir& dir, test::FaultStorage&) {
         fs::remove(dir / "latest_ckpt_global_step.txt");
         fs::create_directories(dir / "latest_ckpt_global_step.txt");
       }, "Is a directory", "(it cannot be read)"},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      TempDir dir;
      BOOST_REQUIRE(save_synthetic(dir.path(), 1, 1).is_ok());
      auto storage = std::make_shared<test::FaultStorage>();
      c.spoil(dir, *storage);
      auto state = *make_synthetic_state({1, 256u << 10, 6, 2}, 0, Device::host());
      auto engine = *SaveEngine::create(0, {2, 0, false, {}});
      auto tmp = *test::prepare_checkpoint_dir(dir.path(), 2);
      RankSaveReport report = engine->save(state, CheckpointLayout::policy_dir(tmp), 2);
      const std::string message = test::commit_checkpoint(dir.path(), 2, {report}, 1, {&state}, storage).message();
      BOOST_TEST(message.find(c.error) != std::string::npos, message);
      // The coordinator adds "checkpoint step 2 not committed" once; the commit itself says how far it got.
      BOOST_TEST(message.find("not committed") == std::string::npos, message);
      BOOST_TEST(message.find("the folder '" + dir / "global_step_2' is complete and in place") != std::string::npos,
                 message);
      BOOST_TEST(message.find("the tracker '" + dir / "latest_ckpt_global_step.txt' was not updated") !=
                     std::string::npos,
                 message);
      BOOST_TEST(message.find(c.tracker_now) != std::string::npos, message);
      BOOST_TEST(!fs::exists(dir / "latest_ckpt_global_step.txt.tmp"));
      BOOST_TEST(verify_checkpoint(dir / "global_step_2")->ok());
    }
  }
}

BOOST_AUTO_TEST_CASE(the_root_lock_is_exclusive_names_its_holder_and_hides_from_listings) {
  TempDir dir;
  const std::string root = dir / "new";
  {
    auto held = test::local_store(root).lock();
    BOOST_REQUIRE_MESSAGE(held.is_ok(), held.status().message());
    BOOST_TEST(fs::is_directory(root));
    auto second = test::local_store(root + "/").lock();
    BOOST_REQUIRE(!second.is_ok());
    BOOST_TEST((second.status().code() == ErrorCode::already_exists));
    BOOST_TEST(second.status().message().find("pid " + std::to_string(::getpid())) != std::string::npos,
               second.status().message());
    // Every listing of the root passes over the lock file.
    BOOST_REQUIRE(save_synthetic(root, 4, 1).is_ok());
    BOOST_TEST((test::committed_steps(root) == std::vector<std::int64_t>{4}));
    BOOST_TEST(*test::clean_stale_tmp_dirs(root) == 0);
    BOOST_TEST(*resolve_checkpoint(root) == root + "/global_step_4");
    BOOST_TEST(fs::exists(root + "/" + kRootLockFile));
  }
  // Released with its holder.
  BOOST_TEST(test::local_store(root).lock().is_ok());
  BOOST_TEST(!test::local_store(dir / "no/such/root").lock().is_ok());
}
