// The local tier spread over host folders (checkpoint/tiers/host_folders.hpp): where each file goes,
// reads that fall back to a replica when a host's folder is lost, and the check a resume makes
// (repairing damaged copies, refusing a step with a part no copy of which verifies); and the
// retired steps' files that the local tier's saves write over (checkpoint/save/file_reuse.hpp).
#define BOOST_TEST_MODULE host_folders
#include <boost/test/unit_test.hpp>

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/save/file_reuse.hpp"
#include "stagehand/checkpoint/save/global_plan.hpp"
#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/save/save_engine.hpp"
#include "stagehand/checkpoint/tiers/tier_copy.hpp"
#include "stagehand/checkpoint/load/verify.hpp"
#include "tests/checkpoint_test_util.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int kRanks = 4;

/// Four ranks, one per host, each rank's files also on the next host.
HostPlacement placement_in(const std::string& dir, int replicas = 2, int stride = 1) {
  // Each host's disk, mounted: the folder's parent exists, as ckpt_path's must.
  for (int h = 0; h < kRanks; ++h) fs::create_directories(dir + "/host" + std::to_string(h));
  return host_placement(dir + "/host{host}/local", kRanks, 1, replicas, stride);
}

std::shared_ptr<FileSystem> hosts_over(const HostPlacement& placement) {
  auto made = host_folders_file_system(local_file_system(), placement);
  BOOST_REQUIRE_MESSAGE(made.is_ok(), made.status().to_string());
  return *made;
}

std::vector<StateDict> states_for(std::uint64_t seed) {
  std::vector<StateDict> states;
  for (int r = 0; r < kRanks; ++r) {
    states.push_back(*make_synthetic_state({kRanks, 96u << 10, 6, seed, 256}, r, Device::host()));
  }
  return states;
}

/// Saves `states` as `step` of the placement's root through `fs`.
void save(const std::shared_ptr<FileSystem>& fs, const std::string& root, std::int64_t step,
          const std::vector<StateDict>& states) {
  std::vector<std::unique_ptr<SaveEngine>> engines;
  std::vector<SaveEngine*> e;
  std::vector<const StateDict*> s;
  for (int r = 0; r < kRanks; ++r) {
    auto engine = SaveEngine::create(r, SaveEngineOptions{2, 0, false, {}}, fs);
    BOOST_REQUIRE(engine.is_ok());
    engines.push_back(std::move(*engine));
    e.push_back(engines.back().get());
    s.push_back(&states[static_cast<std::size_t>(r)]);
  }
  auto saved = save_checkpoint_in_process(root, step, e, s, fs);
  BOOST_REQUIRE_MESSAGE(saved.is_ok(), saved.status().to_string());
}

