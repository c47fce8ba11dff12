#define BOOST_TEST_MODULE simulated_device
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "bench/synthetic_state.hpp"
#include "stagehand/checkpoint/save/in_process_save.hpp"
#include "stagehand/checkpoint/load/loader.hpp"
#include "stagehand/checkpoint/save/save_engine.hpp"
#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/device.hpp"
#include "tests/test_util.hpp"

// The save and load paths with the state in (simulated) device memory: this process runs on
// the simulated GPU (STAGEHAND_SIMULATED_GPU=1, copies at 1 GB/s), so device-to-host staging
// takes time. Staging copies run on the save engine's streams and overlap other buckets' writes
// (measured from the engine's own timestamps against the writes'); the files equal those saved
// from host memory; the load copies back into device memory; no misuse is reported.

using namespace stagehand;
using stagehand::test::TempDir;

namespace {

struct OnTheSimulatedGpu {
  OnTheSimulatedGpu() {
    ::setenv("STAGEHAND_SIMULATED_GPU", "1", 1);
    ::setenv("STAGEHAND_SIMULATED_GPU_GBPS", "1", 1);
  }
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Records the time span of every write.
class TimedFileSystem final : public FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  struct Span {
    std::string path;
    double start_s, end_s;
  };

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    SH_ASSIGN_OR_RETURN(auto inner, FileSystemWrapper::create_file(path));
    return std::unique_ptr<WritableFile>(std::make_unique<File>(std::move(inner), this, path));
  }
  std::vector<Span> spans() {
    std::lock_guard lock(mutex_);
    return spans_;
  }

 private:
  class File final : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> inner, TimedFileSystem* fs, std::string path)
        : inner_(std::move(inner)), fs_(fs), path_(std::move(path)) {}
    Status append(const void* data, std::size_t bytes) override {
      return timed([&] { return inner_->append(data, bytes); });
    }
    Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override {
      return timed([&] { return inner_->write_at(offset, data, bytes); });
    }
    Status start_writeback(std::uint64_t offset, std::size_t bytes) override {
      return inner_->start_writeback(offset, bytes);
    }
    Status sync() override { return inner_->sync(); }
    Status close() override { return inner_->close(); }

   private:
    template <class F>
    Status timed(F&& f) {
      const double start = now_s();
      Status st = f();
      std::lock_guard lock(fs_->mutex_);
      fs_->spans_.push_back({path_, start, now_s()});
      return st;
    }
    std::unique_ptr<WritableFile> inner_;
    TimedFileSystem* fs_;
    std::string path_;
  };

  std::mutex mutex_;
  std::vector<Span> spans_;
};

const SyntheticStateSpec kSpec{1, 64u << 20, 8, 5};

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(OnTheSimulatedGpu);

BOOST_AUTO_TEST_CASE(the_process_runs_on_a_simulated_gpu) {
  BOOST_TEST(device_info().simulated);
  BOOST_TEST(device_info().gpu_count == 1);
  BOOST_TEST(copy_engine().name() == "simulated");
  BOOST_TEST(default_device(0).is_cuda());
}

BOOST_AUTO_TEST_CASE(staging_copies_overlap_other_buckets_writes_and_the_files_equal_a_host_save) {
  auto device_state = make_synthetic_state(kSpec, 0, Device::cuda(0));
  BOOST_REQUIRE(device_state.is_ok());
  auto host_state = *make_synthetic_state(kSpec, 0, Device::host());
  for (int staging : {0, 2}) {
    TempDir dir;
    auto timed = std::make_shared<TimedFileSystem>(local_file_system());
    SaveEngineOptions options{4, staging, true, {}};
    auto engine = SaveEngine::create(0, options, timed);
    BOOST_REQUIRE(engine.is_ok());
    const std::size_t logged_before = copy_engine().copy_log().size();
    auto saved = save_checkpoint_in_process(dir / "device", 1, {engine->get()}, {&*device_state});
    BOOST_REQUIRE_MESSAGE(saved.is_ok(), saved.status().to_string());
    auto log = copy_engine().copy_log();
    log.erase(log.begin(), log.begin() + static_cast<std::ptrdiff_t>(logged_before));
    std::uint64_t copied = 0;
    for (const auto& r : log) copied += r.bytes;
    std::uint64_t state_bytes = 0;
    for (const auto& t : device_state->tensors) state_bytes += t.tensor.nbytes();
    BOOST_TEST(copied == state_bytes);  // every byte staged through the engine, once
    // Seconds during which a staging copy ran while another bucket's file was written.
    double overlap = 0, copy_time = 0;
    const auto spans = timed->spans();
    for (const auto& c : log) {
      copy_time += c.end_s - c.start_s;
      for (const auto& w : spans) overlap += std::max(0.0, std::min(c.end_s, w.end_s) - std::max(c.start_s, w.start_s));
    }
    BOOST_TEST_MESSAGE("staging " << staging << " of 4: " << log.size() << " copies, " << copy_time << " s of copies, "
                                  << overlap << " s of them under writes (" << spans.size() << " writes)");
    BOOST_TEST(overlap > 0.0);
    // The same bytes as a save from host memory.
    auto host_engine = *SaveEngine::create(0, options);
    BOOST_REQUIRE(save_checkpoint_in_process(dir / "host", 1, {host_engine.get()}, {&host_state}).is_ok());
    BOOST_TEST((test::files_of(dir / "device") == test::files_of(dir / "host")));
    // Loaded back into device memory, through the engine.
    auto zeros = *make_synthetic_state(kSpec, 0, Device::cuda(0));
    for (auto& t : zeros.tensors) {
      std::vector<std::uint8_t> z(t.tensor.nbytes());
      BOOST_REQUIRE(t.tensor.copy_from_host(z.data()).is_ok());
    }
    Status loaded = load_checkpoint(*local_file_system(), dir / "device/global_step_1", zeros, LoadOptions{});
    BOOST_REQUIRE_MESSAGE(loaded.is_ok(), loaded.to_string());
    for (std::size_t i = 0; i < zeros.tensors.size(); ++i) {
      std::vector<std::uint8_t> a(zeros.tensors[i].tensor.nbytes()), b(a.size());
      BOOST_REQUIRE(zeros.tensors[i].tensor.copy_to_host(a.data()).is_ok());
      BOOST_REQUIRE(host_state.tensors[i].tensor.copy_to_host(b.data()).is_ok());
      BOOST_TEST((a == b), zeros.tensors[i].desc.name);
    }
  }
  BOOST_TEST(copy_engine().misuse_count() == 0u);
}

