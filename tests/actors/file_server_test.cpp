// A host's folder served to other processes (actors/file_server.hpp) and the routes of folders
// to their file systems (storage/routed_file_system.hpp): every call of the storage interface
// through a server in another actor system over loopback TCP, what is refused, what a client's
// end releases, a server that is gone; and the local tier's host folders over them, byte-identical
// to the same save into folders reached by path.
#define BOOST_TEST_MODULE file_server
#include <boost/test/unit_test.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bench/synthetic_state.hpp"
#include "stagehand/actors/file_server.hpp"
#include "stagehand/actors/process_world.hpp"
#include "stagehand/checkpoint/store/checkpoint_store.hpp"
#include "stagehand/checkpoint/save/file_reuse.hpp"
#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/save/save_engine.hpp"
#include "stagehand/storage/routed_file_system.hpp"
#include "tests/test_util.hpp"

using namespace stagehand;
using stagehand::test::TempDir;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

/// The server's side: the local file system, counting the files created through it.
class Counting final : public FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    ++created;
    return FileSystemWrapper::create_file(path);
  }
  Result<std::unique_ptr<WritableFile>> reuse_file(const std::string& from, const std::string& to,
                                                   FileMappings* mappings) override {
    return inner().reuse_file(from, to, mappings);
  }
  std::atomic<int> created{0};
};

/// A server of `folder` in an actor system of its own, and a client system connected to it over
/// loopback TCP, as two processes would be.
struct Served {
  caf::actor_system_config server_cfg;
  caf::actor_system server_system;
  caf::actor_system_config client_cfg;
  caf::actor_system client_system;
  std::shared_ptr<Counting> counting = std::make_shared<Counting>(local_file_system());
  FileServer server;
  std::shared_ptr<FileSystem> remote;

  static caf::actor_system_config& io(caf::actor_system_config& cfg) {
    cfg.load<caf::io::middleman>();
    return cfg;
  }