/// Loads every rank through `fs` and compares it with `states`.
void expect_loads(FileSystem& fs, const std::string& dir, const std::vector<StateDict>& states) {
  for (int r = 0; r < kRanks; ++r) {
    StateDict loaded = test::zeroed_like(states[static_cast<std::size_t>(r)]);
    Status st = load_checkpoint(fs, dir, loaded, LoadOptions{});
    BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, states[static_cast<std::size_t>(r)].tensors[i].tensor),
                 loaded.tensors[i].desc.name << " on rank " << r);
    }
  }
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void flip_byte(const std::string& path) {
  std::string bytes = test::read_file(path);
  BOOST_REQUIRE(bytes.size() > 200);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::uint64_t inode_of(const std::string& path) {
  struct stat st {};
  BOOST_REQUIRE_MESSAGE(::stat(path.c_str(), &st) == 0, path);
  return static_cast<std::uint64_t>(st.st_ino);
}

/// Files below `root` mapped into this process (/proc/self/maps names each mapped file).
std::size_t mappings_below(const std::string& root) {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find(root + "/") != std::string::npos ? 1 : 0;
  return n;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(placement_puts_each_ranks_copies_on_distinct_hosts_and_refuses_what_cannot) {
  auto p = host_placement("/x/h{host}/l", 8, 2, 2, 1);
  BOOST_TEST(p.hosts == 4);
  BOOST_TEST((p.holders(5) == std::vector<int>{2, 3}));
  BOOST_TEST((p.holders(7) == std::vector<int>{3, 0}));
  BOOST_TEST(p.on_host("/x/h{host}/l/global_step_3/policy/__5_0.safetensors", 2) == "/x/h2/l/global_step_3/policy/__5_0.safetensors");
  BOOST_TEST(p.check().is_ok());
  // All ranks on one host unless told otherwise.
  BOOST_TEST(host_placement("/x/{host}", 8, 0, 1, 1).hosts == 1);
  // Stride 2 over 4 hosts reaches two of them: three copies would share one.
  auto shared = host_placement("/x/h{host}/l", 8, 2, 3, 2).check();
  BOOST_TEST(shared.code() == ErrorCode::invalid_argument);
  BOOST_TEST(shared.message().find("would put two on one host (at most 2)") != std::string::npos, shared.message());
  BOOST_TEST(host_placement("/x/h{host}/l", 8, 2, 5, 1).check().message().find("at most 4") != std::string::npos);
  BOOST_TEST(host_placement("/x/local", 8, 2, 2, 1).check().message().find("hold no {host}") != std::string::npos);
  // Only a policy folder's data files belong to a rank.
  BOOST_TEST(data_file_rank("/r/global_step_3.tmp/policy/__12_1.safetensors") == 12);
  BOOST_TEST(data_file_rank("/r/global_step_3/policy/metadata.json") == -1);
  BOOST_TEST(data_file_rank("/r/global_step_3/__1_1.safetensors") == -1);
  BOOST_TEST(data_file_rank("/r/global_step_3/policy/__1_.safetensors") == -1);
  BOOST_TEST(data_file_rank("/r/global_step_3/policy/__x_1.safetensors") == -1);
}

BOOST_AUTO_TEST_CASE(reads_are_cheap_only_where_every_hosts_folder_says_so) {
  TempDir dir;
  const HostPlacement placement = placement_in(dir.path());
  // Host 2's disk is reached through something whose reads are requests (a file server).
  class HostTwoRemote final : public FileSystemWrapper {
   public:
    HostTwoRemote() : FileSystemWrapper(local_file_system()) {}
    FileSystemCapabilities capabilities(const std::string& path) const override {
      FileSystemCapabilities c = inner().capabilities(path);
      if (path.find("/host2/") != std::string::npos) c.cheap_reads = false;
      return c;
    }
  };
  const std::string step = placement.pattern + "/global_step_1";
  BOOST_TEST(hosts_over(placement)->capabilities(step).cheap_reads);
  auto mixed = host_folders_file_system(std::make_shared<HostTwoRemote>(), placement);
  BOOST_REQUIRE(mixed.is_ok());
  BOOST_TEST(!(*mixed)->capabilities(step).cheap_reads);
  // A path outside the pattern is the inner file system's own.
  BOOST_TEST((*mixed)->capabilities(dir.path()).cheap_reads);
}

BOOST_AUTO_TEST_CASE(a_save_puts_each_ranks_files_on_its_host_and_the_next_and_the_rest_everywhere) {
  TempDir dir;
  const auto placement = placement_in(dir.path());
  auto hosts = hosts_over(placement);
  BOOST_REQUIRE(host_placement_of(*hosts) != nullptr);
  BOOST_TEST(host_placement_of(*local_file_system()) == nullptr);
  const auto states = states_for(7);
  save(hosts, placement.pattern, 5, states);
  for (int h = 0; h < kRanks; ++h) {
    const std::string root = placement.on_host(placement.pattern, h);
    const int before = (h + kRanks - 1) % kRanks;
    std::vector<std::string> expected{"__" + std::to_string(std::min(h, before)) + "_0.safetensors",
                                      "__" + std::to_string(std::min(h, before)) + "_1.safetensors",
                                      "__" + std::to_string(std::max(h, before)) + "_0.safetensors",
                                      "__" + std::to_string(std::max(h, before)) + "_1.safetensors", "metadata.json"};
    BOOST_TEST(names_in(root + "/global_step_5/policy") == expected, "host " << h);
    BOOST_TEST(test::read_file(root + "/latest_ckpt_global_step.txt") == "5\n");
    BOOST_TEST(!fs::exists(root + "/global_step_5.tmp"));
  }
  // The logical folder lists what any host holds; the step loads whole.
  CheckpointStore store(hosts, placement.pattern);
  BOOST_TEST((*store.committed_steps() == std::vector<std::int64_t>{5}));
  expect_loads(*hosts, store.step_dir(5), states);
  auto check = check_host_copies(*hosts, store.step_dir(5));
  BOOST_REQUIRE_MESSAGE(check.is_ok(), check.status().to_string());
  BOOST_TEST(check->from_replicas.empty());
  BOOST_TEST(check->repaired.empty());
  // A second save of the same step replaces it in every host; retention removes it from all.
  save(hosts, placement.pattern, 5, states_for(8));
  expect_loads(*hosts, store.step_dir(5), states_for(8));
  BOOST_REQUIRE(store.remove_step(5).is_ok());
  for (int h = 0; h < kRanks; ++h) BOOST_TEST(!fs::exists(placement.on_host(store.step_dir(5), h)));
}

BOOST_AUTO_TEST_CASE(a_lost_hosts_parts_are_read_from_their_replicas_and_its_folder_comes_back_at_the_next_save) {
  TempDir dir;
  const auto placement = placement_in(dir.path());
  auto hosts = hosts_over(placement);
  const auto states = states_for(3);
  save(hosts, placement.pattern, 10, states);
  fs::remove_all(dir / "host1");
  CheckpointStore store(hosts, placement.pattern);
  BOOST_TEST((*store.committed_steps() == std::vector<std::int64_t>{10}));
  BOOST_TEST(**store.tracker() == 10);
  auto check = check_host_copies(*hosts, store.step_dir(10));
  BOOST_REQUIRE_MESSAGE(check.is_ok(), check.status().to_string());
  BOOST_TEST(check->repaired.empty(), joined(check->repaired));
  BOOST_TEST(joined(check->from_replicas) ==
             "rank 1's part '__1_0.safetensors' from host 2 (host 1's folder lacks the step)\n"
             "rank 1's part '__1_1.safetensors' from host 2 (host 1's folder lacks the step)\n");
  expect_loads(*hosts, store.step_dir(10), states);
  // Nothing is made where host 1's disk should be: a save fails naming it.
  {
    const CheckpointStore writer(hosts, placement.pattern);
    auto refused = writer.prepare(11);
    BOOST_REQUIRE(!refused.is_ok());
    BOOST_TEST(refused.status().message().find("host 1's folder '" + dir / "host1" + "' of '" + placement.pattern +
                                               "' does not exist (is its disk mounted?)") != std::string::npos,
               refused.status().message());
  }
  // A replaced host 1 (its disk empty): the next save makes its folder again, with its files,
  // under the lock of every host.
  fs::create_directories(dir / "host1");
  auto lock = store.lock();
  BOOST_REQUIRE_MESSAGE(lock.is_ok(), lock.status().to_string());
  save(hosts, placement.pattern, 11, states);
  BOOST_TEST(fs::exists(dir / "host1/local/global_step_11/policy/__1_0.safetensors"));
  BOOST_TEST(fs::exists(dir / "host1/local/global_step_11/policy/__0_0.safetensors"));
  BOOST_TEST(test::read_file(dir / "host1/local/latest_ckpt_global_step.txt") == "11\n");
  // Losing two neighbours loses rank 1's only copies: the step is refused, naming them.
  fs::remove_all(dir / "host1");
  fs::remove_all(dir / "host2");
  auto refused = check_host_copies(*hosts, store.step_dir(11));
  BOOST_REQUIRE(!refused.is_ok());
  BOOST_TEST(refused.status().code() == ErrorCode::corruption);
  BOOST_TEST(refused.status().message().find("rank 1's part '__1_0.safetensors': host 1 has none (its folder lacks the "
                                             "step), host 2 has none (its folder lacks the step), host 0 has none, host 3 "
                                             "has none; no replica verifies") != std::string::npos,
             refused.status().message());
}

BOOST_AUTO_TEST_CASE(the_check_restores_a_damaged_copy_from_one_that_verifies_and_refuses_when_none_does) {
  TempDir dir;
  const auto placement = placement_in(dir.path());
  auto hosts = hosts_over(placement);
  const auto states = states_for(4);
  save(hosts, placement.pattern, 2, states);
  const std::string own = dir / "host1/local/global_step_2/policy/__1_0.safetensors";
  const std::string replica = dir / "host2/local/global_step_2/policy/__1_0.safetensors";
  const std::string good = test::read_file(own);
  CheckpointStore store(hosts, placement.pattern);
  // A flipped byte in rank 1's own copy, a torn metadata.json on host 0, a missing replica of
  // rank 2's and a short one of rank 0's: each is rewritten from a copy that verifies.
  flip_byte(own);
  fs::remove(dir / "host3/local/global_step_2/policy/__2_1.safetensors");
  fs::resize_file(dir / "host1/local/global_step_2/policy/__0_0.safetensors", 100);
  std::ofstream(dir / "host0/local/global_step_2/policy/metadata.json", std::ios::trunc) << "{";
  {
    StateDict loaded = test::zeroed_like(states[1]);
    BOOST_TEST(load_checkpoint(*hosts, store.step_dir(2), loaded, LoadOptions{}).code() == ErrorCode::corruption);
  }
  auto check = check_host_copies(*hosts, store.step_dir(2));
  BOOST_REQUIRE_MESSAGE(check.is_ok(), check.status().to_string());
  const std::string repaired = joined(check->repaired);
  BOOST_TEST(repaired.find("host 0's copy of metadata.json (damaged or of another save)") != std::string::npos, repaired);
  BOOST_TEST(repaired.find("host 1's copy of rank 1's part '__1_0.safetensors' from host 2") != std::string::npos, repaired);
  BOOST_TEST(repaired.find("host 3's copy of rank 2's part '__2_1.safetensors' from host 2") != std::string::npos, repaired);
  BOOST_TEST(repaired.find("host 1's copy of rank 0's part '__0_0.safetensors' from host 0") != std::string::npos, repaired);
  BOOST_TEST(check->repaired.size() == 4u, repaired);
  BOOST_TEST(test::read_file(own) == good);
  BOOST_TEST(test::read_file(dir / "host1/local/global_step_2/policy/__0_0.safetensors") ==
             test::read_file(dir / "host0/local/global_step_2/policy/__0_0.safetensors"));
  BOOST_TEST(fs::exists(dir / "host3/local/global_step_2/policy/__2_1.safetensors"));
  expect_loads(*hosts, store.step_dir(2), states);
  // A second check finds nothing to do.
  auto again = check_host_copies(*hosts, store.step_dir(2));
  BOOST_REQUIRE(again.is_ok());
  BOOST_TEST(again->repaired.empty(), joined(again->repaired));
  // Both copies damaged (at different bytes): refused, naming each, and neither rewritten.
  flip_byte(own);
  {
    std::string bytes = test::read_file(replica);
    bytes[10] = static_cast<char>(bytes[10] ^ 0x33);
    std::ofstream(replica, std::ios::binary | std::ios::trunc) << bytes;
  }
  const std::string own_damaged = test::read_file(own);
  const std::string replica_damaged = test::read_file(replica);
  auto refused = check_host_copies(*hosts, store.step_dir(2));
  BOOST_REQUIRE(!refused.is_ok());
  BOOST_TEST(refused.status().code() == ErrorCode::corruption);
  const std::string why = refused.status().message();
  BOOST_TEST(why.find("rank 1's part '__1_0.safetensors': host 1's copy has XXH3 ") != std::string::npos, why);
  BOOST_TEST(why.find("host 2's copy has XXH3 ") != std::string::npos, why);
  BOOST_TEST(why.find("no replica verifies") != std::string::npos, why);
  BOOST_TEST(test::read_file(own) == own_damaged);
  BOOST_TEST(test::read_file(replica) == replica_damaged);
}

BOOST_AUTO_TEST_CASE(an_upload_from_host_folders_rewrites_a_damaged_first_copy_and_copies_again) {
  TempDir dir;
  const auto placement = placement_in(dir.path());
  auto hosts = hosts_over(placement);
  const auto states = states_for(9);
  save(hosts, placement.pattern, 3, states);
  flip_byte(dir / "host2/local/global_step_3/policy/__2_1.safetensors");
  const CheckpointStore from(hosts, placement.pattern);
  const CheckpointStore to(local_file_system(), dir / "durable");
  auto copied = copy_committed_step(from, to, 3);
  BOOST_REQUIRE_MESSAGE(copied.is_ok(), copied.status().to_string());
  BOOST_TEST(joined(copied->repaired) == "host 2's copy of rank 2's part '__2_1.safetensors' from host 3\n");
  BOOST_TEST(test::read_file(dir / "durable/global_step_3/policy/__2_1.safetensors") ==
             test::read_file(dir / "host3/local/global_step_3/policy/__2_1.safetensors"));
  expect_loads(*local_file_system(), to.step_dir(3), states);
  // No good copy left: the upload fails, naming both, and the durable tier keeps its step.
  flip_byte(dir / "host2/local/global_step_3/policy/__2_0.safetensors");
  flip_byte(dir / "host3/local/global_step_3/policy/__2_0.safetensors");
  auto failed = copy_committed_step(from, to, 3);
  BOOST_REQUIRE(!failed.is_ok());
  BOOST_TEST(failed.status().message().find("the check of the host folders: rank 2's part '__2_0.safetensors': host 2's copy has XXH3 ") !=
                 std::string::npos,
             failed.status().message());
  BOOST_TEST(**to.tracker() == 3);
}

BOOST_AUTO_TEST_CASE(hosts_holding_two_saves_of_a_step_resume_the_one_whose_files_verify_and_the_newest_tracker) {
  TempDir dir;
  const auto placement = placement_in(dir.path());
  auto hosts = hosts_over(placement);
  save(hosts, placement.pattern, 2, states_for(5));
  // Host 0 keeps the first save of step 2 (a commit of the second cut after the other hosts):
  // its metadata.json and its files are those of the first.
  const std::string host0 = dir / "host0/local/global_step_2";
  fs::copy(host0, dir / "first", fs::copy_options::recursive);
  const auto second = states_for(6);
  save(hosts, placement.pattern, 2, second);
  fs::remove_all(host0);
  fs::copy(dir / "first", host0, fs::copy_options::recursive);
  CheckpointStore store(hosts, placement.pattern);
  auto check = check_host_copies(*hosts, store.step_dir(2));
  BOOST_REQUIRE_MESSAGE(check.is_ok(), check.status().to_string());
  const std::string repaired = joined(check->repaired);
  BOOST_TEST(repaired.find("host 0's copy of rank 0's part '__0_0.safetensors' from host 1") != std::string::npos, repaired);
  BOOST_TEST(repaired.find("host 0's copy of metadata.json (damaged or of another save)") != std::string::npos, repaired);
  expect_loads(*hosts, store.step_dir(2), second);
  // The tracker read is the first host's (hosts are written in order: a rollback's lower step is
  // as new as a higher one elsewhere), unless it does not parse.
  std::ofstream(dir / "host0/local/latest_ckpt_global_step.txt", std::ios::trunc) << "1\n";
  BOOST_TEST(**store.tracker() == 1);
  std::ofstream(dir / "host0/local/latest_ckpt_global_step.txt", std::ios::trunc) << "x";
  BOOST_TEST(**store.tracker() == 2);
}

BOOST_AUTO_TEST_CASE(the_host_record_refuses_fewer_hosts_and_is_owed_to_new_ones) {
  TempDir dir;
  const std::string pattern = dir.path() + "/host{host}/local";
  for (int h = 0; h < 8; ++h) fs::create_directories(dir / ("host" + std::to_string(h)));
  auto four = hosts_over(host_placement(pattern, 4, 1, 2, 1));
  BOOST_TEST(*check_host_record(*four, pattern) == true);
  BOOST_REQUIRE(write_host_record(*four, pattern).is_ok());
  BOOST_TEST(test::read_file(dir / "host3/local/host_folders.json") ==
             "{\"hosts\":4,\"ranks_per_host\":1,\"replicas\":2,\"stride\":1}\n");
  BOOST_TEST(*check_host_record(*four, pattern) == false);
  // A replaced host lacks it: owed again.
  fs::remove_all(dir / "host2/local");
  BOOST_TEST(*check_host_record(*four, pattern) == true);
  BOOST_REQUIRE(write_host_record(*four, pattern).is_ok());
  auto two = hosts_over(host_placement(pattern, 4, 2, 2, 1));
  auto fewer = check_host_record(*two, pattern);
  BOOST_TEST(fewer.status().code() == ErrorCode::invalid_argument);
  const std::string why = fewer.status().message();
  BOOST_TEST(why.find("was written by 4 host folders (1 ranks per host, 2 copies of each rank's files, stride 1) (" +
                      dir / "host0/local/host_folders.json" +
                      "); this run has 2 host folders (2 ranks per host, 2 copies of each rank's files, stride 1): "
                      "the folders of hosts 2 to 3 would never be read") != std::string::npos,
             why);
  // More hosts: allowed, and the record is owed until written.
  auto eight = hosts_over(host_placement(pattern, 8, 1, 2, 1));
  BOOST_TEST(*check_host_record(*eight, pattern) == true);
  BOOST_REQUIRE(write_host_record(*eight, pattern).is_ok());
  BOOST_TEST(test::read_file(dir / "host7/local/host_folders.json").find("\"hosts\":8") != std::string::npos);
  BOOST_TEST(check_host_record(*four, pattern).status().code() == ErrorCode::invalid_argument);
}

BOOST_AUTO_TEST_CASE(paths_outside_the_pattern_pass_through_and_renames_of_nothing_fail) {
  TempDir dir;
  auto hosts = hosts_over(placement_in(dir.path()));
  BOOST_REQUIRE(write_file_atomic(*hosts, dir / "plain.txt", "x").is_ok());
  BOOST_TEST(test::read_file(dir / "plain.txt") == "x");
  BOOST_TEST(!fs::exists(dir / "host0/local"));
  auto st = hosts->rename(dir / "host{host}/local/a", dir / "host{host}/local/b");
  BOOST_TEST(st.code() == ErrorCode::not_found);
  BOOST_TEST(st.message().find("in no host's folder (hosts 0 to 3 of '") != std::string::npos, st.message());
  auto missing = hosts->open_file(dir / "host{host}/local/none");
  BOOST_TEST(missing.status().code() == ErrorCode::not_found);
  BOOST_TEST(hosts->rename(dir / "host{host}/local/a", dir / "b").code() == ErrorCode::invalid_argument);
  // A placement that would put two copies on one host is refused.
  auto doubled = host_folders_file_system(local_file_system(), host_placement(dir / "h{host}", 4, 2, 3, 1));
  BOOST_TEST(doubled.status().code() == ErrorCode::invalid_argument);
}

BOOST_AUTO_TEST_CASE(a_local_tier_writes_its_saves_over_the_files_of_retired_steps_byte_identical_to_fresh_files) {
  // On disk, and in memory (tmpfs), where the files taken are written through mappings.
  for (const std::string& parent : {fs::temp_directory_path().string(), std::string("/dev/shm")}) {
    BOOST_TEST_CONTEXT("in " << parent) {
      TempDir dir(parent);
      const std::string root = dir.path() + "/local";
      fs::create_directories(root);
      auto reusing = reusing_file_system(local_file_system(), {root + "/"});
      const auto states = states_for(11);
      save(reusing, root, 1, states_for(1));
      save(reusing, root, 2, states_for(2));
      BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(1).is_ok());
      const std::string spares = root + "/" + kSpareFilesDir;
      const std::vector<std::string> data{"__0_0.safetensors", "__0_1.safetensors", "__1_0.safetensors",
                                          "__1_1.safetensors", "__2_0.safetensors", "__2_1.safetensors",
                                          "__3_0.safetensors", "__3_1.safetensors"};
      BOOST_TEST(names_in(spares) == data);
      // The listing of the tier does not show the spares.
      auto listed = reusing->list_dir(root);
      BOOST_REQUIRE(listed.is_ok());
      for (const auto& e : *listed) BOOST_TEST(e.name != kSpareFilesDir);
      // Spares longer than what is written over them, and holding other bytes.
      std::map<std::string, std::uint64_t> inodes;
      for (const auto& name : data) {
        std::ofstream(spares + "/" + name, std::ios::binary | std::ios::app) << std::string(70000, '\xff');
        inodes[name] = inode_of(spares + "/" + name);
      }
      save(reusing, root, 3, states);
      BOOST_TEST(names_in(spares).empty());
      const std::string fresh_root = dir.path() + "/fresh";
      fs::create_directories(fresh_root);
      save(local_file_system(), fresh_root, 3, states);
      auto expect_as_fresh = [&](std::int64_t step) {
        for (const auto& name : data) {
          const std::string path = root + "/global_step_" + std::to_string(step) + "/policy/" + name;
          BOOST_TEST(test::read_file(path) == test::read_file(fresh_root + "/global_step_3/policy/" + name), name);
        }
        expect_loads(*reusing, root + "/global_step_" + std::to_string(step), states);
        auto verified = verify_checkpoint(*local_file_system(), root + "/global_step_" + std::to_string(step));
        BOOST_REQUIRE_MESSAGE(verified.is_ok(), verified.status().to_string());
      };
      for (const auto& name : data) {
        BOOST_TEST(inode_of(root + "/global_step_3/policy/" + name) == inodes[name], name << " was not the spare");
      }
      expect_as_fresh(3);
      // Nothing to take: created as usual.
      save(reusing, root, 4, states);
      BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(2).is_ok());
      BOOST_TEST(names_in(spares) == data);
      // Saving on, keeping two steps: every save takes a retired step's files. In memory each
      // file is mapped once and its mapping taken again, so they stay at most one per file of
      // the three steps that rotate (and are not there on disk).
      for (std::int64_t step = 5; step <= 12; ++step) {
        save(reusing, root, step, states);
        BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(step - 2).is_ok());
        BOOST_TEST(names_in(spares) == data);
        const std::size_t mapped = mappings_below(root);
        if (parent == "/dev/shm") {
          BOOST_TEST(mapped > 0u);
          BOOST_TEST(mapped <= 3 * data.size());
        } else {
          BOOST_TEST(mapped == 0u);
        }
      }
      expect_as_fresh(12);
      // The spares and the mappings go when the file system does.
      reusing.reset();
      BOOST_TEST(!fs::exists(spares));
      BOOST_TEST(mappings_below(root) == 0u);
    }
  }
}

