#pragma once

// Copies between host and device memory on streams, with events: one interface, three engines.
// - CUDA (a GPU is visible): non-blocking streams, cudaMemcpyAsync, cudaEvent, cudaHostAlloc.
// - Simulated (STAGEHAND_SIMULATED_GPU=1, for machines without a GPU): "device memory" is host
//   memory allocated through the engine; each stream runs its copies in order on a thread of its
//   own at a set bandwidth and latency; events complete when the copies before them have; misuse
//   a GPU would not report (a host read of memory a copy still writes, freeing memory a copy still
//   uses, a copy on a destroyed stream, an event used after its wait, a pointer the engine did not
//   allocate as device memory) is an error, logged and counted.
// - Host (no GPU, not simulated): copies are memcpy at once, events complete when recorded.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "stagehand/core/status.hpp"

namespace stagehand {

/// Which way a copy goes.
enum class CopyKind { device_to_host, host_to_device };

/// A stream of copies that run in order; a handle of the engine that made it.
struct CopyStream {
  std::uint64_t id = 0;
};

/// A point in a stream: complete once every copy enqueued on it before the event is.
struct CopyEvent {
  std::uint64_t id = 0;
};

/// One finished copy of the simulated engine, with the engine's own timestamps (seconds of
/// std::chrono::steady_clock since its epoch), for tests that check what overlapped what.
struct CopyRecord {
  std::uint64_t stream = 0;
  CopyKind kind = CopyKind::device_to_host;
  std::size_t bytes = 0;
  double start_s = 0;
  double end_s = 0;
};

/// Thread-safety: every member may be called from any thread.
class CopyEngine {
 public:
  virtual ~CopyEngine() = default;

  /// "cuda", "simulated" or "host".
  virtual std::string name() const = 0;

  virtual Result<CopyStream> create_stream() = 0;
  /// Waits for the stream's copies, then destroys it; later use of it is an error.
  virtual Status destroy_stream(CopyStream stream) = 0;

  /// Enqueues a copy of `bytes` from `src` to `dst` on `stream` and returns at once. The memory
  /// must stay allocated, and `dst` unread, until an event recorded after it completes.
  virtual Status copy_async(CopyStream stream, CopyKind kind, void* dst, const void* src, std::size_t bytes) = 0;
  /// An event after every copy enqueued on `stream` so far.
  virtual Result<CopyEvent> record(CopyStream stream) = 0;
  /// Blocks until `event` is complete (the copies before it, and any error they met). The event
  /// is used up: no later wait() or done() may name it (the CUDA engine destroys it).
  virtual Status wait(CopyEvent event) = 0;
  /// Whether `event` is complete, without blocking (the event stays to be waited for).
  virtual Result<bool> done(CopyEvent event) = 0;

  /// Device memory (cudaMalloc; the simulated engine's own host memory). nullptr on failure.
  virtual void* alloc_device(std::size_t bytes) = 0;
  /// Frees device memory; an error when a copy still uses it (simulated).
  virtual Status free_device(void* ptr) = 0;

  /// Checks that host memory [ptr, ptr + bytes) may be read now: no copy in flight writes it
  /// (simulated; the others always say yes). Called before staged bytes are hashed or written.
  virtual Status check_readable(const void* ptr, std::size_t bytes) = 0;

  /// Checks that host memory [ptr, ptr + bytes) may be overwritten now: no copy in flight reads
  /// or writes it (simulated; the others always say yes). Called before a buffer is reused.
  virtual Status check_writable(const void* ptr, std::size_t bytes) {
    (void)ptr;
    (void)bytes;
    return Status::ok();
  }

  /// Misuse errors found so far (simulated; 0 for the others).
  virtual std::uint64_t misuse_count() const { return 0; }
  /// The copies finished so far (simulated; empty for the others).
  virtual std::vector<CopyRecord> copy_log() const { return {}; }

  /// A blocking copy: copy_async on the engine's stream for blocking copies (shared by every
  /// caller, as CUDA's default stream is), then wait.
  Status copy(CopyKind kind, void* dst, const void* src, std::size_t bytes);

 private:
  std::mutex blocking_mutex_;
  std::optional<CopyStream> blocking_stream_;
};

/// How the simulated device behaves.
struct SimulatedDeviceOptions {
  /// Bytes per second of every copy (STAGEHAND_SIMULATED_GPU_GBPS, in GB/s; default 20).
  double bytes_per_s = 20e9;
  /// Fixed cost of every copy (STAGEHAND_SIMULATED_GPU_LATENCY_US; default 10 us).
  double latency_s = 10e-6;
  /// CopyRecords kept (copy_log()); later copies are not recorded.
  std::size_t log_limit = 1u << 16;
};

/// A simulated device of its own (tests make one with their own options).
std::unique_ptr<CopyEngine> make_simulated_engine(SimulatedDeviceOptions options);
/// Copies with memcpy at once.
std::unique_ptr<CopyEngine> make_host_engine();

/// Whether STAGEHAND_SIMULATED_GPU=1: then, unless STAGEHAND_FORCE_HOST=1, device_info() reports
/// one simulated GPU, device memory and copies of the whole process go through the process's
/// simulated engine.
bool simulated_gpu_requested();

/// The process's engine: host with STAGEHAND_FORCE_HOST=1, else simulated when requested, CUDA
/// when a GPU is visible, else host.
CopyEngine& copy_engine();

}  // namespace stagehand
