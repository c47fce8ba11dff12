#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "stagehand/storage/posix_io.hpp"
#include "stagehand/storage/s3_request.hpp"

// Uploading files: one PUT each below the multipart threshold, multipart uploads of many parts
// in parallel above it, and aborts so that a failure leaves no parts stored.

namespace stagehand {

using s3::answer_root;
using s3::kMaxParts;
using s3::query_value;

Status Bucket::upload_files(const std::vector<FileUpload>& files) {
  struct OpenFile {
    posix::Fd file;
    std::uint64_t size;
    std::optional<MultipartUpload> multipart;
    std::vector<std::string> etags;
  };
  struct Task {
    std::size_t file;
    /// 1-based part number; 0 for a single PUT.
    std::uint64_t part;
    std::uint64_t offset;
    std::uint64_t bytes;
  };
  std::vector<OpenFile> open;
  std::vector<Task> tasks;
  Status failed;
  auto abort_begun = [&]() {
    std::string left_open;
    for (auto& f : open) {
      if (!f.multipart) continue;
      Status aborted = abort_upload(*f.multipart);
      if (!aborted.is_ok())
        left_open += "; multipart upload " + f.multipart->upload_id + " of '" +
                     url(f.multipart->key) + "' is left open: " + aborted.message();
    }
    return left_open;
  };
  for (std::size_t i = 0; i < files.size(); ++i) {
    posix::Fd file(::open(files[i].local_path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    if (!file.valid() || ::fstat(file.get(), &st) != 0) {
      failed = Status::from_errno(errno, "cannot open '" + files[i].local_path + "' to upload it");
      break;
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    open.push_back({std::move(file), size, std::nullopt, {}});
    if (size < options_.multipart_threshold) {
      tasks.push_back({i, 0, 0, size});
      continue;
    }
    std::uint64_t part_size = std::max(options_.part_size, (size + kMaxParts - 1) / kMaxParts);
    Request initiate;
    initiate.method = "POST";
    initiate.key = files[i].key;
    initiate.query = "uploads=";
    auto response = perform(initiate, "begin multipart upload of");
    if (!response.is_ok()) {
      failed = response.status();
      break;
    }
    pugi::xml_document doc;
    const std::string what = "begin multipart upload of '" + url(files[i].key) + "'";
    auto result = answer_root(doc, response->body, "InitiateMultipartUploadResult", what);
    std::string id = result.is_ok() ? result->child_value("UploadId") : "";
    if (id.empty()) {
      failed = result.is_ok() ? Status{ErrorCode::io_error, what + ": no UploadId in the answer"}
                              : result.status();
      break;
    }
    open.back().multipart = MultipartUpload{files[i].key, id};
    std::uint64_t parts = (size + part_size - 1) / part_size;
    open.back().etags.resize(parts);
    for (std::uint64_t p = 0; p < parts; ++p) {
      tasks.push_back({i, p + 1, p * part_size, std::min(part_size, size - p * part_size)});
    }
  }
  if (!failed.is_ok()) return Status{failed.code(), failed.message() + abort_begun()};

  std::atomic<std::size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  auto work = [&] {
    for (std::size_t t; !stop.load() && (t = next.fetch_add(1)) < tasks.size();) {
      const Task& task = tasks[t];
      OpenFile& f = open[task.file];
      Request put;
      put.method = "PUT";
      put.key = files[task.file].key;
      put.fd = f.file.get();
      put.file_offset = task.offset;
      put.file_bytes = task.bytes;
      if (task.part > 0) {
        put.query = "partNumber=" + std::to_string(task.part) +
                    "&uploadId=" + query_value(f.multipart->upload_id);
      }
      auto response =
          perform(put, task.part > 0 ? "upload part " + std::to_string(task.part) + " of" : "PUT");
      std::lock_guard<std::mutex> lock(mutex);
      if (!response.is_ok()) {
        if (failed.is_ok()) failed = response.status();
        stop = true;
      } else if (task.part > 0) {
        f.etags[task.part - 1] = response->etag;
      }
    }
  };
  std::vector<std::thread> threads;
  std::size_t thread_count =
      std::min<std::size_t>(static_cast<std::size_t>(options_.upload_threads), tasks.size());
  for (std::size_t i = 1; i < thread_count; ++i)
    threads.emplace_back(work);
  work();
  for (auto& t : threads)
    t.join();

  for (std::size_t i = 0; i < open.size() && failed.is_ok(); ++i) {
    OpenFile& f = open[i];
    if (!f.multipart) continue;
    std::string body = "<CompleteMultipartUpload>";
    for (std::size_t p = 0; p < f.etags.size(); ++p) {
      body += "<Part><PartNumber>" + std::to_string(p + 1) + "</PartNumber><ETag>" + f.etags[p] +
              "</ETag></Part>";
    }
    body += "</CompleteMultipartUpload>";
    Request complete;
    complete.method = "POST";
    complete.key = f.multipart->key;
    complete.query = "uploadId=" + query_value(f.multipart->upload_id);
    complete.body = body;
    complete.headers.push_back("Content-Type: application/xml");
    auto response = perform(complete, "complete multipart upload of");
    if (!response.is_ok()) {
      failed = response.status();
      break;
    }
    f.multipart.reset();
  }
  if (!failed.is_ok()) return Status{failed.code(), failed.message() + abort_begun()};
  return Status::ok();
}

}  // namespace stagehand
