#include "stagehand/checkpoint/save/save_engine.hpp"

#include <algorithm>
#include <chrono>
#include <future>
#include <optional>
#include <utility>

#include "stagehand/config/rules.hpp"
#include "stagehand/core/foreground_gate.hpp"
#include "stagehand/core/priority.hpp"
#include "stagehand/core/stream_copy.hpp"

namespace stagehand {

namespace {

using Clock = std::chrono::steady_clock;

/// Bytes an async save copies at a time into a bucket's file (begin_async with the file in
/// memory) when the bucket is copied in pieces: pieces enough for every writer thread to take some.
constexpr std::size_t kInFilePieceBytes = 8u << 20;

/// Bytes an async save copies into a bucket's file and then hashes, when a task copies and hashes
/// the whole bucket: small enough that the source just read is still in the core's cache (the
/// copy's stores bypass it) when it is hashed.
constexpr std::size_t kCopyAndHashBytes = 512u << 10;

/// Whether some tensor of `state` lives on a GPU.
bool on_device(const StateDict& state) {
  return std::any_of(state.tensors.begin(), state.tensors.end(),
                     [](const auto& t) { return t.tensor.device().is_cuda(); });
}

/// Copies `bucket`'s data section from host-resident `state` into `dst`, a block at a time, and
/// hashes each block right after its copy, from the source it was just read from; adds the
/// seconds spent hashing to `hash_s`.
void copy_and_hash(const PlannedBucket& bucket, const StateDict& state, std::uint8_t* dst, BucketHasher& hasher,
                   double& hash_s) {
  // Items lie in data-offset order, end to end: the hasher takes the data section in order.
  for (const PlannedItem& item : bucket.items) {
    const auto* src = static_cast<const std::uint8_t*>(state.tensors[item.tensor_index].tensor.data());
    for (std::uint64_t done = 0; done < item.nbytes;) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kCopyAndHashBytes, item.nbytes - done));
      stream_copy(dst + item.data_offset + done, src + done, n);
      timed(hash_s, [&] {
        hasher.consume(src + done, n);
        return 0;
      });
      done += n;
    }
  }
}

Status stopped_by_another_bucket() {
  return {ErrorCode::aborted, "not finished: the save stopped after another bucket's error"};
}

}  // namespace

Result<std::unique_ptr<SaveEngine>> SaveEngine::create(int rank, SaveEngineOptions options,
                                                       std::shared_ptr<FileSystem> fs) {
  if (rank < 0) return Status{ErrorCode::invalid_argument, "rank must not be negative"};
  SH_RETURN_IF_ERROR(check_save_buckets(options.thread_count, options.staging_buckets));
  if (!fs) return Status{ErrorCode::invalid_argument, "no file system"};
  std::unique_ptr<SaveEngine> engine(new SaveEngine(rank, std::move(options), std::move(fs)));
  // One copy stream per writer thread, owned by the engine: the copies of one bucket's pieces
  // run on its stream while other buckets are hashed and written.
  for (int t = 0; t < engine->options_.thread_count; ++t) {
    auto stream = engine->copies_.create_stream();
    if (!stream.is_ok()) return stream.status().with_context("rank " + std::to_string(rank) + "'s copy streams");
    engine->streams_.push_back(*stream);
  }
  return engine;
}

SaveEngine::~SaveEngine() {
  for (const auto& stream : streams_) (void)copies_.destroy_stream(stream);
}

CopyStream SaveEngine::stream_of(const PlannedBucket& bucket) const {
  return streams_[static_cast<std::size_t>(bucket.index) % streams_.size()];
}

SaveEngine::SaveEngine(int rank, SaveEngineOptions options, std::shared_ptr<FileSystem> fs)
    : rank_(rank),
      options_(std::move(options)),
      fs_(std::move(fs)),
      staging_(options_.pinned, options_.uncached_writes),
      writers_(options_.thread_count, options_.writer_thread_start) {}

Result<const SavePlan*> SaveEngine::plan_for(const StateDict& state) {
  SH_RETURN_IF_ERROR(state.validate());
  if (!plan_ || plan_->signature != structure_signature(state)) plan_ = plan_save(rank_, state, options_.thread_count);
  return &*plan_;
}

