#include "stagehand/actors/file_server.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <map>
#include <set>
#include <mutex>
#include <tuple>
#include <variant>
#include <vector>

#include "stagehand/actors/messages.hpp"

namespace stagehand {

namespace {

// The protocol: (rfs_atom, op, path a, path b, handle, offset, size, bytes, session) is answered
// with (code, message, value, bytes, strings); `session` is the client's actor, whose end
// releases what it still holds. Only CAF's built-in types travel, so nothing is registered.
using Reply = std::tuple<std::int32_t, std::string, std::uint64_t, std::string, std::vector<std::string>>;

Reply reply_of(const Status& st, std::uint64_t value = 0, std::string bytes = {}, std::vector<std::string> strings = {}) {
  return Reply{static_cast<std::int32_t>(st.code()), st.is_ok() ? std::string() : st.message(), value, std::move(bytes),
               std::move(strings)};
}

bool has_dot_dot(const std::string& path) {
  for (std::size_t at = 0; at <= path.size();) {
    const std::size_t end = std::min(path.find('/', at), path.size());
    if (path.compare(at, end - at, "..") == 0 && end - at == 2) return true;
    at = end + 1;
  }
  return false;
}

/// What the server holds for its clients.
struct ServerState {
  std::shared_ptr<FileSystem> fs;
  std::string folder;
  using Held = std::variant<std::unique_ptr<WritableFile>, std::unique_ptr<ReadableFile>, std::unique_ptr<FileLock>>;
  /// By the client's session and the handle the client chose for it: a client reaches only its
  /// own, and one whose call timed out can release what the server opened for it anyway.
  std::map<std::pair<caf::actor_addr, std::uint64_t>, Held> held;
  std::vector<caf::actor_addr> sessions;
};

/// One call on the server's side.
Reply serve(caf::event_based_actor* self, ServerState& state, const std::string& op, const std::string& a,
            const std::string& b, std::uint64_t handle, std::uint64_t offset, std::uint64_t size, const std::string& bytes,
            const caf::actor& session);

caf::behavior file_server(caf::event_based_actor* self, std::shared_ptr<ServerState> s) {
  self->set_down_handler([s](caf::down_msg& down) {
    // The client's process went away: what it held is dropped (unsynced writes are lost).
    for (auto it = s->held.begin(); it != s->held.end();) {
      it = it->first.first == down.source ? s->held.erase(it) : std::next(it);
    }
    s->sessions.erase(std::remove(s->sessions.begin(), s->sessions.end(), down.source), s->sessions.end());
  });
  return {
      [self, s](rfs_atom, const std::string& op, const std::string& a, const std::string& b, std::uint64_t handle,
                std::uint64_t offset, std::uint64_t size, const std::string& bytes, const caf::actor& session) -> Reply {
        // A handler that throws would end the server for every client: what throws is an error.
        try {
          return serve(self, *s, op, a, b, handle, offset, size, bytes, session);
        } catch (const std::exception& e) {
          return reply_of(Status{ErrorCode::internal, op + " '" + a + "': " + e.what()});
        }
      },
  };
}

Reply serve(caf::event_based_actor* self, ServerState& state, const std::string& op, const std::string& a,
            const std::string& b, std::uint64_t handle, std::uint64_t offset, std::uint64_t size, const std::string& bytes,
            const caf::actor& session) {
  static const std::set<std::string> kPathCalls{"create", "reuse", "open", "stat", "remove", "mkdir", "isdir",
                                                "list", "rmtree", "syncdir", "rename", "exchange", "access",
                                                "lock", "abort"};
  if (kPathCalls.count(op) > 0 && a.empty()) {
    return reply_of(Status{ErrorCode::invalid_argument, op + " needs a path"});
  }
  // The second string is a path for the calls that move files (a lock's is its holder).
  const bool two_paths = op == "reuse" || op == "rename" || op == "exchange";
  for (const std::string* p : {&a, &b}) {
    if (p == &b && !two_paths) continue;
    if (p->empty() && kPathCalls.count(op) == 0) continue;
    if (!path_within(*p, state.folder) || has_dot_dot(*p)) {
      return reply_of(Status{ErrorCode::permission_denied,
                             "'" + *p + "' is outside the folder '" + state.folder + "' this server serves"});
    }
  }
  const auto key = std::make_pair(session.address(), handle);
  auto keep = [&](auto thing) {
    if (session && std::find(state.sessions.begin(), state.sessions.end(), session.address()) == state.sessions.end()) {
      self->monitor(session);
      state.sessions.push_back(session.address());
    }
    state.held.insert_or_assign(key, ServerState::Held{std::move(thing)});
    return handle;
  };
  auto writable = [&]() -> WritableFile* {
    auto it = state.held.find(key);
    if (it == state.held.end()) return nullptr;
    auto* f = std::get_if<std::unique_ptr<WritableFile>>(&it->second);
    return f ? f->get() : nullptr;
  };
  auto readable = [&]() -> ReadableFile* {
    auto it = state.held.find(key);
    if (it == state.held.end()) return nullptr;
    auto* f = std::get_if<std::unique_ptr<ReadableFile>>(&it->second);
    return f ? f->get() : nullptr;
  };
  const Status unknown{ErrorCode::invalid_argument,
                       "no open file " + std::to_string(handle) +
                           " of this client here (released when its session ended, or never opened)"};
  FileSystem& fs = *state.fs;
  if (op == "create" || op == "reuse") {
    auto f = op == "create" ? fs.create_file(a) : fs.reuse_file(a, b, nullptr);
    if (!f.is_ok()) return reply_of(f.status());
    return reply_of(Status::ok(), keep(std::move(*f)));
  }
  if (op == "append" || op == "write") {
    WritableFile* f = writable();
    if (f == nullptr) return reply_of(unknown);
    return reply_of(op == "append" ? f->append(bytes.data(), bytes.size())
                                   : f->write_at(offset, bytes.data(), bytes.size()));
  }
  if (op == "wback") {
    WritableFile* f = writable();
    return reply_of(f == nullptr ? unknown : f->start_writeback(offset, static_cast<std::size_t>(size)));
  }
  if (op == "sync") {
    WritableFile* f = writable();
    return reply_of(f == nullptr ? unknown : f->sync());
  }
  if (op == "close") {
    WritableFile* f = writable();
    if (f == nullptr) return reply_of(unknown);
    Status st = f->close();
    state.held.erase(key);
    return reply_of(st);
  }
  if (op == "open") {
    auto f = fs.open_file(a);
    if (!f.is_ok()) return reply_of(f.status());
    const std::uint64_t file_size = (*f)->size();
    return reply_of(Status::ok(), keep(std::move(*f)), {}, {std::to_string(file_size)});
  }
  if (op == "read") {
    ReadableFile* f = readable();
    if (f == nullptr) return reply_of(unknown);
    if (size > kRemoteChunkBytes) {
      return reply_of(Status{ErrorCode::invalid_argument, "a read of " + std::to_string(size) +
                                                              " bytes in one call (at most " +
                                                              std::to_string(kRemoteChunkBytes) + ")"});
    }
    std::string out(static_cast<std::size_t>(size), '\0');
    Status st = f->read(offset, out.data(), out.size());
    return st.is_ok() ? reply_of(st, 0, std::move(out)) : reply_of(st);
  }
  if (op == "release") {
    state.held.erase(key);
    return reply_of(Status::ok());
  }
  if (op == "stat") {
    auto v = fs.stat_file(a);
    if (!v.is_ok()) return reply_of(v.status());
    if (!*v) return reply_of(Status::ok());
    return reply_of(Status::ok(), (*v)->size, {}, {(*v)->tag});
  }
  if (op == "isdir") {
    auto d = fs.is_dir(a);
    return d.is_ok() ? reply_of(Status::ok(), *d ? 1 : 0) : reply_of(d.status());
  }
  if (op == "list") {
    auto entries = fs.list_dir(a);
    if (!entries.is_ok()) return reply_of(entries.status());
    std::vector<std::string> names;
    for (const auto& e : *entries) names.push_back(e.is_dir ? e.name + "/" : e.name);
    return reply_of(Status::ok(), 0, {}, std::move(names));
  }
  if (op == "lock") {
    auto lock = fs.lock_file(a, b);
    if (!lock.is_ok()) return reply_of(lock.status());
    return reply_of(Status::ok(), keep(std::move(*lock)));
  }
  if (op == "abort") {
    auto n = fs.abort_unfinished_writes(a);
    return n.is_ok() ? reply_of(Status::ok(), static_cast<std::uint64_t>(*n)) : reply_of(n.status());
  }
  if (op == "remove") return reply_of(fs.remove_file(a));
  if (op == "mkdir") return reply_of(fs.create_dir(a));
  if (op == "rmtree") return reply_of(fs.remove_tree(a));
  if (op == "syncdir") return reply_of(fs.sync_dir(a));
  if (op == "rename") return reply_of(fs.rename(a, b));
  if (op == "exchange") return reply_of(fs.exchange(a, b));
  if (op == "access") return reply_of(fs.check_access(a));
  return reply_of(Status{ErrorCode::invalid_argument, "unknown file server call '" + op + "'"});
}

// -- the client --

struct Answer {
  Status status;
  std::uint64_t value = 0;
  std::string bytes;
  std::vector<std::string> strings;
};

/// What a client's session saw of its server: why it was lost (empty while it is there), and
/// the calls waiting for an answer, to wake when it is.
struct Watch {
  std::mutex mutex;
  std::string lost;
  std::vector<caf::actor> waiting;
};

/// A client's way to its server: every call, and the session whose end releases what it holds
/// there. Shared by the file system and the files it opened, which may outlive it.
class Channel {
 public:
  Channel(caf::actor_system& system, caf::actor server, std::string name, std::chrono::milliseconds limit)
      : system_(system), server_(std::move(server)), name_(std::move(name)), limit_(limit) {
    // The session also watches the server (one monitor for every call): once the server's
    // process or connection is lost, it wakes the calls waiting and fails the later ones at once
    // (an answer from a lost remote actor never comes, and would be waited for to the limit).
    // Scheduled, not detached: a detached actor's thread waits, at the system's end, until the
    // actor is destroyed, which the middleman's references to an actor sent to another node can
    // hold off (seen as a hang at a test's end). Calls run on the caller's thread (writer threads,
    // a scoped actor each), so the scheduler stays free to run it.
    session_ = system_.spawn(
        [](caf::event_based_actor* self, caf::actor watched, std::shared_ptr<Watch> watch) -> caf::behavior {
          self->monitor(watched);
          self->set_down_handler([self, watch](caf::down_msg& down) {
            std::lock_guard<std::mutex> lock(watch->mutex);
            watch->lost = self->system().render(down.reason);
            if (watch->lost.empty()) watch->lost = "its connection was lost";
            for (const auto& waiting : watch->waiting) caf::anon_send(waiting, rfs_gone_atom::value);
          });
          return {[](caf::ok_atom) {}};
        },
        server_, watch_);
  }
  ~Channel() { end_session(); }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  /// Ends the session: the server drops what it holds for it.
  void end_session() { caf::anon_send_exit(session_, caf::exit_reason::user_shutdown); }