namespace {

/// The local file system, saying that one folder is on a network mount (as a FUSE or NFS
/// mount's statfs does).
class RemoteFolder final : public FileSystemWrapper {
 public:
  explicit RemoteFolder(std::string remote) : FileSystemWrapper(local_file_system()), remote_(std::move(remote)) {}
  FileSystemCapabilities capabilities(const std::string& path) const override {
    FileSystemCapabilities can = inner().capabilities(path);
    if (path.rfind(remote_, 0) == 0) can.rewrites_in_place = false;
    return can;
  }
  Result<std::unique_ptr<WritableFile>> reuse_file(const std::string& from, const std::string& to,
                                                   FileMappings* mappings) override {
    return inner().reuse_file(from, to, mappings);
  }

 private:
  std::string remote_;
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_local_tier_on_a_network_mount_writes_new_files_and_one_on_a_local_disk_beside_it_reuses) {
  TempDir dir;
  const std::string remote = dir.path() + "/remote";
  const std::string local = dir.path() + "/local";
  auto remote_fs = std::make_shared<RemoteFolder>(remote);
  // With no root on a local disk there is nothing to wrap.
  BOOST_TEST(reusing_file_system(remote_fs, {remote}).get() == remote_fs.get());
  auto reusing = reusing_file_system(remote_fs, {remote, local});
  BOOST_TEST(reusing.get() != remote_fs.get());
  const auto states = states_for(11);
  for (const std::string& root : {remote, local}) {
    BOOST_TEST_CONTEXT(root) {
      fs::create_directories(root);
      save(reusing, root, 1, states);
      save(reusing, root, 2, states);
      const std::string file = "/policy/__0_0.safetensors";
      const auto inode = inode_of(root + "/global_step_1" + file);
      BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(1).is_ok());
      // Retention keeps the removed step's files as spares on the local disk only.
      BOOST_TEST(fs::exists(root + "/" + kSpareFilesDir + "/__0_0.safetensors") == (root == local));
      save(reusing, root, 3, states);
      if (root == local) BOOST_TEST(inode_of(root + "/global_step_3" + file) == inode);
      expect_loads(*reusing, root + "/global_step_3", states);
    }
  }
}