  Served(const std::string& folder, std::chrono::milliseconds limit = 10s)
      : server_system(io(server_cfg)), client_system(io(client_cfg)) {
    auto served = serve_folder(server_system, counting, folder, "127.0.0.1");
    BOOST_REQUIRE_MESSAGE(served.is_ok(), served.status().to_string());
    server = *served;
    auto actor = connect_remote_actor(client_system, "127.0.0.1", server.port, 10s);
    if (!actor.is_ok()) {
      // The destructor does not run for a constructor that fails: the server stops here, or the
      // server system's end would wait for it forever.
      stop_file_server(server_system, server);
      BOOST_FAIL(actor.status().to_string());
    }
    remote = remote_file_system(client_system, *actor, "the test's file server", limit);
  }
  ~Served() {
    remote.reset();
    stop_file_server(server_system, server);
  }
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string pattern_bytes(std::size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 9)) & 0xff);
  return s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_call_goes_through_the_server_and_lands_on_its_disk) {
  TempDir dir;
  const std::string root = dir / "disk";
  fs::create_directories(root);
  Served s(root);
  FileSystem& remote = *s.remote;
  BOOST_REQUIRE(remote.create_dir(root + "/a").is_ok());
  BOOST_TEST(*remote.is_dir(root + "/a"));
  BOOST_TEST(!*remote.is_dir(root + "/none"));
  // More than two messages' worth, appended and then partly overwritten at an offset.
  const std::string big = pattern_bytes(2 * kRemoteChunkBytes + 12345, 1);
  const std::string patch = pattern_bytes(kRemoteChunkBytes + 3, 2);
  {
    auto f = remote.create_file(root + "/a/f.bin");
    BOOST_REQUIRE_MESSAGE(f.is_ok(), f.status().to_string());
    BOOST_REQUIRE((*f)->append(big.data(), big.size()).is_ok());
    BOOST_REQUIRE((*f)->write_at(1000, patch.data(), patch.size()).is_ok());
    BOOST_REQUIRE((*f)->start_writeback(0, 4096).is_ok());
    BOOST_REQUIRE((*f)->sync().is_ok());
    BOOST_REQUIRE((*f)->close().is_ok());
  }
  std::string expected = big;
  expected.replace(1000, patch.size(), patch);
  BOOST_TEST((read_all(root + "/a/f.bin") == expected));
  BOOST_TEST(s.counting->created.load() == 1);
  // Reads, whole and in pieces; the version is the disk's.
  auto version = remote.stat_file(root + "/a/f.bin");
  BOOST_REQUIRE(version.is_ok() && *version);
  BOOST_TEST((**version == **local_file_system()->stat_file(root + "/a/f.bin")));
  BOOST_TEST(!*remote.stat_file(root + "/a/none"));
  {
    auto f = remote.open_file(root + "/a/f.bin");
    BOOST_REQUIRE(f.is_ok());
    BOOST_TEST((*f)->size() == expected.size());
    std::string back(expected.size(), '\0');
    BOOST_REQUIRE((*f)->read(0, back.data(), back.size()).is_ok());
    BOOST_TEST((back == expected));
    std::string a(10, '\0'), b(20, '\0');
    BOOST_REQUIRE((*f)->read_vectored(5, {{a.data(), a.size()}, {b.data(), b.size()}}).is_ok());
    BOOST_TEST((a + b == expected.substr(5, 30)));
    std::string past(10, '\0');
    BOOST_TEST(!(*f)->read(expected.size() - 5, past.data(), past.size()).is_ok());
  }
  BOOST_TEST(remote.open_file(root + "/a/none").status().code() == ErrorCode::not_found);
  // Folders, names, removals.
  auto listed = remote.list_dir(root);
  BOOST_REQUIRE(listed.is_ok());
  BOOST_REQUIRE(listed->size() == 1u);
  BOOST_TEST((*listed)[0].name == "a");
  BOOST_TEST((*listed)[0].is_dir);
  BOOST_REQUIRE(write_file_atomic(remote, root + "/a/g.txt", "gee").is_ok());
  listed = remote.list_dir(root + "/a");
  BOOST_REQUIRE(listed->size() == 2u);
  BOOST_TEST(!(*listed)[0].is_dir);
  BOOST_REQUIRE(remote.exchange(root + "/a/f.bin", root + "/a/g.txt").is_ok());
  BOOST_TEST(read_all(root + "/a/f.bin") == "gee");
  BOOST_REQUIRE(remote.rename(root + "/a/f.bin", root + "/a/h.txt").is_ok());
  BOOST_TEST(!fs::exists(root + "/a/f.bin"));
  BOOST_REQUIRE(remote.sync_dir(root + "/a").is_ok());
  BOOST_REQUIRE(remote.check_access(root + "/a").is_ok());
  BOOST_REQUIRE(remote.remove_file(root + "/a/h.txt").is_ok());
  BOOST_TEST(!fs::exists(root + "/a/h.txt"));
  // Reuse: the old file renamed into place and written over, cut where the writes end.
  {
    auto f = remote.reuse_file(root + "/a/g.txt", root + "/a/r.bin", nullptr);
    BOOST_REQUIRE_MESSAGE(f.is_ok(), f.status().to_string());
    BOOST_REQUIRE((*f)->append("xyz", 3).is_ok());
    BOOST_REQUIRE((*f)->sync().is_ok());
    BOOST_REQUIRE((*f)->close().is_ok());
  }
  BOOST_TEST(read_all(root + "/a/r.bin") == "xyz");
  BOOST_TEST(*remote.abort_unfinished_writes(root) == 0);
  BOOST_REQUIRE(remote.remove_tree(root + "/a").is_ok());
  BOOST_TEST(!fs::exists(root + "/a"));
}

