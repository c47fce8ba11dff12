#include "stagehand/checkpoint/tiers/tier_copy.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "stagehand/checkpoint/load/checkpoint_reader.hpp"
#include "stagehand/checkpoint/tiers/host_folders.hpp"
#include "stagehand/checkpoint/format/layout.hpp"
#include "stagehand/core/foreground_gate.hpp"
#include "stagehand/core/host_buffer.hpp"
#include "stagehand/core/priority.hpp"
#include "stagehand/core/xxh3.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// One file of the step: where it is read, where it goes, and what the metadata says it holds.
struct StepFile {
  std::string from;
  std::string to;
  FileMeta expected;
};

using StopCheck = std::function<bool()>;

/// An error once `stop` says so: the copy was asked to stop before it was complete.
Status check_stop(const StopCheck& stop, const StepFile& file) {
  if (!stop || !stop()) return Status::ok();
  return Status{ErrorCode::aborted, "stopped at '" + file.from + "': the run is stopping"};
}

/// Copies `file.from` to `file.to` a piece at a time, hashing what it reads.
Status copy_checked(FileSystem& from_fs, FileSystem& to_fs, const StepFile& file, std::span<char> buffer,
                    const StopCheck& stop, ProgressCounter& progress) {
  SH_ASSIGN_OR_RETURN(auto in, from_fs.open_file(file.from));
  if (in->size() != file.expected.size) {
    return Status{ErrorCode::corruption, "'" + file.from + "' holds " + std::to_string(in->size()) +
                                             " bytes where the metadata records " + describe_file_meta(file.expected) +
                                             ": the source is damaged and is not copied"};
  }
  // Around the page cache where the destination can: the copy is not read again (but by the
  // read-back, which must see the device's bytes), and fills no memory training needs.
  SH_ASSIGN_OR_RETURN(auto out, to_fs.create_file_uncached(file.to));
  SH_ASSIGN_OR_RETURN(std::uint64_t digest,
                      read_hashed(*in, file.expected.size, buffer, [&] { return check_stop(stop, file); },
                                  [&](const char* data, std::size_t bytes) {
                                    SH_RETURN_IF_ERROR(out->append(data, bytes));
                                    progress.add(bytes);
                                    return Status::ok();
                                  }));
  if (digest != file.expected.xxh3) {
    return Status{ErrorCode::corruption, "'" + file.from + "' has XXH3 " + xxh3_hex(digest) +
                                             " where the metadata records " + describe_file_meta(file.expected) +
                                             ": the source is damaged and is not copied"};
  }
  SH_RETURN_IF_ERROR(check_stop(stop, file));
  SH_RETURN_IF_ERROR(out->sync());
  return out->close();
}

/// Reads `file.to` back and checks its size and XXH3 against the metadata's.
Status check_copied(FileSystem& to_fs, const StepFile& file, std::span<char> buffer,
                    const StopCheck& stop, ProgressCounter& progress) {
  SH_ASSIGN_OR_RETURN(auto in, to_fs.open_file_uncached(file.to));
  if (in->size() != file.expected.size) {
    return Status{ErrorCode::corruption, "'" + file.to + "' holds " + std::to_string(in->size()) +
                                             " bytes after the copy, where " + describe_file_meta(file.expected) + " were sent"};
  }
  SH_ASSIGN_OR_RETURN(std::uint64_t digest,
                      read_hashed(*in, file.expected.size, buffer, [&] { return check_stop(stop, file); },
                                  [&](const char*, std::size_t bytes) {
                                    progress.add(bytes);
                                    return Status::ok();
                                  }));
  if (digest != file.expected.xxh3) {
    return Status{ErrorCode::corruption, "'" + file.to + "' reads back with XXH3 " + xxh3_hex(digest) +
                                             " after the copy, where " + describe_file_meta(file.expected) + " were sent"};
  }
  return Status::ok();
}