bool SaveEngine::copies_out(const StateDict& state) const {
  return options_.stage_host_memory || on_device(state);
}

Status SaveEngine::reserve_staging(const StateDict& state, bool async, bool headroom, bool ahead) {
  // Ahead of the saves, every thread touches the new memory now; inside a save, its copies touch
  // it as they fill it (one pass over the memory, not two).
  return staging_.reserve(
      staging_slot_sizes(*plan_, options_.thread_count, options_.staging_buckets, async, copies_out(state)), headroom,
      ahead ? std::max(options_.thread_count, 1) : 0);
}

Status SaveEngine::prepare(const StateDict& state, bool async) {
  SH_RETURN_IF_ERROR(plan_for(state).status());
  if (options_.release_after_save) return Status::ok();
  // An async snapshot of the whole shard: the first save's global plan may give this rank more
  // than its own replicas (other ranks' blocks it also holds), which would be allocated and
  // first-touched inside that save's stall; an eighth more is reserved now (the slack the pool
  // keeps anyway), so that up to that much more is already there.
  return reserve_staging(state, async, async && options_.staging_buckets == 0, true);
}

std::uint8_t* SaveEngine::piece_memory(std::size_t slot, const PlannedBucket& bucket, std::uint64_t begin) {
  return staging_.data(slot) + staging_.block_offset(bucket.header.size() + begin);
}

RankSaveReport SaveEngine::make_report(std::int64_t step) const {
  RankSaveReport report;
  report.rank = rank_;
  report.step = step;
  return report;
}

std::string SaveEngine::bucket_context(const PlannedBucket& bucket) const {
  return "rank " + std::to_string(rank_) + " bucket " + std::to_string(bucket.index) + " (" + bucket.file_name + ")";
}

RankSaveReport SaveEngine::save(const StateDict& state, const std::string& policy_dir, std::int64_t step) {
  // What a begin_async() left without its write_async() goes.
  drop_begun();
  auto planned = plan_for(state);
  const bool direct = !copies_out(state);
  // Slots an async save left (the facade mixes sync and async saves) serve a sync save too:
  // pieces are cut to the largest slot.
  const bool reuse = direct || staging_.slot_count() > 0;
  Status st = !planned.is_ok() ? planned.status() : reuse ? Status::ok() : reserve_staging(state, false);
  if (!st.is_ok()) {
    if (options_.release_after_save) staging_.release_all();
    RankSaveReport report = make_report(step);
    report.status = st.with_context("rank " + std::to_string(rank_));
    return report;
  }
  prestaged_.assign(plan_->buckets.size(), {});
  prestage_copy_s_ = 0;
  prestage_cpu_s_ = 0;
  prestage_open_s_ = 0;
  std::size_t pieces = 0;
  const std::size_t piece = staging_.piece_bytes();
  if (!direct && piece > 0) {
    for (const auto& b : plan_->buckets) pieces += piece_count(b, piece);
  }
  unstaged_ = pieces;
  staged_objects_ = state.objects;
  return write_buckets(state, direct, policy_dir, step, {}, false);
}

