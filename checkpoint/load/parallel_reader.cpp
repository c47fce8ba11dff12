#include "stagehand/checkpoint/load/parallel_reader.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "stagehand/checkpoint/load/reshard.hpp"
#include "stagehand/core/copy_engine.hpp"
#include "stagehand/core/host_buffer.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Per-thread figures, summed into the LoadReport.
struct PhaseTimes {
  double read_s = 0;
  double verify_s = 0;
  double copy_s = 0;
  std::uint64_t bytes = 0;
  std::uint64_t reads = 0;
};

/// A reader thread's copies into device memory: enqueued on its own stream, waited for before the
/// buffer they read from is reused and before the thread ends.
struct DeviceCopies {
  std::optional<CopyStream> stream;
  bool pending = false;
  /// Elements converted to a live dtype on their way (a copy may still read them: it lives as
  /// long as the thread).
  std::vector<std::uint8_t> converted;

  const CopyStream* enqueue() {
    pending = stream.has_value();
    return stream ? &*stream : nullptr;
  }
  Status drain() {
    if (!pending) return Status::ok();
    pending = false;
    SH_ASSIGN_OR_RETURN(CopyEvent event, copy_engine().record(*stream));
    return copy_engine().wait(event);
  }
};

/// Runs the reads of one load on a few threads: the first error stops the rest.
///
/// Thread-safety: run() is called once; the tasks it runs touch disjoint tensor memory (the
/// saved chunks tile each tensor, so no two overlap one block's element).
class ParallelLoad {
 public:
  /// @param verify whether chunks carry checksums to check (a safetensors folder's do not).
  ParallelLoad(const std::vector<ChunkJob>& jobs, std::vector<ReadTask> tasks, const LoadOptions& options,
               std::uint64_t read_bytes, bool pinned, bool verify)
      : jobs_(jobs),
        tasks_(std::move(tasks)),
        options_(options),
        read_bytes_(std::max<std::uint64_t>(read_bytes, 1)),
        pinned_(pinned),
        verify_(verify) {
    for (const auto& task : tasks_) {
      if (!task.direct) largest_buffered_ = std::max(largest_buffered_, task.end() - task.begin());
    }
  }

  Status run(LoadReport& report) {
    const auto threads = static_cast<std::size_t>(std::max(1, options_.thread_count));
    std::vector<PhaseTimes> times(std::min(threads, std::max<std::size_t>(tasks_.size(), 1)));
    std::vector<std::thread> helpers;
    for (std::size_t t = 1; t < times.size(); ++t) {
      try {
        helpers.emplace_back([this, &times, t] { work(times[t]); });
      } catch (const std::system_error&) {
        break;  // fewer threads: the ones started (and this one) take every task
      }
    }
    work(times[0]);
    for (auto& h : helpers)
      h.join();
    for (const auto& t : times) {
      report.read_s += t.read_s;
      report.verify_s += t.verify_s;
      report.copy_s += t.copy_s;
      report.bytes += t.bytes;
      report.reads += t.reads;
    }
    report.thread_count = static_cast<int>(helpers.size() + 1);
    report.buffer_peak_bytes = buffer_peak_.load();
    return first_error_;
  }

 private:
  void work(PhaseTimes& times) {
    HostBuffer buffer;
    DeviceCopies device;
    if (pinned_) {
      // Device targets: their copies run on this thread's stream.
      auto stream = copy_engine().create_stream();
      if (!stream.is_ok()) {
        fail(stream.status().with_context("a load's copy stream"));
        return;
      }
      device.stream = *stream;
    }
    for (std::size_t i = next_.fetch_add(1); i < tasks_.size() && !failed_.load();
         i = next_.fetch_add(1)) {
      const ReadTask& task = tasks_[i];
      Status st = task.direct ? read_direct(task, times, device) : read_buffered(task, buffer, times, device);
      if (st.is_ok()) st = device.drain();
      if (!st.is_ok()) fail(st);
    }
    if (device.stream) {
      Status drained = device.drain();
      if (!drained.is_ok()) fail(drained);
      (void)copy_engine().destroy_stream(*device.stream);
    }
    if (buffer.valid()) buffer_current_.fetch_sub(buffer.size());
  }