/// Runs `work` on every file with `threads` threads, each through a buffer of `buffers`, adding
/// their CPU seconds to `cpu_s`; the first error (in file order) wins and stops the files not yet
/// started.
Status for_each_file(const std::vector<StepFile>& files, const TierCopyOptions& options, CopyBuffers& buffers,
                     double& cpu_s, const std::function<Status(const StepFile&, std::span<char>)>& work) {
  std::atomic<std::size_t> next{0};
  std::mutex mutex;
  std::size_t failed_at = files.size();
  Status failure;
  auto run = [&] {
    const double cpu_start = thread_cpu_seconds();
    struct AddCpu {
      std::mutex& mutex;
      double& cpu_s;
      double start;
      ~AddCpu() {
        std::lock_guard<std::mutex> lock(mutex);
        cpu_s += thread_cpu_seconds() - start;
      }
    } add_cpu{mutex, cpu_s, cpu_start};
    if (options.low_priority) (void)lower_current_thread_priority();
    struct Taken {
      CopyBuffers& buffers;
      HostBuffer memory;
      ~Taken() {
        if (memory.valid()) buffers.give_back(std::move(memory));
      }
    } taken{buffers, buffers.take()};
    HostBuffer& memory = taken.memory;
    if (!memory.valid()) {
      std::lock_guard<std::mutex> lock(mutex);
      if (failure.is_ok()) {
        failed_at = 0;
        failure = Status{ErrorCode::no_space, "cannot allocate a copy buffer of " +
                                                  std::to_string(buffers.buffer_bytes()) + " bytes"};
      }
      return;
    }
    const std::span<char> buffer(reinterpret_cast<char*>(memory.data()), memory.size());
    for (std::size_t i; (i = next.fetch_add(1)) < files.size();) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (failed_at < files.size()) return;
      }
      Status st;
      try {
        st = work(files[i], buffer);
      } catch (const std::exception& e) {
        st = Status{ErrorCode::internal, "'" + files[i].from + "': the copy stopped on an exception: " + e.what()};
      }
      if (!st.is_ok()) {
        std::lock_guard<std::mutex> lock(mutex);
        if (i < failed_at) {
          failed_at = i;
          failure = std::move(st);
        }
      }
    }
  };
  const int threads = std::clamp<int>(options.threads, 1, std::max<int>(1, static_cast<int>(files.size())));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
  return failure;
}

}  // namespace

namespace {

/// One copy; `source_damaged` says whether it failed on the source's bytes (its metadata, or a
/// file that is not what the metadata records), not on the destination's.
Result<TierCopyReport> copy_once(const CheckpointStore& from, const CheckpointStore& to, std::int64_t step,
                                 const TierCopyOptions& options, CopyBuffers& buffers, bool& source_damaged) {
  source_damaged = false;
  const auto started = Clock::now();
  TierCopyReport report;
  const std::string what = "copying step " + std::to_string(step) + " from '" + from.root() + "' to '" + to.root() + "'";
  // 1. The source's metadata, checked, and its text for the copy.
  const std::string source_dir = from.step_dir(step);
  std::string text;
  auto metadata = read_checkpoint_metadata(from.fs(), source_dir, &text);
  if (!metadata.is_ok()) {
    source_damaged = metadata.status().code() == ErrorCode::corruption;
    return metadata.status().with_context(what);
  }
  auto there = to.is_committed(step);
  if (!there.is_ok()) return there.status().with_context(what);
  report.replaced = *there;
  if (*there && !to.fs().capabilities(to.root()).atomic_rename) {
    // An object store cannot swap the step in: it goes first (metadata first), then the copy.
    Status removed = to.remove_step(step);
    if (!removed.is_ok()) return removed.with_context(what + ": removing the committed step it replaces");
  }
  // 2. The write folder.
  auto policy_dir = to.prepare(step);
  if (!policy_dir.is_ok()) return policy_dir.status().with_context(what);
  const std::string write_dir = to.write_dir(step);
  std::vector<StepFile> files;
  for (const auto& [name, meta] : metadata->files) {
    files.push_back({CheckpointLayout::policy_dir(source_dir) + "/" + name, *policy_dir + "/" + name, meta});
  }
  if (metadata->trainer_state) {
    files.push_back({source_dir + "/" + kTrainerStateFile, write_dir + "/" + kTrainerStateFile,
                     *metadata->trainer_state});
  }
  auto fail = [&](const Status& st) -> Status {
    (void)to.abort(step);
    return st.with_context(what + " (nothing of step " + std::to_string(step) + " is committed there)");
  };
  // Asked before each piece. A background copy also steps aside there while a caller in this
  // process is blocked on a save's staging (foreground_gate.hpp).
  const StopCheck between_pieces = [&options] {
    if (options.low_priority) foreground_gate().wait();
    return options.should_stop && options.should_stop();
  };
  std::uint64_t file_bytes = 0;
  for (const auto& file : files) file_bytes += file.expected.size;
  // 3. The copy, checked against the metadata as it is read.
  auto phase = Clock::now();
  ProgressCounter copied(options.progress, "copy", file_bytes);
  Status st = for_each_file(files, options, buffers, report.cpu_s, [&](const StepFile& file, std::span<char> buffer) {
    return copy_checked(from.fs(), to.fs(), file, buffer, between_pieces, copied);
  });
  if (!st.is_ok()) {
    // Only the source's bytes are checked while copying (the destination's in the read-back).
    source_damaged = st.code() == ErrorCode::corruption;
    return fail(st);
  }
  report.copy_s = seconds_since(phase);
  // 4. What the destination holds, read back.
  phase = Clock::now();
  ProgressCounter read_back(options.progress, "read back", file_bytes);
  st = for_each_file(files, options, buffers, report.cpu_s, [&](const StepFile& file, std::span<char> buffer) {
    return check_copied(to.fs(), file, buffer, between_pieces, read_back);
  });
  if (!st.is_ok()) return fail(st);
  report.verify_s = seconds_since(phase);
  // 5. The commit: metadata, rename, tracker.
  phase = Clock::now();
  st = to.commit_copy(step, text);
  if (!st.is_ok()) return st.with_context(what);
  report.commit_s = seconds_since(phase);
  for (const auto& file : files) report.bytes += file.expected.size;
  report.files = files.size() + 1;
  report.bytes += text.size();
  report.total_s = seconds_since(started);
  return report;
}

}  // namespace