Status SaveEngine::begin_async(const StateDict& state, const std::string& policy_dir) {
  Status st = [&]() -> Status {
    auto planned = plan_for(state);
    if (!planned.is_ok()) return planned.status().with_context("rank " + std::to_string(rank_));
    const std::size_t buckets = plan_->buckets.size();
    prestaged_.assign(buckets, {});
    opened_.clear();
    opened_.resize(buckets);
    in_file_.assign(buckets, nullptr);
    // In a folder kept in memory, the files now, and the buckets whose files are memory already
    // (written over, mapped) take their snapshot there. Not from a GPU: its copies want pinned
    // staging.
    const auto opening = Clock::now();
    if (!policy_dir.empty() && !on_device(state) && fs_->capabilities(policy_dir).in_memory) {
      for (std::size_t b = 0; b < buckets; ++b) {
        const PlannedBucket& bucket = plan_->buckets[b];
        auto file = open_bucket_file(*fs_, policy_dir, bucket);
        if (!file.is_ok()) return file.status().with_context(bucket_context(bucket));
        in_file_[b] = (*file)->memory_at(bucket.header.size(), static_cast<std::size_t>(bucket.data_bytes));
        opened_[b] = std::move(*file);
      }
    }
    prestage_open_s_ = std::chrono::duration<double>(Clock::now() - opening).count();
    if (std::find(in_file_.begin(), in_file_.end(), nullptr) != in_file_.end()) {
      SH_RETURN_IF_ERROR(reserve_staging(state, true));
    } else {
      // Every bucket in its file: the staging memory is not needed, and goes back to the
      // system (a later save that needs it allocates it again).
      staging_.release_all();
    }
    const std::size_t piece = staging_.piece_bytes();
    // What is staged now: a piece of a bucket (its data bytes [begin, end)) into `dest`, which
    // is staging slot `slot`, or the bucket's file (no slot).
    // `hashed`: the whole bucket, copied into its file and hashed by one task.
    struct Staged {
      std::size_t bucket;
      std::uint64_t begin, end;
      std::uint8_t* dest;
      std::optional<std::size_t> slot;
      bool hashed = false;
    };
    std::vector<Staged> staged;
    // The buckets staged into their files, whole: with staging_buckets k > 0, the first k such
    // buckets now and the others by write_async() (copied and hashed there, behind the fence, as
    // pieces beyond the staging slots are); else all of them now. One task copies and hashes a
    // bucket while that keeps the writer threads about evenly busy (no such bucket more than
    // twice their mean size): each block is hashed while it is still in the cache, and
    // write_async() only commits the file. A larger bucket is copied in pieces, a task each, and
    // hashed by write_async().
    hashed_.assign(buckets, {});
    copy_later_.assign(buckets, false);
    std::uint64_t in_file_bytes = 0;
    for (std::size_t b = 0; b < buckets; ++b) {
      if (in_file_[b] != nullptr) in_file_bytes += plan_->buckets[b].data_bytes;
    }
    std::size_t in_file_now = 0;
    std::size_t in_file_later = 0;
    for (std::size_t b = 0; b < buckets; ++b) {
      if (in_file_[b] == nullptr) continue;
      const PlannedBucket& bucket = plan_->buckets[b];
      if (options_.staging_buckets > 0 && in_file_now >= static_cast<std::size_t>(options_.staging_buckets)) {
        copy_later_[b] = true;
        ++in_file_later;
        continue;
      }
      ++in_file_now;
      if (bucket.data_bytes * buckets <= 2 * in_file_bytes) {
        staged.push_back({b, 0, bucket.data_bytes, in_file_[b], std::nullopt, true});
        continue;
      }
      for (std::uint64_t begin = 0; begin < bucket.data_bytes; begin += kInFilePieceBytes) {
        staged.push_back({b, begin, std::min<std::uint64_t>(begin + kInFilePieceBytes, bucket.data_bytes),
                          in_file_[b] + begin, std::nullopt});
      }
    }
    // The first pieces of every other bucket in turn, while slots are free, so that every writer
    // thread has staged bytes to write at once.
    std::size_t total = 0;
    for (std::size_t b = 0; b < buckets; ++b) {
      if (in_file_[b] == nullptr && piece) total += piece_count(plan_->buckets[b], piece);
    }
    std::size_t into_slots = 0;
    bool room = true;
    for (std::size_t k = 0; room && into_slots < total; ++k) {
      for (std::size_t b = 0; room && b < buckets; ++b) {
        const PlannedBucket& bucket = plan_->buckets[b];
        if (in_file_[b] != nullptr || k >= piece_count(bucket, piece)) continue;
        const std::uint64_t begin = k * piece;
        const std::uint64_t end = std::min<std::uint64_t>(begin + piece, bucket.data_bytes);
        std::size_t slot = 0;
        room = staging_.try_acquire(static_cast<std::size_t>(end - begin), slot);
        if (room) {
          staged.push_back({b, begin, end, piece_memory(slot, bucket, begin), slot});
          prestaged_[b].push_back(slot);
          ++into_slots;
        }
      }
    }
    std::vector<Status> results(staged.size());
    std::vector<double> cpu(staged.size());
    // The calling thread copies too, at its own priority, beside as many writer threads as
    // there are tasks left: the caller waits for these copies anyway, and a writer thread (low
    // priority) may be queued behind other ranks' background writes on a busy machine.
    std::atomic<std::size_t> next{0};
    auto take_tasks = [&] {
      for (std::size_t i = next.fetch_add(1); i < staged.size(); i = next.fetch_add(1)) {
        const double cpu_start = thread_cpu_seconds();
        const Staged& s = staged[i];
        const PlannedBucket& bucket = plan_->buckets[s.bucket];
        if (s.hashed) {
          InFileHash& h = hashed_[s.bucket];
          BucketHasher hasher(bucket, h.chunks);
          copy_and_hash(bucket, state, s.dest, hasher, h.hash_s);
          h.xxh3 = hasher.file_digest();
          h.taken = true;
        } else {
          results[i] = stage_range(bucket, s.begin, s.end, state, s.dest, copies_, stream_of(bucket))
                           .with_context(bucket_context(bucket));
        }
        cpu[i] = thread_cpu_seconds() - cpu_start;
      }
    };
    auto start = Clock::now();
    const std::size_t helpers =
        std::min<std::size_t>(staged.empty() ? 0 : staged.size() - 1, static_cast<std::size_t>(options_.thread_count));
    std::vector<std::future<void>> done;
    // The helpers read this frame's vectors: every one has finished before it goes, even when
    // the caller's own copies throw.
    struct WaitForHelpers {
      std::vector<std::future<void>>& done;
      ~WaitForHelpers() {
        for (auto& f : done) {
          if (f.valid()) f.wait();
        }
      }
    } wait_for_helpers{done};
    for (std::size_t k = 0; k < helpers; ++k) done.push_back(writers_.submit(take_tasks));
    take_tasks();
    for (auto& f : done) f.get();
    prestage_copy_s_ = std::chrono::duration<double>(Clock::now() - start).count();
    prestage_cpu_s_ = 0;
    for (double c : cpu) prestage_cpu_s_ += c;
    unstaged_ = total - into_slots + in_file_later;
    for (const auto& r : results) SH_RETURN_IF_ERROR(r);
    return Status::ok();
  }();
  if (!st.is_ok()) {
    // No write follows to give them back.
    drop_begun();
    unstaged_ = 0;
    if (options_.release_after_save) staging_.release_all();
    return st;
  }
  staged_objects_ = state.objects;
  return Status::ok();
}

