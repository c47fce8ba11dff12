#include "stagehand/checkpoint/save/writer.hpp"

#include <algorithm>
#include <cstring>

namespace stagehand {

Result<std::unique_ptr<WritableFile>> open_bucket_file(FileSystem& fs, const std::string& dir,
                                                       const PlannedBucket& bucket, bool uncached) {
  const std::string path = dir + "/" + bucket.file_name;
  SH_ASSIGN_OR_RETURN(auto file, uncached ? fs.create_file_uncached(path) : fs.create_file(path));
  SH_RETURN_IF_ERROR(file->append(bucket.header.data(), bucket.header.size()));
  return file;
}

BucketHasher::BucketHasher(const PlannedBucket& bucket, std::vector<ChunkRecord>& chunks)
    : bucket_(bucket), chunks_(chunks) {
  chunks_.assign(bucket.items.size(), ChunkRecord{});
  for (std::size_t i = 0; i < bucket.items.size(); ++i) {
    const PlannedItem& item = bucket.items[i];
    const std::uint64_t begin = bucket.header.size() + item.data_offset;
    chunks_[i] = {static_cast<std::uint32_t>(item.tensor_index), begin, begin + item.nbytes, 0};
  }
  file_.update(bucket.header.data(), bucket.header.size());
  close_finished_items();
}

void BucketHasher::close_finished_items() {
  while (next_item_ < bucket_.items.size()) {
    const PlannedItem& item = bucket_.items[next_item_];
    if (item.data_offset + item.nbytes > consumed_) return;
    chunks_[next_item_].xxh3 = item_.digest();
    item_.reset();
    ++next_item_;
  }
}

void BucketHasher::consume(const std::uint8_t* data, std::size_t bytes) {
  file_.update(data, bytes);
  while (bytes > 0 && next_item_ < bucket_.items.size()) {
    const PlannedItem& item = bucket_.items[next_item_];
    auto n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, item.data_offset + item.nbytes - consumed_));
    item_.update(data, n);
    data += n;
    bytes -= n;
    consumed_ += n;
    close_finished_items();
  }
}

BackgroundWriteback::BackgroundWriteback(const std::function<void()>& thread_start)
    : thread_([this, thread_start] { run(thread_start); }) {}

BackgroundWriteback::~BackgroundWriteback() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  thread_.join();
}

void BackgroundWriteback::request(WritableFile& file, std::uint64_t offset, std::size_t bytes) {
  {
    std::lock_guard lock(mutex_);
    const std::uint64_t end = offset + bytes;
    for (Range& r : queue_) {
      if (r.file == &file && offset <= r.end && r.begin <= end) {
        r.begin = std::min(r.begin, offset);
        r.end = std::max(r.end, end);
        return;
      }
    }
    queue_.push_back({&file, offset, end});
  }
  wake_.notify_one();
}

void BackgroundWriteback::forget(WritableFile& file) {
  std::unique_lock lock(mutex_);
  std::erase_if(queue_, [&](const Range& r) { return r.file == &file; });
  idle_.wait(lock, [&] { return running_ != &file; });
}

std::uint64_t BackgroundWriteback::started() const {
  std::lock_guard lock(mutex_);
  return started_;
}

void BackgroundWriteback::run(const std::function<void()>& thread_start) {
  if (thread_start) thread_start();
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    const Range r = queue_.front();
    queue_.pop_front();
    running_ = r.file;
    ++started_;
    lock.unlock();
    // A hint: its errors are the sync's to report.
    (void)r.file->start_writeback(r.begin, static_cast<std::size_t>(r.end - r.begin));
    lock.lock();
    running_ = nullptr;
    idle_.notify_all();
  }
}

Status write_and_start_writeback(WritableFile& file, std::uint64_t offset, const std::uint8_t* data,
                                 std::size_t bytes, BackgroundWriteback* writeback) {
  SH_RETURN_IF_ERROR(file.write_at(offset, data, bytes));
  if (writeback != nullptr) writeback->request(file, offset, bytes);
  return Status::ok();
}

Status hash_and_write(WritableFile& file, const PlannedBucket& bucket, BucketHasher& hasher, std::uint64_t at,
                      const std::uint8_t* data, std::size_t bytes, SavePhases& phases, BackgroundWriteback* writeback,
                      std::uint8_t* bounce) {
  const std::size_t write_bytes = file.direct_block() > 0 ? kDirectWriteBytes : kHashBlockBytes;
  for (std::size_t done = 0; done < bytes;) {
    const std::uint64_t offset = bucket.header.size() + at + done;
    // Through the bounce block: at the offset's place within a block, each write ending at a
    // block boundary.
    const auto lead = static_cast<std::size_t>(offset % kDirectIoBlock);
    const std::size_t n = std::min(bounce != nullptr ? kBounceBytes - lead : write_bytes, bytes - done);
    const std::uint8_t* from = bounce != nullptr ? bounce + lead : data + done;
    for (std::size_t k = 0; k < n; k += kHashBlockBytes) {
      const std::size_t m = std::min(kHashBlockBytes, n - k);
      // Hashed from the source, then copied: the hash reads it into the cache the copy reads
      // from.
      timed(phases.hash_s, [&] {
        hasher.consume(data + done + k, m);
        return 0;
      });
      if (bounce != nullptr) {
        timed(phases.copy_s, [&] {
          std::memcpy(bounce + lead + k, data + done + k, m);
          return 0;
        });
      }
    }
    SH_RETURN_IF_ERROR(
        timed(phases.write_s, [&] { return write_and_start_writeback(file, offset, from, n, writeback); }));
    done += n;
  }
  return Status::ok();
}

}  // namespace stagehand
