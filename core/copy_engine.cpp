#include "stagehand/core/copy_engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "stagehand/core/device.hpp"
#include "stagehand/core/log.hpp"

#ifdef STAGEHAND_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace stagehand {

Status CopyEngine::copy(CopyKind kind, void* dst, const void* src, std::size_t bytes) {
  CopyStream stream;
  {
    std::lock_guard lock(blocking_mutex_);
    if (!blocking_stream_) {
      SH_ASSIGN_OR_RETURN(blocking_stream_, create_stream());
    }
    stream = *blocking_stream_;
  }
  SH_RETURN_IF_ERROR(copy_async(stream, kind, dst, src, bytes));
  SH_ASSIGN_OR_RETURN(CopyEvent event, record(stream));
  return wait(event);
}

namespace {

using Clock = std::chrono::steady_clock;

bool overlaps(std::uintptr_t a, std::size_t a_bytes, std::uintptr_t b, std::size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

// -- the simulated device --

class SimulatedEngine final : public CopyEngine {
 public:
  explicit SimulatedEngine(SimulatedDeviceOptions options) : options_(options) {}

  ~SimulatedEngine() override {
    std::vector<std::uint64_t> ids;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [id, stream] : streams_) ids.push_back(id);
    }
    for (auto id : ids) (void)destroy_stream(CopyStream{id});
  }

  std::string name() const override { return "simulated"; }

  Result<CopyStream> create_stream() override {
    std::lock_guard lock(mutex_);
    const std::uint64_t id = ++next_stream_;
    auto stream = std::make_unique<Stream>();
    Stream* s = stream.get();
    try {
      s->worker = std::thread([this, s, id] { run(*s, id); });
    } catch (const std::system_error& e) {
      return Status{ErrorCode::no_space, std::string("simulated GPU: cannot start a stream thread: ") + e.what()};
    }
    streams_.emplace(id, std::move(stream));
    return CopyStream{id};
  }

  Status destroy_stream(CopyStream stream) override {
    std::unique_ptr<Stream> s;
    {
      std::unique_lock lock(mutex_);
      auto found = streams_.find(stream.id);
      if (found == streams_.end()) return misuse("destroy of stream " + std::to_string(stream.id) + ", which does not exist");
      Stream& live = *found->second;
      changed_.wait(lock, [&] { return live.completed == live.enqueued; });
      live.stopping = true;
      s = std::move(found->second);
      streams_.erase(found);
    }
    changed_.notify_all();
    s->worker.join();
    return Status::ok();
  }

  Status copy_async(CopyStream stream, CopyKind kind, void* dst, const void* src, std::size_t bytes) override {
    std::lock_guard lock(mutex_);
    auto found = streams_.find(stream.id);
    if (found == streams_.end()) {
      // Ids are handed out in order and never reused: one handed out and gone was destroyed.
      const bool was = stream.id != 0 && stream.id <= next_stream_;
      return misuse("a copy on stream " + std::to_string(stream.id) + (was ? ", which was destroyed" : ", which does not exist"));
    }
    const void* device_side = kind == CopyKind::device_to_host ? src : dst;
    const void* host_side = kind == CopyKind::device_to_host ? dst : src;
    if (bytes > 0 && !in_device_memory(device_side, bytes)) {
      return misuse(std::string(kind == CopyKind::device_to_host ? "a device-to-host copy from " : "a host-to-device copy to ") +
                    "memory that is not device memory of this simulated GPU (" + std::to_string(bytes) + " bytes)");
    }
    if (bytes > 0 && in_device_memory(host_side, 1)) {
      return misuse("a copy whose host side is device memory of the simulated GPU");
    }
    Stream& s = *found->second;
    const std::uint64_t seq = ++s.enqueued;
    s.queue.push_back(Op{kind, dst, src, bytes, seq});
    in_flight_.push_back(InFlight{stream.id, seq, reinterpret_cast<std::uintptr_t>(dst),
                                  reinterpret_cast<std::uintptr_t>(src), bytes});
    changed_.notify_all();
    return Status::ok();
  }