BOOST_AUTO_TEST_CASE(paths_outside_the_folder_are_refused_and_locks_are_held_for_their_client) {
  TempDir dir;
  const std::string root = dir / "disk";
  fs::create_directories(root);
  fs::create_directories(dir / "other");
  Served s(root);
  for (const std::string& bad : {dir / "other/x", root + "/../other/x", root + "x/y", std::string("relative")}) {
    auto f = s.remote->create_file(bad);
    BOOST_REQUIRE(!f.is_ok());
    BOOST_TEST(f.status().code() == ErrorCode::permission_denied, bad);
    BOOST_TEST(f.status().message().find("outside the folder '" + root + "'") != std::string::npos, f.status().message());
  }
  BOOST_TEST(s.remote->rename(root + "/a", dir / "other/a").code() == ErrorCode::permission_denied);
  // A call without a path is refused, not taken for the folder itself; errors name the server.
  auto nameless = s.remote->list_dir("");
  BOOST_REQUIRE(!nameless.is_ok());
  BOOST_TEST(nameless.status().code() == ErrorCode::invalid_argument);
  BOOST_TEST(nameless.status().message().find("the test's file server: list needs a path") != std::string::npos,
             nameless.status().message());
  BOOST_TEST(!fs::exists(dir / "other/x"));
  // A lock held through the server refuses another holder, names the first, and is released
  // when its handle goes.
  auto lock = s.remote->lock_file(root + "/job.lock", "job A");
  BOOST_REQUIRE_MESSAGE(lock.is_ok(), lock.status().to_string());
  auto again = local_file_system()->lock_file(root + "/job.lock", "job B");
  BOOST_REQUIRE(!again.is_ok());
  BOOST_TEST(again.status().code() == ErrorCode::already_exists);
  BOOST_TEST(again.status().message().find("job A") != std::string::npos, again.status().message());
  lock->reset();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  Result<std::unique_ptr<FileLock>> taken = Status{ErrorCode::aborted, "not tried"};
  while (!(taken = local_file_system()->lock_file(root + "/job.lock", "job B")).is_ok() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  BOOST_TEST(taken.is_ok(), "the lock was not released when its handle went");
}

BOOST_AUTO_TEST_CASE(what_a_client_holds_is_released_when_it_goes_and_a_gone_server_fails_calls_in_time) {
  TempDir dir;
  const std::string root = dir / "disk";
  fs::create_directories(root);
  Served s(root, 3s);
  auto lock = s.remote->lock_file(root + "/job.lock", "job A");
  BOOST_REQUIRE(lock.is_ok());
  auto open = s.remote->create_file(root + "/unsynced");
  BOOST_REQUIRE(open.is_ok());
  // The client's file system goes away (as its process would) with the lock and the file still
  // held: the server drops both once it hears of the session's end.
  auto lock_ptr = std::move(*lock);
  auto file_ptr = std::move(*open);
  std::thread([&] { s.remote.reset(); }).join();
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  bool released = false;
  while (!released && std::chrono::steady_clock::now() < deadline) {
    released = local_file_system()->lock_file(root + "/job.lock", "job B").is_ok();
    if (!released) std::this_thread::sleep_for(10ms);
  }
  BOOST_TEST(released, "the server kept the lock of a client that went away");
  lock_ptr.reset();
  file_ptr.reset();
  // A server that is gone: a new client's calls fail within the limit, naming the server.
  auto actor = connect_remote_actor(s.client_system, "127.0.0.1", s.server.port, 10s);
  BOOST_REQUIRE(actor.is_ok());
  auto remote = remote_file_system(s.client_system, *actor, "host 1's file server", 2s);
  BOOST_REQUIRE(remote->is_dir(root).is_ok());
  stop_file_server(s.server_system, s.server);
  s.server = {};
  const auto start = std::chrono::steady_clock::now();
  auto gone = remote->create_file(root + "/x");
  BOOST_REQUIRE(!gone.is_ok());
  BOOST_TEST((std::chrono::steady_clock::now() - start < 5s));
  BOOST_TEST(gone.status().message().find("host 1's file server: create '" + root + "/x'") != std::string::npos,
             gone.status().message());
}

BOOST_AUTO_TEST_CASE(routes_send_folders_to_their_file_systems_and_wait_for_them_within_a_limit) {
  TempDir dir;
  fs::create_directories(dir / "local");
  fs::create_directories(dir / "remote");
  auto router = RoutedFileSystem::create(local_file_system(), 300ms);
  auto counting = std::make_shared<Counting>(local_file_system());
  // Not routed: the local file system.
  BOOST_REQUIRE(write_file_atomic(*router, dir / "local/a", "a").is_ok());
  // Expected but not set: calls wait, then fail naming the folder's owner.
  router->expect_route(dir / "remote", "host 1's folder");
  const auto start = std::chrono::steady_clock::now();
  auto waited = router->create_file(dir / "remote/x");
  BOOST_REQUIRE(!waited.is_ok());
  BOOST_TEST(waited.status().code() == ErrorCode::timeout);
  BOOST_TEST((std::chrono::steady_clock::now() - start >= 250ms));
  BOOST_TEST(waited.status().message().find("host 1's folder was not reachable within 300 ms") != std::string::npos,
             waited.status().message());
  BOOST_TEST(!fs::exists(dir / "remote/x"));
  // Set while a call waits: the call goes there. A sibling folder with a longer name is not
  // below it.
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    router->set_route(dir / "remote/", counting);
  });
  BOOST_REQUIRE(write_file_atomic(*router, dir / "remote/x", "x").is_ok());
  setter.join();
  BOOST_TEST(counting->created.load() == 1);
  BOOST_REQUIRE(write_file_atomic(*router, dir / "remote2", "y").is_ok());
  BOOST_TEST(counting->created.load() == 1);
  BOOST_TEST(router->rename(dir / "remote/x", dir / "local/x").code() == ErrorCode::invalid_argument);
  // A failed route fails its calls at once with its reason.
  router->fail_route(dir / "remote", Status{ErrorCode::io_error, "host 1's file server cannot be reached"});
  auto failed = router->stat_file(dir / "remote/x");
  BOOST_REQUIRE(!failed.is_ok());
  BOOST_TEST(failed.status().message().find("host 1's file server cannot be reached") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(host_folders_over_file_servers_save_what_folders_reached_by_path_save) {
  // Two hosts of two ranks, each rank's files on both; host 1's folder reached only through its
  // server, as a process of host 0 sees it when each disk is its own host's.
  constexpr int kRanks = 4;
  TempDir dir;
  for (const char* d : {"net/host0", "net/host1", "path/host0", "path/host1"}) fs::create_directories(dir / d);
  auto states = std::vector<StateDict>{};
  for (int r = 0; r < kRanks; ++r) states.push_back(*make_synthetic_state({kRanks, 64u << 10, 5, 7, 256}, r, Device::host()));
  auto save_through = [&](const std::shared_ptr<FileSystem>& inner, const std::string& base) {
    auto placement = host_placement(base + "/host{host}/local", kRanks, 2, 2, 1);
    auto hosts = host_folders_file_system(inner, placement);
    BOOST_REQUIRE_MESSAGE(hosts.is_ok(), hosts.status().to_string());
    std::vector<std::unique_ptr<SaveEngine>> engines;
    std::vector<SaveEngine*> e;
    std::vector<const StateDict*> s;
    for (int r = 0; r < kRanks; ++r) {
      auto engine = SaveEngine::create(r, SaveEngineOptions{2, 0, false, {}}, *hosts);
      BOOST_REQUIRE(engine.is_ok());
      engines.push_back(std::move(*engine));
      e.push_back(engines.back().get());
      s.push_back(&states[static_cast<std::size_t>(r)]);
    }
    auto saved = save_checkpoint_in_process(base + "/host{host}/local", 10, e, s, *hosts);
    BOOST_REQUIRE_MESSAGE(saved.is_ok(), saved.status().to_string());
    return *hosts;
  };
  save_through(local_file_system(), dir / "path");
  Served host1(dir / "net/host1");
  auto router = RoutedFileSystem::create(local_file_system(), 10s);
  router->set_route(dir / "net/host1", host1.remote);
  auto hosts = save_through(router, dir / "net");
  BOOST_TEST(host1.counting->created.load() > 0);
  for (const char* h : {"host0", "host1"}) {
    auto a = test::files_of(dir / ("path/" + std::string(h) + "/local"));
    auto b = test::files_of(dir / ("net/" + std::string(h) + "/local"));
    BOOST_TEST(a.size() == b.size(), h);
    BOOST_TEST(a.count("global_step_10/policy/metadata.json") == 1u, h);
    for (const auto& [name, bytes] : a) BOOST_TEST((b[name] == bytes), name << " differs on " << h);
  }
  // A resume's check reads host 1's copies through its server; with host 0's copy of rank 0's
  // part damaged, it is rewritten from host 1's.
  const std::string step = dir / "net/host{host}/local/global_step_10";
  const std::string part = dir / "net/host0/local/global_step_10/policy/__0_0.safetensors";
  {
    std::fstream f(part, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  auto checked = check_host_copies(*hosts, step);
  BOOST_REQUIRE_MESSAGE(checked.is_ok(), checked.status().to_string());
  BOOST_REQUIRE(checked->repaired.size() == 1u);
  BOOST_TEST(checked->repaired[0].find("host 0's copy of rank 0's part") != std::string::npos, checked->repaired[0]);
  BOOST_TEST((read_all(part) == read_all(dir / "path/host0/local/global_step_10/policy/__0_0.safetensors")));
  for (int r = 0; r < kRanks; ++r) {
    StateDict loaded = test::zeroed_like(states[static_cast<std::size_t>(r)]);
    Status st = load_checkpoint(*hosts, step, loaded, LoadOptions{});
    BOOST_REQUIRE_MESSAGE(st.is_ok(), st.to_string());
    for (std::size_t i = 0; i < loaded.tensors.size(); ++i) {
      BOOST_TEST(test::same_bytes(loaded.tensors[i].tensor, states[static_cast<std::size_t>(r)].tensors[i].tensor));
    }
  }
}

BOOST_AUTO_TEST_CASE(a_local_tier_folder_reached_through_its_server_is_written_over_on_that_host_s_disk) {
  // Another host's folder of the local tier, reached through its file server: its retired files
  // are kept and written over by the server on its own disk, as a folder reached by path is (the
  // server's file system says it rewrites in place, though its reads are requests).
  TempDir dir;
  const std::string root = dir / "host1/local";
  fs::create_directories(root);
  Served host1(dir / "host1");
  auto router = RoutedFileSystem::create(local_file_system(), 10s);
  router->set_route(dir / "host1", host1.remote);
  BOOST_TEST(!router->capabilities(root).cheap_reads);
  auto reusing = reusing_file_system(router, {root});
  const StateDict state = *make_synthetic_state({1, 256u << 10, 5, 7, 256}, 0, Device::host());
  auto engine = SaveEngine::create(0, SaveEngineOptions{2, 0, false, {}}, reusing);
  BOOST_REQUIRE(engine.is_ok());
  auto save = [&](std::int64_t step) {
    auto saved = save_checkpoint_in_process(root, step, {engine->get()}, {&state}, reusing);
    BOOST_REQUIRE_MESSAGE(saved.is_ok(), saved.status().to_string());
  };
  auto inode = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<std::uint64_t>(st.st_ino) : 0;
  };
  const std::string file = "/policy/__0_0.safetensors";
  save(1);
  save(2);
  const std::uint64_t first = inode(root + "/global_step_1" + file);
  BOOST_REQUIRE(CheckpointStore(reusing, root).remove_step(1).is_ok());
  BOOST_TEST(fs::exists(root + "/" + kSpareFilesDir + "/__0_0.safetensors"));
  const int created = host1.counting->created.load();
  save(3);
  BOOST_TEST(inode(root + "/global_step_3" + file) == first);
  BOOST_TEST(read_all(root + "/global_step_3" + file) == read_all(root + "/global_step_2" + file));
  // Only the step's other files were made anew (metadata, not data files).
  BOOST_TEST(host1.counting->created.load() - created < 6);
}
