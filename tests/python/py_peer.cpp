// The C++ side of the Python package's cross-language tests (tests/python): saves the state that
// test_checkpointer.py builds with numpy, and loads and checks one saved from Python.
//
//   py_peer save ROOT STEP     saves the state at STEP into ROOT
//   py_peer check PATH         loads PATH into a zeroed state; exit 0 when every value is right

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "stagehand/actors/checkpointer.hpp"
#include "stagehand/core/dtype.hpp"

using namespace stagehand;

namespace {

// Mirrors peer_state() in test_checkpointer.py.
struct PeerState {
  std::vector<float> w = std::vector<float>(64 * 48);
  std::vector<std::uint16_t> b = std::vector<std::uint16_t>(48);  // BF16 bits
  std::vector<std::int64_t> step = std::vector<std::int64_t>(1);
  StateDict state;

  explicit PeerState(bool zero) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = zero ? 0.0f : static_cast<float>(i % 97) * 0.25f;
    for (std::size_t i = 0; i < b.size(); ++i) {
      // (i - 24) * 0.5 is exact in BF16: the top half of its float bits.
      const float v = zero ? 0.0f : (static_cast<float>(i) - 24.0f) * 0.5f;
      std::uint32_t bits;
      std::memcpy(&bits, &v, 4);
      b[i] = static_cast<std::uint16_t>(bits >> 16);
    }
    step[0] = zero ? 0 : 7;
    state.add_full("model.w", *Tensor::from_blob(w.data(), DType::f32, {64, 48}, Device::host()));
    state.add_full("model.b", *Tensor::from_blob(b.data(), DType::bf16, {48}, Device::host()));
    state.add_full("opt.step", *Tensor::from_blob(step.data(), DType::i64, {1}, Device::host()));
    // json.dumps({"lr": 0.5, "step": 7}) in Python.
    state.objects["sched"] = zero ? "null" : R"({"lr": 0.5, "step": 7})";
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: py_peer save ROOT STEP | py_peer check PATH\n");
    return 2;
  }
  const std::string verb = argv[1];
  CheckpointerOptions options{.root = argv[2]};
  Checkpointer ckpt(options);
  if (verb == "save" && argc == 4) {
    PeerState peer(false);
    Status st = ckpt.save(std::stoll(argv[3]), peer.state);
    if (!st.is_ok()) std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return st.is_ok() ? 0 : 1;
  }
  if (verb == "check") {
    PeerState loaded(true);
    Status st = ckpt.load(loaded.state, argv[2]);
    if (!st.is_ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      return 1;
    }
    PeerState expected(false);
    bool same = loaded.w == expected.w && loaded.b == expected.b && loaded.step == expected.step &&
                loaded.state.objects == expected.state.objects;
    if (!same) std::fprintf(stderr, "the loaded state differs from the one py_peer saves\n");
    return same ? 0 : 1;
  }
  std::fprintf(stderr, "unknown verb '%s'\n", verb.c_str());
  return 2;
}