  using Clock = std::chrono::steady_clock;

  /// The limit of one call of the file system, from now.
  Clock::time_point deadline() const { return Clock::now() + limit_; }
  /// A handle for what the next call opens, chosen here so that a call that times out can still
  /// release what the server opened for it.
  std::uint64_t new_handle() const { return next_handle_.fetch_add(1); }

  /// One call, answered or failed by `until` (default: the limit from now), or at once when the
  /// server is lost. An error the server answers names the server.
  Answer call(const char* op, const std::string& a, const std::string& b = {}, std::uint64_t handle = 0,
              std::uint64_t offset = 0, std::uint64_t size = 0, std::string bytes = {},
              Clock::time_point until = {}) const {
    Answer out;
    const std::string what = name_ + ": " + op + (a.empty() ? std::string() : " '" + a + "'");
    if (until == Clock::time_point{}) until = deadline();
    auto gone = [&](const std::string& reason) {
      return Status{ErrorCode::io_error, what + ": the server is gone (" + reason + ")"};
    };
    caf::scoped_actor self{system_};
    const auto me = caf::actor_cast<caf::actor>(self);
    {
      std::lock_guard<std::mutex> lock(watch_->mutex);
      if (!watch_->lost.empty()) {
        out.status = gone(watch_->lost);
        return out;
      }
      watch_->waiting.push_back(me);
    }
    struct Unwait {
      const std::shared_ptr<Watch>& watch;
      const caf::actor& me;
      ~Unwait() {
        std::lock_guard<std::mutex> lock(watch->mutex);
        watch->waiting.erase(std::find(watch->waiting.begin(), watch->waiting.end(), me));
      }
    } unwait{watch_, me};
    const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()),
                               std::chrono::milliseconds(1));
    // A plain send: the server's answer comes back as an ordinary message, received below with
    // the session's word that the server is gone, and the limit.
    self->send(server_, rfs_atom::value, std::string(op), a, b, handle, offset, size, std::move(bytes), session_);
    self->receive(
        [&](std::int32_t code, std::string& message, std::uint64_t value, std::string& data,
            std::vector<std::string>& strings) {
          if (code != 0) {
            out.status = Status{static_cast<ErrorCode>(code), name_ + ": " + message};
            return;
          }
          out.value = value;
          out.bytes = std::move(data);
          out.strings = std::move(strings);
        },
        [&](rfs_gone_atom) {
          std::lock_guard<std::mutex> lock(watch_->mutex);
          out.status = gone(watch_->lost);
        },
        [&](caf::error& err) { out.status = Status{ErrorCode::io_error, what + ": " + system_.render(err)}; },
        caf::after(left) >> [&] {
          out.status = Status{ErrorCode::timeout, what + ": no answer within " + std::to_string(limit_.count()) + " ms"};
          // What the server may still open for this call is released when it does.
          const std::string opened = op;
          if (opened == "create" || opened == "reuse" || opened == "open" || opened == "lock") tell("release", handle);
        });
    return out;
  }
  /// Tells the server without waiting (releasing what a destroyed handle held).
  void tell(const char* op, std::uint64_t handle) const {
    caf::anon_send(server_, rfs_atom::value, std::string(op), std::string(), std::string(), handle, std::uint64_t{0},
                   std::uint64_t{0}, std::string(), session_);
  }