  Result<CopyEvent> record(CopyStream stream) override {
    std::lock_guard lock(mutex_);
    auto found = streams_.find(stream.id);
    if (found == streams_.end()) return misuse("an event on stream " + std::to_string(stream.id) + ", which does not exist");
    const std::uint64_t id = ++next_event_;
    events_.emplace(id, EventAt{stream.id, found->second->enqueued});
    return CopyEvent{id};
  }

  Status wait(CopyEvent event) override {
    std::unique_lock lock(mutex_);
    auto found = events_.find(event.id);
    if (found == events_.end()) {
      return misuse("a wait on event " + std::to_string(event.id) + ", which does not exist or was waited for");
    }
    const EventAt at = found->second;
    events_.erase(found);  // used up, as a CUDA event destroyed after its wait
    changed_.wait(lock, [&] {
      auto s = streams_.find(at.stream);
      // A destroyed stream finished every copy first.
      return s == streams_.end() || s->second->completed >= at.seq;
    });
    return Status::ok();
  }

  Result<bool> done(CopyEvent event) override {
    std::lock_guard lock(mutex_);
    auto found = events_.find(event.id);
    if (found == events_.end()) {
      return misuse("a query of event " + std::to_string(event.id) + ", which does not exist or was waited for");
    }
    auto s = streams_.find(found->second.stream);
    return s == streams_.end() || s->second->completed >= found->second.seq;
  }

  void* alloc_device(std::size_t bytes) override {
    void* ptr = host_alloc(bytes, false);
    if (ptr == nullptr) return nullptr;
    std::lock_guard lock(mutex_);
    device_.emplace(reinterpret_cast<std::uintptr_t>(ptr), std::max<std::size_t>(bytes, 1));
    return ptr;
  }

  Status free_device(void* ptr) override {
    if (ptr == nullptr) return Status::ok();
    std::lock_guard lock(mutex_);
    auto found = device_.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (found == device_.end()) return misuse("a free of memory that is not device memory of this simulated GPU");
    for (const auto& f : in_flight_) {
      if (overlaps(f.dst, f.bytes, found->first, found->second) || overlaps(f.src, f.bytes, found->first, found->second)) {
        return misuse("a free of " + std::to_string(found->second) + " bytes of device memory that a copy on stream " +
                      std::to_string(f.stream) + " still uses");
      }
    }
    device_.erase(found);
    host_free(ptr, false);
    return Status::ok();
  }

  Status check_readable(const void* ptr, std::size_t bytes) override {
    std::lock_guard lock(mutex_);
    for (const auto& f : in_flight_) {
      if (overlaps(f.dst, f.bytes, reinterpret_cast<std::uintptr_t>(ptr), bytes)) {
        return misuse("a read of " + std::to_string(bytes) + " bytes of host memory that a copy on stream " +
                      std::to_string(f.stream) + " is still writing (read before its event)");
      }
    }
    return Status::ok();
  }

  Status check_writable(const void* ptr, std::size_t bytes) override {
    std::lock_guard lock(mutex_);
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    for (const auto& f : in_flight_) {
      if (overlaps(f.dst, f.bytes, p, bytes) || overlaps(f.src, f.bytes, p, bytes)) {
        return misuse("a write of " + std::to_string(bytes) + " bytes of host memory that a copy on stream " +
                      std::to_string(f.stream) + " still uses (reused before its event)");
      }
    }
    return Status::ok();
  }

  std::uint64_t misuse_count() const override { return misuses_.load(); }

  std::vector<CopyRecord> copy_log() const override {
    std::lock_guard lock(mutex_);
    return log_;
  }

 private:
  struct Op {
    CopyKind kind;
    void* dst;
    const void* src;
    std::size_t bytes;
    std::uint64_t seq;
  };
  struct Stream {
    std::deque<Op> queue;
    std::thread worker;
    bool stopping = false;
    std::uint64_t enqueued = 0;
    std::uint64_t completed = 0;
  };
  struct EventAt {
    std::uint64_t stream;
    std::uint64_t seq;
  };
  struct InFlight {
    std::uint64_t stream;
    std::uint64_t seq;
    std::uintptr_t dst;
    std::uintptr_t src;
    std::size_t bytes;
  };

  /// Misuse fails loudly: logged as an error, counted, and returned.
  Status misuse(const std::string& what) {
    ++misuses_;
    logger()->error("simulated GPU: misuse: {}", what);
    return Status{ErrorCode::invalid_argument, "simulated GPU: misuse: " + what};
  }

