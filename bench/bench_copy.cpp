// stagehand-bench copy: the bare device-to-host and host-to-device copies of the process's copy
// engine, the baseline of the GPU check (scripts/device-check.sh).
#include "bench/bench_copy.hpp"

#include <chrono>
#include <iostream>
#include <memory>
#include <string>

#include "bench/bench_util.hpp"
#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/device.hpp"
#include "stagehand/core/host_buffer.hpp"

namespace stagehand::bench {

namespace {

using Clock = std::chrono::steady_clock;

struct CopyArgs {
  std::string bytes = "1G";
  int repeat = 3;
};

/// Seconds of one copy of `bytes` enqueued on `stream` and waited for.
Result<double> timed_copy(CopyEngine& engine, CopyStream stream, CopyKind kind, void* dst, const void* src,
                          std::size_t bytes) {
  const auto start = Clock::now();
  SH_RETURN_IF_ERROR(engine.copy_async(stream, kind, dst, src, bytes));
  SH_ASSIGN_OR_RETURN(CopyEvent event, engine.record(stream));
  SH_RETURN_IF_ERROR(engine.wait(event));
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int run_copy(const CopyArgs& args) {
  std::size_t bytes = 0;
  try {
    bytes = parse_size(args.bytes);
  } catch (const std::exception& e) {
    std::cerr << "stagehand-bench copy: bad --bytes '" << args.bytes << "': " << e.what() << "\n";
    return 2;
  }
  const Device device = default_device(0);
  CopyEngine& engine = copy_engine();
  void* on_device = device_alloc(device, bytes);
  HostBuffer pinned(bytes, device.is_cuda(), nullptr);
  if (on_device == nullptr || !pinned.valid()) {
    std::cerr << "stagehand-bench copy: cannot allocate " << bytes << " bytes on " << device.to_string()
              << " and in pinned host memory\n";
    return 2;
  }
  for (std::size_t i = 0; i < bytes; i += 4096) pinned.data()[i] = static_cast<std::uint8_t>(i >> 12);
  auto stream = engine.create_stream();
  int code = 0;
  for (int k = 0; k < args.repeat && stream.is_ok(); ++k) {
    auto h2d = timed_copy(engine, *stream, CopyKind::host_to_device, on_device, pinned.data(), bytes);
    auto d2h = h2d.is_ok() ? timed_copy(engine, *stream, CopyKind::device_to_host, pinned.data(), on_device, bytes)
                           : Result<double>(h2d.status());
    if (!d2h.is_ok()) {
      std::cerr << "stagehand-bench copy: " << d2h.status().to_string() << "\n";
      code = 2;
      break;
    }
    auto line = bench_line("copy", k, 1, 1);
    line["engine"] = engine.name();
    line["bytes"] = bytes;
    line["bare_h2d_s"] = *h2d;
    line["bare_d2h_s"] = *d2h;
    line["d2h_gbps"] = static_cast<double>(bytes) / *d2h / 1e9;
    std::cout << line.dump() << std::endl;
  }
  if (stream.is_ok()) {
    (void)engine.destroy_stream(*stream);
  } else {
    std::cerr << "stagehand-bench copy: " << stream.status().to_string() << "\n";
    code = 2;
  }
  device_free(device, on_device);
  return code;
}

}  // namespace

BenchCommand add_copy_command(CLI::App& app) {
  auto args = std::make_shared<CopyArgs>();
  auto* command = app.add_subcommand("copy", "time a bare device-to-host and host-to-device copy of --bytes "
                                             "(the GPU, or the simulated one), the baseline of the GPU check");
  command->add_option("--bytes", args->bytes, "bytes to copy, e.g. 1G");
  command->add_option("--repeat", args->repeat, "copies of each way")->check(CLI::Range(1, 1000));
  return {command, [args] { return run_copy(*args); }};
}

}  // namespace stagehand::bench