RankSaveReport SaveEngine::write_async(const StateDict& state, const std::string& policy_dir, std::int64_t step,
                                       const std::function<void()>& on_all_staged) {
  return write_buckets(state, false, policy_dir, step, on_all_staged, true);
}

void SaveEngine::drop_begun() {
  for (std::size_t b = 0; b < prestaged_.size(); ++b) give_back_prestaged(b, 0);
  opened_.clear();
  in_file_.clear();
  hashed_.clear();
  copy_later_.clear();
}

void SaveEngine::give_back_prestaged(std::size_t bucket, std::size_t from_piece) {
  auto& slots = prestaged_[bucket];
  for (std::size_t k = from_piece; k < slots.size(); ++k) staging_.give_back(slots[k]);
  slots.clear();
}

RankSaveReport SaveEngine::write_buckets(const StateDict& state, bool direct, const std::string& policy_dir,
                                         std::int64_t step, const std::function<void()>& on_all_staged,
                                         bool background) {
  RankSaveReport report = make_report(step);
  report.objects = staged_objects_;
  std::atomic<bool> signalled{false};
  auto all_staged = [&] {
    if (!signalled.exchange(true) && on_all_staged) on_all_staged();
  };
  if (unstaged_.load() == 0) all_staged();
  failed_ = false;
  const std::size_t buckets = plan_->buckets.size();
  std::vector<BucketWriteResult> results(buckets);
  std::vector<double> cpu(buckets);
  // Started off the writers' threads (a full device queue blocks it), at their priority; this
  // save's only.
  std::optional<BackgroundWriteback> writeback;
  if (options_.early_writeback) writeback.emplace(options_.writer_thread_start);
  BackgroundWriteback* early = writeback ? &*writeback : nullptr;
  // Asked once a save (a statfs on a local folder), not once a bucket.
  const bool uploads = fs_->capabilities(policy_dir).uploads;
  std::vector<std::future<void>> done;
  for (std::size_t b = 0; b < buckets; ++b) {
    done.push_back(writers_.submit([&, b] {
      const double cpu_start = thread_cpu_seconds();
      results[b] = write_bucket(plan_->buckets[b], state, direct, policy_dir, uploads, all_staged, early, background);
      cpu[b] = thread_cpu_seconds() - cpu_start;
    }));
  }
  for (auto& f : done) f.get();
  // Ended early on an error: nothing reads the state any more.
  all_staged();
  unstaged_ = 0;
  // The error that stopped the save, not a bucket it stopped.
  for (const auto& r : results) {
    if (!r.status.is_ok() && r.status.code() != ErrorCode::aborted && report.status.is_ok()) report.status = r.status;
  }
  for (auto& r : results) {
    if (!r.status.is_ok() && report.status.is_ok()) report.status = r.status;
    report.phases.take_max(r.phases);
    report.buckets.push_back(std::move(r));
  }
  report.phases.copy_s += prestage_copy_s_;
  prestage_copy_s_ = 0;
  // Opening the files begin_async() opened.
  report.phases.write_s += prestage_open_s_;
  prestage_open_s_ = 0;
  report.cpu_s = prestage_cpu_s_;
  prestage_cpu_s_ = 0;
  for (double c : cpu) report.cpu_s += c;
  opened_.clear();
  in_file_.clear();
  hashed_.clear();
  copy_later_.clear();
  if (options_.release_after_save) {
    staging_.release_all();
    bounces_.release_all();
  }
  return report;
}