 private:
  caf::actor_system& system_;
  caf::actor server_;
  std::string name_;
  std::chrono::milliseconds limit_;
  caf::actor session_;
  std::shared_ptr<Watch> watch_ = std::make_shared<Watch>();
  mutable std::atomic<std::uint64_t> next_handle_{1};
};


class RemoteFile final : public WritableFile {
 public:
  RemoteFile(std::shared_ptr<const Channel> fs, std::string path, std::uint64_t handle)
      : fs_(std::move(fs)), path_(std::move(path)), handle_(handle) {}
  ~RemoteFile() override;
  Status append(const void* data, std::size_t bytes) override;
  Status write_at(std::uint64_t offset, const void* data, std::size_t bytes) override;
  Status start_writeback(std::uint64_t offset, std::size_t bytes) override;
  Status sync() override;
  Status close() override;

 private:
  std::shared_ptr<const Channel> fs_;
  std::string path_;
  std::uint64_t handle_;
  bool closed_ = false;
};

class RemoteReadable final : public ReadableFile {
 public:
  RemoteReadable(std::shared_ptr<const Channel> fs, std::string path, std::uint64_t handle, std::uint64_t size)
      : fs_(std::move(fs)), path_(std::move(path)), handle_(handle), size_(size) {}
  ~RemoteReadable() override;
  std::uint64_t size() const override { return size_; }
  Status read(std::uint64_t offset, void* dst, std::size_t bytes) override;