BOOST_AUTO_TEST_CASE(an_async_save_into_a_local_tier_in_memory_snapshots_straight_into_the_files_it_writes_over) {
  // /dev/shm is a tmpfs wherever these tests run (the file system tests check it is in memory).
  BOOST_REQUIRE(local_file_system()->capabilities("/dev/shm").in_memory);
  TempDir dir("/dev/shm");
  const std::string root = dir.path() + "/local";
  fs::create_directories(root);
  auto reusing = reusing_file_system(local_file_system(), {root + "/"});
  // Every bucket staged before begin_async() returns (staging_buckets 0), and one of the two
  // (staging_buckets 1: the other is copied into its file by write_async()).
  std::vector<std::unique_ptr<SaveEngine>> engines, one_bucket_now;
  for (int r = 0; r < kRanks; ++r) {
    engines.push_back(*SaveEngine::create(r, SaveEngineOptions{2, 0, false, {}}, reusing));
    one_bucket_now.push_back(*SaveEngine::create(r, SaveEngineOptions{2, 1, false, {}}, reusing));
  }
  // Steps 1 and 2 of a larger state, so that the files written over are longer than the new ones.
  save(reusing, root, 1, states_for(1));
  save(reusing, root, 2, states_for(2));
  std::vector<StateDict> states;
  for (int r = 0; r < kRanks; ++r) {
    states.push_back(*make_synthetic_state({kRanks, 64u << 10, 6, 9, 256}, r, Device::host()));
  }
  std::vector<const StateDict*> pointers;
  for (const auto& s : states) pointers.push_back(&s);
  std::vector<StateDict> reference;
  for (const auto& state : states) {
    reference.push_back(test::zeroed_like(state));
    for (std::size_t t = 0; t < state.tensors.size(); ++t) {
      std::memcpy(reference.back().tensors[t].tensor.data(), state.tensors[t].tensor.data(),
                  static_cast<std::size_t>(state.tensors[t].tensor.nbytes()));
    }
  }
  // An async save as the strategy runs it: begin_async with the folder, the state changed as
  // soon as it may (at once after begin_async returns, or when write_async says all is staged),
  // then write_async; `in_file` says whether every bucket was staged into its file.
  auto async_save = [&](std::int64_t step, bool in_file, std::vector<std::unique_ptr<SaveEngine>>& ranks) {
    auto planned = planned_states(pointers, step);
    BOOST_REQUIRE(planned.is_ok());
    auto write_dir = test::prepare_checkpoint_dir(root, step);
    BOOST_REQUIRE(write_dir.is_ok());
    const std::string policy_dir = CheckpointLayout::policy_dir(*write_dir);
    std::vector<RankSaveReport> reports;
    for (int r = 0; r < kRanks; ++r) {
      SaveEngine& engine = *ranks[static_cast<std::size_t>(r)];
      StateDict& state = (*planned)[static_cast<std::size_t>(r)];
      BOOST_REQUIRE(engine.begin_async(state, policy_dir).is_ok());
      const bool later = engine.stages_in_background();
      BOOST_TEST(later == (in_file && engine.options().staging_buckets > 0));
      // Every bucket in its file: no staging memory held.
      if (in_file) BOOST_TEST(engine.staging_bytes() == 0u);
      auto overwrite = [&] {
        for (auto& t : state.tensors) std::memset(t.tensor.data(), 0x5a, static_cast<std::size_t>(t.tensor.nbytes()));
      };
      if (!later) overwrite();
      bool staged = false;
      reports.push_back(engine.write_async(state, policy_dir, step, [&] {
        staged = true;
        if (later) overwrite();
      }));
      BOOST_TEST(staged);
      BOOST_REQUIRE_MESSAGE(reports.back().status.is_ok(), reports.back().status.to_string());
      BOOST_TEST(reports.back().cpu_s > 0.0);
      for (const auto& b : reports.back().buckets) BOOST_TEST(b.staged_in_file == in_file, "rank " << r << " " << b.file);
      // The planned views share the state's memory: it is whole again for the next rank and step.
      for (std::size_t i = 0; i < states.size(); ++i) {
        for (std::size_t t = 0; t < states[i].tensors.size(); ++t) {
          std::memcpy(states[i].tensors[t].tensor.data(), reference[i].tensors[t].tensor.data(),
                      static_cast<std::size_t>(reference[i].tensors[t].tensor.nbytes()));
        }
      }
    }
    std::vector<const StateDict*> saved;
    for (const StateDict& s : *planned) saved.push_back(&s);
    BOOST_REQUIRE(test::commit_checkpoint(root, step, reports, kRanks, saved, reusing).is_ok());
  };
  // Nothing retired yet: the files are new, and the snapshot goes through staging.
  async_save(3, false, engines);
  // Steps 1 and 2 retired: their (longer) files are written over, through their mappings.
  BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(1).is_ok());
  BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(2).is_ok());
  async_save(4, true, engines);
  // Byte for byte what a sync save of the same state writes into new files, and it loads.
  const std::string fresh_root = dir.path() + "/fresh";
  fs::create_directories(fresh_root);
  save(local_file_system(), fresh_root, 4, states);
  auto expect_fresh_bytes = [&](std::int64_t step) {
    const auto written = test::files_of(root + "/global_step_" + std::to_string(step) + "/policy");
    const auto fresh = test::files_of(fresh_root + "/global_step_4/policy");
    BOOST_REQUIRE(written.size() == fresh.size());
    for (const auto& [name, bytes] : fresh) {
      if (name == kMetadataFile) continue;  // names its step
      BOOST_TEST((written.at(name) == bytes), "step " << step << " " << name);
    }
    expect_loads(*reusing, root + "/global_step_" + std::to_string(step), states);
    auto verified = verify_checkpoint(*local_file_system(), root + "/global_step_" + std::to_string(step));
    BOOST_REQUIRE_MESSAGE(verified.is_ok(), verified.status().to_string());
    BOOST_TEST(verified->ok());
  };
  for (std::int64_t step : {3, 4}) expect_fresh_bytes(step);
  // Step 3 retired too: one bucket copied into its file before begin_async() returns, the
  // other by write_async(), and the state changed as soon as it says all is staged.
  BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(3).is_ok());
  async_save(6, true, one_bucket_now);
  expect_fresh_bytes(6);
  // A sync save after it takes staging again as it needs (host tensors: none), and an async
  // save into a folder on disk goes through staging.
  TempDir disk;
  auto write_dir = test::prepare_checkpoint_dir(disk.path(), 1);
  BOOST_REQUIRE(write_dir.is_ok());
  auto planned = planned_states(pointers, 1);
  BOOST_REQUIRE(planned.is_ok());
  BOOST_REQUIRE(engines[0]->begin_async((*planned)[0], CheckpointLayout::policy_dir(*write_dir)).is_ok());
  BOOST_TEST(engines[0]->staging_bytes() > 0u);
  auto report = engines[0]->write_async((*planned)[0], CheckpointLayout::policy_dir(*write_dir), 1, [] {});
  BOOST_REQUIRE(report.status.is_ok());
  for (const auto& b : report.buckets) BOOST_TEST(!b.staged_in_file);

  // A sync save after a begin_async that no write_async followed: the files it opened are
  // dropped, and the save writes the same bytes a save into new files does.
  BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(4).is_ok());
  auto step5 = test::prepare_checkpoint_dir(root, 5);
  BOOST_REQUIRE(step5.is_ok());
  const std::string policy5 = CheckpointLayout::policy_dir(*step5);
  auto planned5 = planned_states(pointers, 5);
  BOOST_REQUIRE(planned5.is_ok());
  BOOST_REQUIRE(engines[0]->begin_async((*planned5)[0], policy5).is_ok());
  BOOST_TEST(engines[0]->staging_bytes() == 0u);
  auto sync = engines[0]->save((*planned5)[0], policy5, 5);
  BOOST_REQUIRE_MESSAGE(sync.status.is_ok(), sync.status.to_string());
  for (const auto& b : sync.buckets) {
    BOOST_TEST(!b.staged_in_file);
    BOOST_TEST((test::read_file(policy5 + "/" + b.file) == test::read_file(fresh_root + "/global_step_4/policy/" + b.file)),
               b.file);
  }
}