BucketWriteResult SaveEngine::write_bucket(const PlannedBucket& bucket, const StateDict& state, bool direct,
                                           const std::string& policy_dir, bool uploads,
                                           const std::function<void()>& all_staged, BackgroundWriteback* writeback,
                                           bool background) {
  BucketWriteResult result;
  // An async save's background work steps aside, before each piece of it, while a caller in
  // this process is blocked on another save's staging (another rank's, sharing the cores).
  auto yield_to_foreground = [background] {
    if (background) foreground_gate().wait();
  };
  yield_to_foreground();
  result.bucket = bucket.index;
  result.file = bucket.file_name;
  const auto b = static_cast<std::size_t>(bucket.index);
  std::size_t written_pieces = 0;
  Status st = [&]() -> Status {
    std::unique_ptr<WritableFile> file;
    if (b < opened_.size() && opened_[b]) {
      file = std::move(opened_[b]);
    } else {
      // Not a file begin_async() staged into (its memory is the file's).
      const bool uncached = options_.uncached_writes && (b >= in_file_.size() || in_file_[b] == nullptr);
      SH_ASSIGN_OR_RETURN(file, timed(result.phases.write_s,
                                      [&] { return open_bucket_file(*fs_, policy_dir, bucket, uncached); }));
    }
    std::uint8_t* in_file = b < in_file_.size() ? in_file_[b] : nullptr;
    // No write-back of the file is left running or queued once this scope ends (before the file
    // is destroyed, on every path) or the file is synced.
    struct Forget {
      BackgroundWriteback* writeback;
      WritableFile& file;
      ~Forget() {
        if (writeback != nullptr) writeback->forget(file);
      }
    } forget{writeback, *file};
    const bool hashed = b < hashed_.size() && hashed_[b].taken;
    // Not when begin_async() hashed the bucket.
    std::optional<BucketHasher> hasher;
    if (!hashed) hasher.emplace(bucket, result.chunks);
    if (hashed) {
      // Copied into the file and hashed by begin_async().
      result.staged_in_file = true;
      result.chunks = std::move(hashed_[b].chunks);
      result.phases.hash_s += hashed_[b].hash_s;
      result.xxh3 = hashed_[b].xxh3;
    } else if (in_file != nullptr && b < copy_later_.size() && copy_later_[b]) {
      // Into its file, now: begin_async() staged as many buckets as staging_buckets says.
      result.staged_in_file = true;
      if (failed_.load()) return stopped_by_another_bucket();
      yield_to_foreground();
      const double hashing = result.phases.hash_s;
      const auto copying = Clock::now();
      copy_and_hash(bucket, state, in_file, *hasher, result.phases.hash_s);
      // The copy's seconds, less the hashing among them.
      result.phases.copy_s +=
          std::chrono::duration<double>(Clock::now() - copying).count() - (result.phases.hash_s - hashing);
      if (unstaged_.fetch_sub(1) == 1) all_staged();
    } else if (in_file != nullptr) {
      // Staged into the file by begin_async(): its bytes are there; hashed from there.
      result.staged_in_file = true;
      for (std::uint64_t done = 0; done < bucket.data_bytes;) {
        if (failed_.load()) return stopped_by_another_bucket();
        yield_to_foreground();
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kHashBlockBytes, bucket.data_bytes - done));
        timed(result.phases.hash_s, [&] {
          hasher->consume(in_file + done, n);
          return 0;
        });
        done += n;
      }
    } else if (direct) {
      // Into a file that takes writes around the page cache, through a bounce block of the
      // engine's (the tensors' memory does not lie at their file bytes' offsets within a block):
      // a copy as the page cache's would be, without its page allocations and dirty pages.
      HostBuffer bounce;
      if (file->direct_block() == kDirectIoBlock) bounce = bounces_.take();
      struct GiveBack {
        SaveEngine& engine;
        HostBuffer& bounce;
        ~GiveBack() {
          if (bounce.valid()) engine.bounces_.give_back(std::move(bounce));
        }
      } give_back{*this, bounce};
      for (const PlannedItem& item : bucket.items) {
        if (failed_.load()) return stopped_by_another_bucket();
        const auto* data = static_cast<const std::uint8_t*>(state.tensors[item.tensor_index].tensor.data());
        const auto bytes = static_cast<std::size_t>(item.nbytes);
        SH_RETURN_IF_ERROR(hash_and_write(*file, bucket, *hasher, item.data_offset, data, bytes, result.phases,
                                          writeback, bounce.valid() ? bounce.data() : nullptr));
      }
    } else {
      const std::size_t piece = staging_.piece_bytes();
      const std::size_t pieces = piece ? piece_count(bucket, piece) : 0;
      for (std::size_t k = 0; k < pieces; ++k) {
        if (failed_.load()) return stopped_by_another_bucket();
        yield_to_foreground();
        const std::uint64_t begin = k * piece;
        const auto bytes = static_cast<std::size_t>(std::min<std::uint64_t>(begin + piece, bucket.data_bytes) - begin);
        std::size_t slot = 0;
        if (k < prestaged_[b].size()) {
          slot = prestaged_[b][k];
        } else {
          slot = staging_.acquire(bytes);
          Status staged = timed(result.phases.copy_s,
                                [&] {
                                  return stage_range(bucket, begin, begin + bytes, state,
                                                     piece_memory(slot, bucket, begin), copies_, stream_of(bucket));
                                });
          if (unstaged_.fetch_sub(1) == 1) all_staged();
          if (!staged.is_ok()) {
            staging_.give_back(slot);
            return staged;
          }
        }
        Status written =
            hash_and_write(*file, bucket, *hasher, begin, piece_memory(slot, bucket, begin), bytes, result.phases,
                           writeback);
        staging_.give_back(slot);
        written_pieces = k + 1;
        SH_RETURN_IF_ERROR(written);
      }
    }
    result.size = bucket.file_size();
    if (hasher) result.xxh3 = hasher->file_digest();
    // Making an object durable is its upload.
    double& durable_s = uploads ? result.phases.upload_s : result.phases.fsync_s;
    if (writeback != nullptr) writeback->forget(*file);
    return timed(durable_s, [&] {
      Status synced = file->sync();
      return synced.is_ok() ? file->close() : synced;
    });
  }();
  if (!direct && b < prestaged_.size()) give_back_prestaged(b, written_pieces);
  if (!st.is_ok()) {
    if (st.code() != ErrorCode::aborted) failed_ = true;
    result.status = st.with_context(bucket_context(bucket));
  }
  return result;
}

}  // namespace stagehand