 private:
  std::shared_ptr<const Channel> fs_;
  std::string path_;
  std::uint64_t handle_;
  std::uint64_t size_;
};

class RemoteLock final : public FileLock {
 public:
  RemoteLock(std::shared_ptr<const Channel> fs, std::uint64_t handle) : fs_(std::move(fs)), handle_(handle) {}
  ~RemoteLock() override;

 private:
  std::shared_ptr<const Channel> fs_;
  std::uint64_t handle_;
};

class RemoteFileSystem final : public FileSystem {
 public:
  explicit RemoteFileSystem(std::shared_ptr<Channel> channel) : channel_(std::move(channel)) {}
  /// Its session ends with it, even while files it opened live on (their calls then fail).
  ~RemoteFileSystem() override { channel_->end_session(); }

  Answer call(const char* op, const std::string& a, const std::string& b = {}) const { return channel_->call(op, a, b); }
  /// A call that opens something, under a handle chosen here.
  Answer open_call(const char* op, const std::string& a, const std::string& b = {}) const {
    return channel_->call(op, a, b, channel_->new_handle());
  }

  FileSystemCapabilities capabilities(const std::string&) const override { return {}; }

  Result<std::unique_ptr<WritableFile>> create_file(const std::string& path) override {
    Answer r = open_call("create", path);
    if (!r.status.is_ok()) return r.status;
    return std::unique_ptr<WritableFile>(new RemoteFile(channel_, path, r.value));
  }
  Result<std::unique_ptr<WritableFile>> reuse_file(const std::string& from, const std::string& to,
                                                   FileMappings*) override {
    Answer r = open_call("reuse", from, to);
    if (!r.status.is_ok()) return r.status;
    return std::unique_ptr<WritableFile>(new RemoteFile(channel_, to, r.value));
  }
  Result<std::unique_ptr<ReadableFile>> open_file(const std::string& path) override {
    Answer r = open_call("open", path);
    if (!r.status.is_ok()) return r.status;
    std::uint64_t size = 0;
    if (r.strings.size() != 1 ||
        std::from_chars(r.strings[0].data(), r.strings[0].data() + r.strings[0].size(), size).ec != std::errc{}) {
      return Status{ErrorCode::io_error, "open '" + path + "': the server answered no size"};
    }
    return std::unique_ptr<ReadableFile>(new RemoteReadable(channel_, path, r.value, size));
  }
  Result<std::optional<FileVersion>> stat_file(const std::string& path) override {
    Answer r = call("stat", path);
    if (!r.status.is_ok()) return r.status;
    if (r.strings.empty()) return std::optional<FileVersion>{};
    return std::optional<FileVersion>{FileVersion{r.value, r.strings[0]}};
  }
  Status remove_file(const std::string& path) override { return call("remove", path).status; }
  Status create_dir(const std::string& path) override { return call("mkdir", path).status; }
  Result<bool> is_dir(const std::string& path) override {
    Answer r = call("isdir", path);
    if (!r.status.is_ok()) return r.status;
    return r.value != 0;
  }
  Result<std::vector<DirEntry>> list_dir(const std::string& path) override {
    Answer r = call("list", path);
    if (!r.status.is_ok()) return r.status;
    std::vector<DirEntry> out;
    for (auto& name : r.strings) {
      const bool dir = name.ends_with("/");
      if (dir) name.pop_back();
      out.push_back({std::move(name), dir});
    }
    return out;
  }
  Status remove_tree(const std::string& path) override { return call("rmtree", path).status; }
  Status sync_dir(const std::string& path) override { return call("syncdir", path).status; }
  Status rename(const std::string& from, const std::string& to) override { return call("rename", from, to).status; }
  Status exchange(const std::string& a, const std::string& b) override { return call("exchange", a, b).status; }
  Status check_access(const std::string& path) override { return call("access", path).status; }
  Result<std::unique_ptr<FileLock>> lock_file(const std::string& path, const std::string& holder) override {
    Answer r = open_call("lock", path, holder);
    if (!r.status.is_ok()) return r.status;
    return std::unique_ptr<FileLock>(new RemoteLock(channel_, r.value));
  }
  Result<int> abort_unfinished_writes(const std::string& path) override {
    Answer r = call("abort", path);
    if (!r.status.is_ok()) return r.status;
    return static_cast<int>(r.value);
  }