BOOST_AUTO_TEST_CASE(host_folders_in_memory_lend_a_files_memory_only_where_it_has_one_copy) {
  BOOST_REQUIRE(local_file_system()->capabilities("/dev/shm").in_memory);
  TempDir dir("/dev/shm");
  for (int replicas : {1, 2}) {
    BOOST_TEST_CONTEXT(replicas << " copies") {
      const std::string base = dir.path() + "/r" + std::to_string(replicas);
      const auto placement = placement_in(base, replicas);
      std::vector<std::string> roots;
      for (int h = 0; h < kRanks; ++h) roots.push_back(placement.on_host(placement.pattern, h));
      auto hosts = *host_folders_file_system(reusing_file_system(local_file_system(), roots), placement);
      save(hosts, placement.pattern, 1, states_for(1));
      BOOST_REQUIRE(CheckpointStore(hosts, placement.pattern).remove_step(1).is_ok());
      const std::string policy = placement.pattern + "/global_step_2.tmp/policy";
      for (int h = 0; h < kRanks; ++h) fs::create_directories(placement.on_host(policy, h));
      // With copies on other hosts, bytes copied into one file's memory would reach one copy:
      // none is lent, and saves do not open their files early for it.
      BOOST_TEST(hosts->capabilities(policy).in_memory == (replicas == 1));
      auto file = hosts->create_file(policy + "/__0_0.safetensors");
      BOOST_REQUIRE(file.is_ok());
      BOOST_TEST(((*file)->memory_at(0, 16) != nullptr) == (replicas == 1));
      BOOST_REQUIRE((*file)->close().is_ok());
    }
  }
}