BOOST_AUTO_TEST_CASE(a_resharded_load_into_device_memory_copies_on_the_readers_streams) {
  // Saved from host memory by two ranks as column halves of a 256 x 512 f32 weight and a bf16
  // vector; loaded into device memory as an inner block (rows 64-191, columns 128-383: row
  // segments of both saved chunks) and the vector converted to f32.
  constexpr std::int64_t kRows = 256, kCols = 512;
  auto value = [](std::int64_t i, std::int64_t j) { return static_cast<float>(i * kCols + j) * 0.25f; };
  std::vector<std::vector<float>> halves(2, std::vector<float>(kRows * kCols / 2));
  std::vector<std::uint16_t> bias(kCols);
  for (std::int64_t j = 0; j < kCols; ++j) bias[static_cast<std::size_t>(j)] = static_cast<std::uint16_t>(0x3f80 + (j % 64));  // bf16 1.0 .. 1.98
  std::vector<StateDict> states(2);
  for (int r = 0; r < 2; ++r) {
    for (std::int64_t i = 0; i < kRows; ++i) {
      for (std::int64_t j = 0; j < kCols / 2; ++j) halves[static_cast<std::size_t>(r)][static_cast<std::size_t>(i * kCols / 2 + j)] = value(i, r * kCols / 2 + j);
    }
    states[static_cast<std::size_t>(r)].add(
        "w", *Tensor::from_blob(halves[static_cast<std::size_t>(r)].data(), DType::f32, Shape{kRows, kCols / 2}, Device::host()),
        Shape{kRows, kCols}, Shape{0, r * kCols / 2});
    states[static_cast<std::size_t>(r)].add_full("b", *Tensor::from_blob(bias.data(), DType::bf16, Shape{kCols}, Device::host()), r);
  }
  TempDir dir;
  auto e0 = *SaveEngine::create(0, {2, 0, false, {}});
  auto e1 = *SaveEngine::create(1, {2, 0, false, {}});
  BOOST_REQUIRE(save_checkpoint_in_process(dir / "ckpt", 1, {e0.get(), e1.get()}, {&states[0], &states[1]}).is_ok());

  auto w = *Tensor::empty(DType::f32, Shape{128, 256}, Device::cuda(0));
  auto b = *Tensor::empty(DType::f32, Shape{kCols}, Device::cuda(0));
  StateDict target;
  target.add("w", w, Shape{kRows, kCols}, Shape{64, 128});
  target.add_full("b", b);
  LoadOptions options;
  options.convert_dtypes = true;
  options.buffer_bytes = 64 << 10;  // many buffer refills, each after the copies from it are done
  const std::uint64_t misuses = copy_engine().misuse_count();
  Status loaded = load_checkpoint(*local_file_system(), dir / "ckpt/global_step_1", target, options);
  BOOST_REQUIRE_MESSAGE(loaded.is_ok(), loaded.to_string());
  std::vector<float> got(128 * 256), got_b(kCols);
  BOOST_REQUIRE(w.copy_to_host(got.data()).is_ok());
  BOOST_REQUIRE(b.copy_to_host(got_b.data()).is_ok());
  for (std::int64_t i = 0; i < 128; ++i) {
    for (std::int64_t j = 0; j < 256; ++j) {
      if (got[static_cast<std::size_t>(i * 256 + j)] != value(64 + i, 128 + j)) {
        BOOST_FAIL("w[" << 64 + i << "," << 128 + j << "] differs");
      }
    }
  }
  for (std::int64_t j = 0; j < kCols; ++j) BOOST_TEST(got_b[static_cast<std::size_t>(j)] == 1.0f + static_cast<float>(j % 64) / 128.0f);
  BOOST_TEST(copy_engine().misuse_count() == misuses);
}
