// One rank of the Checkpointer facade in one process per rank, on stagehand-bench's synthetic
// state, for bench/compare_peers.py's stagehand_spmd_* systems (started once per rank, as the DCP
// peers are, with RANK, WORLD_SIZE, MASTER_ADDR and STAGEHAND_PORT). Prints JSON lines in the
// peers' format (bench/peers/peer_common.py).
//
//   stagehand-spmd-peer --mode save|async|load --dir D --bytes-per-rank N --tensors T --threads T --saves K
//
// save:  K x Checkpointer::save; save_s per position.
// async: K x async_save: block_s (until the call returns) and save_s (until wait() says committed).
// load:  one untimed save, then K cold loads (files fsync'd and dropped from the page cache with
//        POSIX_FADV_DONTNEED first) and K warm loads, in place into the state's tensors.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "bench/bench_util.hpp"
#include "bench/synthetic_state.hpp"
#include "stagehand/actors/checkpointer.hpp"

using namespace stagehand;
using stagehand::bench::current_rss_bytes;
using stagehand::bench::max_rss_bytes;
namespace fs = std::filesystem;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void drop_cache(const std::string& root) {
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file()) continue;
    int fd = ::open(entry.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fsync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

int fail(const std::string& message) {
  std::printf("{\"kind\": \"error\", \"error\": \"%s\"}\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  for (const char* key : {"--mode", "--dir", "--bytes-per-rank", "--tensors", "--threads", "--saves"}) {
    if (args.count(key) == 0) return fail(std::string("missing ") + key);
  }
  const std::string mode = args["--mode"], dir = args["--dir"];
  const int saves = std::stoi(args["--saves"]);
  auto options = CheckpointerOptions::from_environment(dir);
  if (!options.is_ok()) return fail(options.status().message());
  options->thread_count = std::stoi(args["--threads"]);
  const int rank = options->rank, world = options->world_size;
  SyntheticStateSpec spec;
  spec.ranks = world;
  try {
    spec.bytes_per_rank = bench::parse_size(args["--bytes-per-rank"]);
  } catch (const std::invalid_argument& e) {
    return fail("bad --bytes-per-rank '" + args["--bytes-per-rank"] + "': " + e.what());
  }
  spec.tensors = std::stoi(args["--tensors"]);
  auto state = make_synthetic_state(spec, rank, Device::host());
  if (!state.is_ok()) return fail(state.status().message());
  std::uint64_t local = 0;
  for (const auto& t : state->tensors) local += t.desc.nbytes();
  std::printf("{\"kind\": \"info\", \"rank\": %d, \"world\": %d, \"state_bytes\": %llu, \"pre_rss\": %lld, "
              "\"pre_max_rss\": %llu}\n",
              rank, world, static_cast<unsigned long long>(local),
              static_cast<long long>(current_rss_bytes()), static_cast<unsigned long long>(max_rss_bytes()));
  std::fflush(stdout);
  Checkpointer ckpt(*options);
  if (mode == "save" || mode == "async") {
    for (int k = 1; k <= saves; ++k) {
      const double t0 = now();
      double t1 = 0;
      Status st;
      if (mode == "save") {
        st = ckpt.save(k, *state);
        t1 = now();
      } else {
        auto pending = ckpt.async_save(k, *state);
        t1 = now();
        st = pending.is_ok() ? pending->wait() : pending.status();
      }
      const double t2 = now();
      if (!st.is_ok()) return fail(st.message());
      std::printf("{\"kind\": \"save\", \"rank\": %d, \"pos\": %d, \"save_s\": %.6f, \"block_s\": %.6f, \"rss\": %lld}\n",
                  rank, k, t2 - t0, t1 - t0, static_cast<long long>(current_rss_bytes()));
      std::fflush(stdout);
    }
    return 0;
  }
  if (mode != "load") return fail("--mode must be save, async or load");
  if (Status st = ckpt.save(1, *state); !st.is_ok()) return fail(st.message());
  for (bool cold : {true, false}) {
    for (int k = 1; k <= saves; ++k) {
      if (cold) drop_cache(dir);
      const double t0 = now();
      Status st = ckpt.load(*state, dir);
      const double t1 = now();
      if (!st.is_ok()) return fail(st.message());
      std::printf("{\"kind\": \"load\", \"rank\": %d, \"pos\": %d, \"cold\": %s, \"load_s\": %.6f}\n", rank, k,
                  cold ? "true" : "false", t1 - t0);
      std::fflush(stdout);
    }
  }
  return 0;
}