BOOST_AUTO_TEST_CASE(host_folders_over_reused_files_take_each_hosts_own_spares) {
  TempDir dir;
  const auto placement = placement_in(dir.path());
  std::vector<std::string> roots;
  for (int h = 0; h < kRanks; ++h) roots.push_back(placement.on_host(placement.pattern, h));
  auto made = host_folders_file_system(reusing_file_system(local_file_system(), roots), placement);
  BOOST_REQUIRE(made.is_ok());
  auto hosts = *made;
  const auto states = states_for(5);
  save(hosts, placement.pattern, 1, states_for(1));
  CheckpointStore store(hosts, placement.pattern);
  BOOST_REQUIRE(store.remove_step(1).is_ok());
  std::map<std::string, std::uint64_t> inodes;
  for (const auto& root : roots) {
    const auto names = names_in(root + "/" + kSpareFilesDir);
    BOOST_TEST(names.size() == 4u, root);
    for (const auto& name : names) inodes[root + "/global_step_2/policy/" + name] = inode_of(root + "/" + kSpareFilesDir + "/" + name);
  }
  save(hosts, placement.pattern, 2, states);
  for (const auto& [path, inode] : inodes) BOOST_TEST(inode_of(path) == inode, path);
  expect_loads(*hosts, placement.pattern + "/global_step_2", states);
  auto checked = check_host_copies(*hosts, placement.pattern + "/global_step_2");
  BOOST_REQUIRE_MESSAGE(checked.is_ok(), checked.status().to_string());
}