 private:
  std::shared_ptr<Channel> channel_;
};

RemoteFile::~RemoteFile() {
  if (!closed_) fs_->tell("close", handle_);
}

Status RemoteFile::append(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  const auto until = fs_->deadline();
  for (std::size_t at = 0; at < bytes; at += kRemoteChunkBytes) {
    const std::size_t n = std::min(kRemoteChunkBytes, bytes - at);
    SH_RETURN_IF_ERROR(
        fs_->call("append", {}, {}, handle_, 0, n, std::string(p + at, n), until).status.with_context("'" + path_ + "'"));
  }
  return Status::ok();
}

Status RemoteFile::write_at(std::uint64_t offset, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  const auto until = fs_->deadline();
  for (std::size_t at = 0; at < bytes; at += kRemoteChunkBytes) {
    const std::size_t n = std::min(kRemoteChunkBytes, bytes - at);
    SH_RETURN_IF_ERROR(fs_->call("write", {}, {}, handle_, offset + at, n, std::string(p + at, n), until)
                           .status.with_context("'" + path_ + "'"));
  }
  return Status::ok();
}

Status RemoteFile::start_writeback(std::uint64_t offset, std::size_t bytes) {
  return fs_->call("wback", {}, {}, handle_, offset, bytes).status.with_context("'" + path_ + "'");
}