  void fail(Status st) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (first_error_.is_ok()) first_error_ = std::move(st);
    failed_.store(true);
  }

  const std::string& tensor_name(std::size_t job) const { return jobs_[job].live->desc.name; }

  Status checksum_mismatch(std::size_t job, std::uint64_t hash) const {
    const ChunkJob& j = jobs_[job];
    return Status{ErrorCode::corruption, "'" + j.file->path + "': tensor '" + tensor_name(job) +
                                             "' chunk " + j.chunk->offsets.to_string() +
                                             ": checksum mismatch (XXH3 " + xxh3_hex(hash) +
                                             ", expected " + xxh3_hex(j.chunk->xxh3) + ")"};
  }

  /// Announces a task read in more than one read of `piece` bytes, so that the device still gets
  /// the whole range in large requests (ReadableFile::will_need).
  static void announce(const ReadTask& task, std::uint64_t piece) {
    if (task.end() - task.begin() > piece) task.file->file->will_need(task.begin(), task.end() - task.begin());
  }

  /// Reads the task's range straight into the tensors in reads of at most read_bytes_ (one
  /// vectored read each), hashing what each read brought, and copying it into the chunk's other
  /// blocks, while it is still in the CPU's cache.
  Status read_direct(const ReadTask& task, PhaseTimes& times, DeviceCopies& device) {
    std::size_t k = 0;
    auto hash = std::make_unique<Xxh3Stream>();
    std::int64_t copied = 0;  // elements of piece k already copied into its other blocks
    std::vector<ReadSegment> segments;
    announce(task, read_bytes_);
    for (std::uint64_t pos = task.begin(); pos < task.end();) {
      const std::uint64_t end = std::min(task.end(), pos + read_bytes_);
      segments.clear();
      for (std::size_t i = k; i < task.pieces.size() && task.pieces[i].begin < end; ++i) {
        const Piece& p = task.pieces[i];
        const std::uint64_t lo = std::max(pos, p.begin);
        segments.push_back({jobs_[p.job].direct + (lo - p.begin),
                            static_cast<std::size_t>(std::min(end, p.end) - lo)});
      }
      auto start = Clock::now();
      Status st = task.file->file->read_vectored(pos, segments);
      times.read_s += seconds_since(start);
      ++times.reads;
      if (!st.is_ok())
        return st.with_context("loading tensor '" + tensor_name(task.pieces[k].job) + "'");
      times.bytes += end - pos;
      start = Clock::now();
      for (; k < task.pieces.size() && task.pieces[k].begin < end;) {
        const Piece& p = task.pieces[k];
        const std::uint64_t lo = std::max(pos, p.begin);
        const std::uint64_t hi = std::min(end, p.end);
        const ChunkJob& j = jobs_[p.job];
        hash->update(j.direct + (lo - p.begin), static_cast<std::size_t>(hi - lo));
        if (!j.copies.empty()) {
          // The whole elements read so far go from the first block into the others now, while
          // this read's bytes are in the cache (a failed check leaves every block unspecified,
          // the first one too).
          const std::size_t elem = dtype_size(j.saved);
          const auto upto = static_cast<std::int64_t>((hi - p.begin) / elem);
          if (upto > copied) {
            times.verify_s += seconds_since(start);
            start = Clock::now();
            for (ShardedTensor* target : j.copies) {
              SH_RETURN_IF_ERROR(fill(j, *target, copied, upto,
                                      j.direct + static_cast<std::uint64_t>(copied) * elem, device, true));
            }
            times.copy_s += seconds_since(start);
            start = Clock::now();
            copied = upto;
          }
        }
        if (hi < p.end) break;
        if (verify_ && hash->digest() != j.chunk->xxh3) {
          times.verify_s += seconds_since(start);
          return checksum_mismatch(p.job, hash->digest());
        }
        hash = std::make_unique<Xxh3Stream>();
        copied = 0;
        ++k;
      }
      times.verify_s += seconds_since(start);
      pos = end;
    }
    return Status::ok();
  }

  /// Reads the task's range in buffer-sized pieces; each piece feeds its chunks' hashes and is
  /// copied into their blocks.
  Status read_buffered(const ReadTask& task, HostBuffer& buffer, PhaseTimes& times, DeviceCopies& device) {
    if (!buffer.valid()) {
      const auto bytes = static_cast<std::size_t>(std::min<std::uint64_t>(
          std::max<std::size_t>(options_.buffer_bytes, kMinBufferBytes), largest_buffered_));
      buffer = HostBuffer(bytes, pinned_, &staging_memory());
      if (!buffer.valid()) {
        return Status{ErrorCode::no_space,
                      "cannot allocate a " + std::to_string(bytes) + "-byte load buffer"};
      }
      const std::uint64_t now = buffer_current_.fetch_add(bytes) + bytes;
      for (std::uint64_t peak = buffer_peak_.load();
           now > peak && !buffer_peak_.compare_exchange_weak(peak, now);) {
      }
    }
    std::size_t k = 0;
    auto hash = std::make_unique<Xxh3Stream>();
    // Host targets take the buffer's bytes in reads that stay in the core's cache; device ones
    // in reads as large as the buffer, each one copy to the device.
    const std::uint64_t most =
        pinned_ ? buffer.size() : std::min<std::uint64_t>(buffer.size(), std::max<std::uint64_t>(read_bytes_, kMinBufferBytes));
    announce(task, most);
    for (std::uint64_t pos = task.begin(); pos < task.end();) {
      std::uint64_t n = std::min<std::uint64_t>(most, task.end() - pos);
      // End the piece on an element boundary of the chunk it cuts.
      for (std::size_t i = k; i < task.pieces.size() && pos + n < task.end(); ++i) {
        const Piece& p = task.pieces[i];
        if (p.begin < pos + n && pos + n < p.end) {
          n -= (pos + n - p.begin) % dtype_size(jobs_[p.job].saved);
          break;
        }
      }
      // The copies from the buffer's last contents are done before it is overwritten.
      SH_RETURN_IF_ERROR(device.drain());
      SH_RETURN_IF_ERROR(copy_engine().check_writable(buffer.data(), static_cast<std::size_t>(n)));
      auto start = Clock::now();
      Status st = task.file->file->read(pos, buffer.data(), static_cast<std::size_t>(n));
      times.read_s += seconds_since(start);
      ++times.reads;
      if (!st.is_ok())
        return st.with_context("loading tensor '" + tensor_name(task.pieces[k].job) + "'");
      times.bytes += n;
      for (; k < task.pieces.size() && task.pieces[k].begin < pos + n;) {
        const Piece& p = task.pieces[k];
        const ChunkJob& j = jobs_[p.job];
        const std::size_t elem = dtype_size(j.saved);
        const std::uint64_t lo = std::max(pos, p.begin);
        const std::uint64_t hi = std::min(pos + n, p.end);
        const std::uint8_t* src = buffer.data() + (lo - pos);
        start = Clock::now();
        if (verify_) hash->update(src, static_cast<std::size_t>(hi - lo));
        times.verify_s += seconds_since(start);
        start = Clock::now();
        const auto first = static_cast<std::int64_t>((lo - p.begin) / elem);
        const auto last = static_cast<std::int64_t>((hi - p.begin) / elem);
        SH_RETURN_IF_ERROR(fill(j, *j.live, first, last, src, device));
        for (ShardedTensor* target : j.copies) {
          SH_RETURN_IF_ERROR(fill(j, *target, first, last, src, device, true));
        }
        times.copy_s += seconds_since(start);
        if (hi < p.end) break;
        if (verify_ && hash->digest() != j.chunk->xxh3)
          return checksum_mismatch(p.job, hash->digest());
        hash = std::make_unique<Xxh3Stream>();
        ++k;
      }
      pos += n;
    }
    return Status::ok();
  }

  /// Copies the chunk's elements [first, last), held at `src` in the saved dtype, into the
  /// part of `target`'s block that they overlap, converted to its dtype where it differs.
  /// `cold`: the block is one of the chunk's copies, not read again soon (copy_overlap_part).
  static Status fill(const ChunkJob& job, ShardedTensor& target, std::int64_t first, std::int64_t last,
                     const std::uint8_t* src, DeviceCopies& device, bool cold = false) {
    std::vector<std::uint8_t>& converted = device.converted;
    const DType live = target.desc.dtype;
    const bool on_device = target.tensor.device().is_cuda();
    // `converted` is reused by the next fill: copies from it are waited for here.
    if (on_device && job.saved != live) SH_RETURN_IF_ERROR(device.drain());
    if (job.saved != live) {
      // Converted into the live dtype first; the copy below then moves live-sized elements.
      const auto count = static_cast<std::size_t>(last - first);
      converted.resize(count * dtype_size(live));
      Status conversion = convert_elements(src, job.saved, converted.data(), live, count);
      if (!conversion.is_ok()) return conversion.with_context("loading tensor '" + target.desc.name + "'");
      src = converted.data();
    }
    const CopyStream* stream = on_device ? device.enqueue() : nullptr;
    if (!copy_overlap_part(*job.chunk, target.desc, dtype_size(live), first, last, src,
                           static_cast<std::uint8_t*>(target.tensor.data()), target.tensor.device(), stream, cold)) {
      return Status{ErrorCode::io_error, "host-to-device copy into tensor '" + target.desc.name + "' on " +
                                             target.tensor.device().to_string() + " failed"};
    }
    return Status::ok();
  }

  /// Buffers are at least this large, so that a piece always holds whole elements.
  static constexpr std::size_t kMinBufferBytes = 4096;

  const std::vector<ChunkJob>& jobs_;
  const std::vector<ReadTask> tasks_;
  const LoadOptions options_;
  const std::uint64_t read_bytes_;
  const bool pinned_;
  const bool verify_;
  std::uint64_t largest_buffered_ = 0;
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> failed_{false};
  std::atomic<std::uint64_t> buffer_current_{0};
  std::atomic<std::uint64_t> buffer_peak_{0};
  std::mutex mutex_;
  Status first_error_;
};

}  // namespace

Status read_chunks(const std::vector<ChunkJob>& jobs, std::vector<ReadTask> tasks, const LoadOptions& options,
                   std::uint64_t read_bytes, bool pinned, bool verify, LoadReport& report) {
  ParallelLoad load(jobs, std::move(tasks), options, read_bytes, pinned, verify);
  return load.run(report);
}

}  // namespace stagehand
