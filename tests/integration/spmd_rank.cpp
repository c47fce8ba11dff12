// One rank of an SPMD job of the Checkpointer facade, for spmd_test: started once per rank with
// the launch variables (RANK, WORLD_SIZE, MASTER_ADDR, STAGEHAND_PORT), it saves or loads the
// state of tests/integration/spmd_state.hpp and prints one line with the outcome.
//
//   spmd_rank save ROOT STEP sync|async|staged [--slow BYTES_PER_S] [--timeout-s S] [--other-structure]
//                                             [--warm-up] [--late-s S] [--again]
//
// --warm-up: every rank first saves step STEP-1 (sync); --late-s: then this rank waits S seconds
// before saving STEP; --again: a failed save of STEP is printed and made once more.
//   spmd_rank load PATH STEP TP DP
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "spmd_state.hpp"
#include "stagehand/actors/checkpointer.hpp"
#include "stagehand/storage/file_system.hpp"

using namespace stagehand;

namespace {

int fail(const std::string& what) {
  std::printf("%s\n", what.c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 3) return fail("usage: spmd_rank save|load ROOT STEP ...");
  const std::string verb = args[0];
  auto options = CheckpointerOptions::from_environment(args[1]);
  if (!options.is_ok()) return fail(options.status().to_string());
  const std::int64_t step = std::stoll(args[2]);
  options->thread_count = 8;
  options->timeout = std::chrono::seconds(20);
  options->join_timeout = std::chrono::seconds(20);
  bool other_structure = false;
  bool warm_up = false;
  bool again = false;
  double late_s = 0;
  for (std::size_t i = 3; i < args.size(); ++i) {
    if (args[i] == "--slow" && i + 1 < args.size()) {
      options->file_system = rate_limited(local_file_system(), std::stod(args[++i]));
    } else if (args[i] == "--timeout-s" && i + 1 < args.size()) {
      options->timeout = std::chrono::milliseconds(static_cast<std::int64_t>(std::stod(args[++i]) * 1000));
    } else if (args[i] == "--other-structure") {
      other_structure = true;
    } else if (args[i] == "--warm-up") {
      warm_up = true;
    } else if (args[i] == "--again") {
      again = true;
    } else if (args[i] == "--late-s" && i + 1 < args.size()) {
      late_s = std::stod(args[++i]);
    }
  }
  const int rank = options->rank;
  const std::string who = "rank " + std::to_string(rank) + ": ";

  if (verb == "load") {
    if (args.size() < 5) return fail("usage: spmd_rank load PATH STEP TP DP");
    test::SpmdLayout layout{std::stoi(args[3]), std::stoi(args[4])};
    if (layout.world() != options->world_size) return fail(who + "the layout does not match WORLD_SIZE");
    test::SpmdRank mine(rank, layout, step, /*zeros=*/true);
    Checkpointer ckpt(*options);
    Status loaded = ckpt.load(mine.state, args[1]);
    if (!loaded.is_ok()) return fail(who + "load failed: " + loaded.to_string());
    std::string wrong = mine.check(step, mine.state);
    if (!wrong.empty()) return fail(who + "loaded, but " + wrong);
    std::printf("%sloaded step %lld: every value equal\n", who.c_str(), static_cast<long long>(step));
    return 0;
  }

  test::SpmdRank mine(rank, {2, options->world_size / 2 > 0 ? options->world_size / 2 : 1}, step);
  if (options->world_size % 2 != 0) return fail(who + "spmd_rank save runs with an even WORLD_SIZE");
  std::vector<float> extra(16, 1.0f);
  if (other_structure) {
    // The same name with another shape than the other ranks give it (a tensor only some ranks
    // hold, as pipeline stages do, is not a mismatch).
    std::erase_if(mine.state.tensors, [](const ShardedTensor& t) { return t.desc.name == "model.bias"; });
    mine.state.add_full("model.bias", *Tensor::from_blob(extra.data(), DType::f32, Shape{16}, Device::host()), rank);
  }
  const std::string mode = args.size() > 3 ? args[3] : "";
  if (mode == "staged") options->staging_buckets = 2;  // 2 of the 8 buckets at a time
  Checkpointer ckpt(*options);
  if (verb != "save" || mode.empty()) return fail("usage: spmd_rank save ROOT STEP sync|async|staged");
  if (warm_up) {
    Status first = ckpt.save(step - 1, mine.state);
    if (!first.is_ok()) return fail(who + "save of step " + std::to_string(step - 1) + " failed: " + first.to_string());
  }
  if (late_s > 0) std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<std::int64_t>(late_s * 1000)));
  auto save = [&] {
    if (mode == "sync") return ckpt.save(step, mine.state);
    auto pending = ckpt.async_save(step, mine.state);
    if (!pending.is_ok()) return pending.status();
    if (Result<double> staged = pending->wait_staged(); !staged.is_ok()) return staged.status();
    mine.fill(step + 100);  // the trainer's next step: the save holds step's values
    Status st = pending->wait();
    mine.fill(step);
    return st;
  };
  Status st = save();
  if (!st.is_ok() && again) {
    std::printf("%sfirst save of step %lld failed: %s\n", who.c_str(), static_cast<long long>(step),
                st.to_string().c_str());
    st = save();
  }
  if (!st.is_ok()) return fail(who + "save of step " + std::to_string(step) + " failed: " + st.to_string());
  std::printf("%ssaved step %lld (%s)\n", who.c_str(), static_cast<long long>(step), mode.c_str());
  return 0;
}