  /// @pre mutex_ held
  bool in_device_memory(const void* ptr, std::size_t bytes) const {
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    auto it = device_.upper_bound(p);
    if (it == device_.begin()) return false;
    --it;
    return p >= it->first && p + bytes <= it->first + it->second;
  }

  static double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

  void run(Stream& s, std::uint64_t id) {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return s.stopping || !s.queue.empty(); });
      if (s.queue.empty()) return;  // stopping, and every copy done
      const Op op = s.queue.front();
      lock.unlock();
      const double start = now_s();
      const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                            options_.latency_s + static_cast<double>(op.bytes) / options_.bytes_per_s));
      // As long as the bytes and latency make it, or as the memcpy takes if that is longer.
      if (op.bytes > 0) std::memcpy(op.dst, op.src, op.bytes);
      std::this_thread::sleep_until(until);
      const double end = now_s();
      lock.lock();
      s.queue.pop_front();
      s.completed = op.seq;
      std::erase_if(in_flight_, [&](const InFlight& f) { return f.stream == id && f.seq == op.seq; });
      if (log_.size() < options_.log_limit) log_.push_back(CopyRecord{id, op.kind, op.bytes, start, end});
      changed_.notify_all();
    }
  }

  const SimulatedDeviceOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::uint64_t next_stream_ = 0;
  std::uint64_t next_event_ = 0;
  std::map<std::uint64_t, std::unique_ptr<Stream>> streams_;
  std::map<std::uint64_t, EventAt> events_;
  std::map<std::uintptr_t, std::size_t> device_;  // start -> bytes
  std::vector<InFlight> in_flight_;
  std::vector<CopyRecord> log_;
  std::atomic<std::uint64_t> misuses_{0};
};

// -- host memory only --

class HostEngine final : public CopyEngine {
 public:
  std::string name() const override { return "host"; }
  Result<CopyStream> create_stream() override { return CopyStream{++next_}; }
  Status destroy_stream(CopyStream) override { return Status::ok(); }
  Status copy_async(CopyStream, CopyKind, void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return Status::ok();
  }
  Result<CopyEvent> record(CopyStream) override { return CopyEvent{++next_}; }
  Status wait(CopyEvent) override { return Status::ok(); }
  Result<bool> done(CopyEvent) override { return true; }
  void* alloc_device(std::size_t bytes) override { return host_alloc(bytes, false); }
  Status free_device(void* ptr) override {
    host_free(ptr, false);
    return Status::ok();
  }
  Status check_readable(const void*, std::size_t) override { return Status::ok(); }

 private:
  std::atomic<std::uint64_t> next_{0};
};

#ifdef STAGEHAND_HAVE_CUDA
// -- CUDA (not yet run on a GPU) --

class CudaEngine final : public CopyEngine {
 public:
  std::string name() const override { return "cuda"; }