CopyBuffers::CopyBuffers(std::size_t bytes) : bytes_(std::max<std::size_t>(bytes, 4096)) {}

HostBuffer CopyBuffers::take() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!kept_.empty()) {
      HostBuffer buffer = std::move(kept_.back());
      kept_.pop_back();
      return buffer;
    }
  }
  // Aligned (4096 bytes), so that uncached files take it with no copy.
  HostBuffer buffer(bytes_, false, nullptr);
  if (buffer.valid()) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++allocated_;
  }
  return buffer;
}

void CopyBuffers::give_back(HostBuffer buffer) {
  if (!buffer.valid() || buffer.size() != bytes_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  kept_.push_back(std::move(buffer));
}

std::size_t CopyBuffers::allocated() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocated_;
}

std::string describe_file_meta(const FileMeta& meta) {
  return std::to_string(meta.size) + " bytes, XXH3 " + xxh3_hex(meta.xxh3);
}

Result<std::uint64_t> read_hashed(ReadableFile& in, std::uint64_t size, std::span<char> buffer,
                                  const std::function<Status()>& before,
                                  const std::function<Status(const char*, std::size_t)>& use) {
  Xxh3Stream hash;
  for (std::uint64_t offset = 0; offset < size;) {
    if (before) SH_RETURN_IF_ERROR(before());
    const std::size_t bytes = static_cast<std::size_t>(std::min<std::uint64_t>(buffer.size(), size - offset));
    SH_RETURN_IF_ERROR(in.read(offset, buffer.data(), bytes));
    hash.update(buffer.data(), bytes);
    if (use) SH_RETURN_IF_ERROR(use(buffer.data(), bytes));
    offset += bytes;
  }
  return hash.digest();
}

Result<TierCopyReport> copy_committed_step(const CheckpointStore& from, const CheckpointStore& to,
                                           std::int64_t step, const TierCopyOptions& options) {
  const std::string source = from.step_dir(step);
  const bool hosts = source.find(kHostPlaceholder) != std::string::npos && host_placement_of(from.fs()) != nullptr;
  // Whether a committed step of this number was there before a first try (which, in an object
  // store, removes it first) — for the report of a second one.
  auto there = hosts ? to.is_committed(step) : Result<bool>(false);
  // The copy's buffers: the caller's, or this copy's own, shared by its phases.
  const std::shared_ptr<CopyBuffers> buffers =
      options.buffers ? options.buffers : std::make_shared<CopyBuffers>(options.piece_bytes);
  bool source_damaged = false;
  auto copied = copy_once(from, to, step, options, *buffers, source_damaged);
  if (copied.is_ok() || !source_damaged || !hosts) return copied;
  // A damaged copy in host folders (the first one read): rewritten from a good one, then once more.
  auto checked = check_host_copies(from.fs(), source, options.should_stop);
  if (!checked.is_ok()) {
    return copied.status().with_context("the check of the host folders: " + checked.status().message());
  }
  if (checked->repaired.empty()) return copied;
  std::string repaired;
  for (const auto& r : checked->repaired) repaired += (repaired.empty() ? "" : "; ") + r;
  auto again = copy_once(from, to, step, options, *buffers, source_damaged);
  if (!again.is_ok()) return again.status().with_context("after rewriting " + repaired + " from good copies");
  again->repaired = std::move(checked->repaired);
  again->replaced = again->replaced || (there.is_ok() && *there);
  return again;
}

}  // namespace stagehand