Status RemoteFile::sync() { return fs_->call("sync", {}, {}, handle_).status.with_context("'" + path_ + "'"); }

Status RemoteFile::close() {
  if (closed_) return Status::ok();
  closed_ = true;
  return fs_->call("close", {}, {}, handle_).status.with_context("'" + path_ + "'");
}

RemoteReadable::~RemoteReadable() { fs_->tell("release", handle_); }

Status RemoteReadable::read(std::uint64_t offset, void* dst, std::size_t bytes) {
  auto* p = static_cast<char*>(dst);
  const auto until = fs_->deadline();
  for (std::size_t at = 0; at < bytes; at += kRemoteChunkBytes) {
    const std::size_t n = std::min(kRemoteChunkBytes, bytes - at);
    Answer r = fs_->call("read", {}, {}, handle_, offset + at, n, {}, until);
    if (!r.status.is_ok()) return r.status.with_context("'" + path_ + "'");
    if (r.bytes.size() != n) {
      return Status{ErrorCode::corruption, "'" + path_ + "': " + std::to_string(r.bytes.size()) + " bytes came back of " +
                                               std::to_string(n) + " read at " + std::to_string(offset + at)};
    }
    std::copy(r.bytes.begin(), r.bytes.end(), p + at);
  }
  return Status::ok();
}

RemoteLock::~RemoteLock() { fs_->tell("release", handle_); }

}  // namespace

Result<FileServer> serve_folder(caf::actor_system& system, std::shared_ptr<FileSystem> local, std::string folder,
                                const std::string& address) {
  while (folder.size() > 1 && folder.ends_with("/")) folder.pop_back();
  if (!folder.starts_with("/") || has_dot_dot(folder)) {
    return Status{ErrorCode::invalid_argument, "a file server serves an absolute folder without '..', not '" + folder + "'"};
  }
  auto state = std::make_shared<ServerState>();
  state->fs = std::move(local);
  state->folder = std::move(folder);
  auto actor = system.spawn<caf::detached>(file_server, state);
  auto port = system.middleman().publish(actor, 0, address.c_str(), true);
  if (!port) {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return Status{ErrorCode::io_error, "the file server of '" + state->folder + "' cannot listen on " + address + ": " +
                                           system.render(port.error())};
  }
  return FileServer{actor, *port};
}

void stop_file_server(caf::actor_system& system, const FileServer& server) {
  if (!server.actor) return;
  (void)system.middleman().unpublish(server.actor, server.port);
  caf::anon_send_exit(server.actor, caf::exit_reason::user_shutdown);
}

std::shared_ptr<FileSystem> remote_file_system(caf::actor_system& system, caf::actor server, std::string name,
                                               std::chrono::milliseconds limit) {
  return std::make_shared<RemoteFileSystem>(std::make_shared<Channel>(system, std::move(server), std::move(name), limit));
}

}  // namespace stagehand