  Result<CopyStream> create_stream() override {
    cudaStream_t s = nullptr;
    if (auto err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); err != cudaSuccess) return failed("cudaStreamCreate", err);
    std::lock_guard lock(mutex_);
    streams_.emplace(++next_, s);
    return CopyStream{next_};
  }

  Status destroy_stream(CopyStream stream) override {
    cudaStream_t s = take(streams_, stream.id);
    if (s == nullptr) return Status{ErrorCode::invalid_argument, "CUDA: no stream " + std::to_string(stream.id)};
    cudaError_t synced = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    return synced == cudaSuccess ? Status::ok() : failed("cudaStreamSynchronize", synced);
  }

  Status copy_async(CopyStream stream, CopyKind kind, void* dst, const void* src, std::size_t bytes) override {
    cudaStream_t s = find(streams_, stream.id);
    if (s == nullptr) return Status{ErrorCode::invalid_argument, "CUDA: a copy on stream " + std::to_string(stream.id) + ", which does not exist"};
    const auto direction = kind == CopyKind::device_to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    if (auto err = cudaMemcpyAsync(dst, src, bytes, direction, s); err != cudaSuccess) return failed("cudaMemcpyAsync", err);
    return Status::ok();
  }

  Result<CopyEvent> record(CopyStream stream) override {
    cudaStream_t s = find(streams_, stream.id);
    if (s == nullptr) return Status{ErrorCode::invalid_argument, "CUDA: an event on stream " + std::to_string(stream.id) + ", which does not exist"};
    cudaEvent_t e = nullptr;
    if (auto err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess) return failed("cudaEventCreate", err);
    if (auto err = cudaEventRecord(e, s); err != cudaSuccess) {
      cudaEventDestroy(e);
      return failed("cudaEventRecord", err);
    }
    std::lock_guard lock(mutex_);
    events_.emplace(++next_, e);
    return CopyEvent{next_};
  }

  /// An event is waited for once: it is destroyed after.
  Status wait(CopyEvent event) override {
    cudaEvent_t e = take(events_, event.id);
    if (e == nullptr) return Status{ErrorCode::invalid_argument, "CUDA: no event " + std::to_string(event.id)};
    cudaError_t synced = cudaEventSynchronize(e);
    cudaEventDestroy(e);
    return synced == cudaSuccess ? Status::ok() : failed("cudaEventSynchronize", synced);
  }

  Result<bool> done(CopyEvent event) override {
    cudaEvent_t e = find(events_, event.id);
    if (e == nullptr) return Status{ErrorCode::invalid_argument, "CUDA: no event " + std::to_string(event.id)};
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) return true;
    if (q == cudaErrorNotReady) return false;
    return failed("cudaEventQuery", q);
  }

  void* alloc_device(std::size_t bytes) override {
    void* ptr = nullptr;
    return cudaMalloc(&ptr, bytes == 0 ? 1 : bytes) == cudaSuccess ? ptr : nullptr;
  }

  Status free_device(void* ptr) override {
    if (auto err = cudaFree(ptr); err != cudaSuccess) return failed("cudaFree", err);
    return Status::ok();
  }

  Status check_readable(const void*, std::size_t) override { return Status::ok(); }

 private:
  static Status failed(const char* call, cudaError_t err) {
    return Status{ErrorCode::io_error, std::string("CUDA: ") + call + " failed: " + cudaGetErrorString(err)};
  }
  template <class Map>
  typename Map::mapped_type find(Map& map, std::uint64_t id) {
    std::lock_guard lock(mutex_);
    auto it = map.find(id);
    return it == map.end() ? nullptr : it->second;
  }
  template <class Map>
  typename Map::mapped_type take(Map& map, std::uint64_t id) {
    std::lock_guard lock(mutex_);
    auto it = map.find(id);
    if (it == map.end()) return nullptr;
    auto value = it->second;
    map.erase(it);
    return value;
  }

  std::mutex mutex_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, cudaStream_t> streams_;
  std::map<std::uint64_t, cudaEvent_t> events_;
};
#endif

double env_double(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  return end != text && *end == '\0' && value > 0 ? value : fallback;
}

}  // namespace

std::unique_ptr<CopyEngine> make_simulated_engine(SimulatedDeviceOptions options) {
  return std::make_unique<SimulatedEngine>(options);
}

std::unique_ptr<CopyEngine> make_host_engine() { return std::make_unique<HostEngine>(); }

bool simulated_gpu_requested() {
  const char* value = std::getenv("STAGEHAND_SIMULATED_GPU");
  return value != nullptr && std::strcmp(value, "1") == 0;
}

CopyEngine& copy_engine() {
  // Never destroyed: threads of static objects may still copy at exit.
  static CopyEngine* engine = [] () -> CopyEngine* {
    // device_info() decides: STAGEHAND_FORCE_HOST=1 wins over the simulated device.
    if (device_info().simulated) {
      SimulatedDeviceOptions options;
      options.bytes_per_s = env_double("STAGEHAND_SIMULATED_GPU_GBPS", 20) * 1e9;
      options.latency_s = env_double("STAGEHAND_SIMULATED_GPU_LATENCY_US", 10) * 1e-6;
      return make_simulated_engine(options).release();
    }
#ifdef STAGEHAND_HAVE_CUDA
    if (device_info().gpu_count > 0) return new CudaEngine();
#endif
    return make_host_engine().release();
  }();
  return *engine;
}

}  // namespace stagehand
