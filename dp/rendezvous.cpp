// The launch environment and rank 0's blob over TCP (see rendezvous.h for the variables and the
// protocol). Every socket is non-blocking and every wait is a poll() bounded by one deadline.
#include "dp/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

namespace fusekit::dp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x70646b66;  // "fkdp" as little-endian bytes
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kHelloBytes = 16;
constexpr auto kRetryInterval = std::chrono::milliseconds(100);

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("fusekit dp: " + message); }

std::string seconds_text(std::chrono::milliseconds timeout) {
  const double s = static_cast<double>(timeout.count()) / 1000.0;
  std::string text = std::to_string(s);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text + " s";
}

// ---- the environment

const char* const kVariablesHint =
    "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; with mpirun pass "
    "-x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<free port>";

// A whole decimal integer in [low, high], or an error naming the variable.
long long parse_integer(const char* name, const std::string& text, long long low, long long high) {
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || value < low || value > high)
    fail(std::string(name) + "='" + text + "' is not an integer from " + std::to_string(low) + " to " +
         std::to_string(high));
  return value;
}

struct Found {
  const char* name = nullptr;
  std::string value;
};

// The first of `names` that is set.
std::optional<Found> first_set(const std::function<std::optional<std::string>(const char*)>& lookup,
                               std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (std::optional<std::string> value = lookup(name)) return Found{name, *value};
  }
  return std::nullopt;
}

// The first of `names` that is set, or an error naming them all (world_size 0: not known yet).
Found required(const std::function<std::optional<std::string>(const char*)>& lookup,
               std::initializer_list<const char*> names, int world_size) {
  if (std::optional<Found> found = first_set(lookup, names)) return *found;
  std::string list;
  for (const char* name : names) list += (list.empty() ? "" : " or ") + std::string(name);
  const std::string world = world_size > 0 ? " for a world of " + std::to_string(world_size) + " ranks" : "";
  fail(list + " is not set" + world + " (" + kVariablesHint + ")");
}

// ---- sockets

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) fail(std::string("fcntl: ") + std::strerror(errno));
}

int milliseconds_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1000));
}

// Waits for `events` on fd until the deadline; false at the deadline.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const int wait = milliseconds_left(deadline);
    if (wait == 0 && Clock::now() >= deadline) return false;
    pollfd p{fd, events, 0};
    const int ready = ::poll(&p, 1, wait);
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) fail(std::string("poll: ") + std::strerror(errno));
  }
}

// Sends all of `data` before the deadline; false if the peer closed or the deadline passed.
bool send_all(int fd, const uint8_t* data, size_t size, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!wait_for(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

enum class ReadResult { done, closed, timed_out };

ReadResult read_all(int fd, uint8_t* data, size_t size, Clock::time_point deadline) {
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::recv(fd, data + got, size - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0) {
      return ReadResult::closed;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!wait_for(fd, POLLIN, deadline)) return ReadResult::timed_out;
    } else {
      return ReadResult::closed;
    }
  }
  return ReadResult::done;
}

void put_u32(uint8_t* out, uint32_t v) {
  for (int b = 0; b < 4; ++b) out[b] = static_cast<uint8_t>(v >> (8 * b));
}
uint32_t get_u32(const uint8_t* in) {
  uint32_t v = 0;
  for (int b = 0; b < 4; ++b) v |= static_cast<uint32_t>(in[b]) << (8 * b);
  return v;
}

// Rank 0's listening socket on every interface: IPv6 accepting IPv4 too, else IPv4 alone.
Socket listen_on(uint16_t port, int backlog, const std::string& who) {
  Socket s(::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1, zero = 0;
  int rc = -1;
  if (s.valid()) {
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(port);
    rc = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address);
    if (rc != 0 && errno != EAFNOSUPPORT && errno != EADDRNOTAVAIL) {
      fail(who + ": cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno) +
           " (set FUSEKIT_RENDEZVOUS_PORT to a free port)");
    }
  }
  if (rc != 0) {
    s = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) fail(who + ": socket: " + std::strerror(errno));
    setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(port);
    if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      fail(who + ": cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno) +
           " (set FUSEKIT_RENDEZVOUS_PORT to a free port)");
  }
  if (::listen(s.fd(), backlog) != 0) fail(who + ": listen: " + std::strerror(errno));
  set_nonblocking(s.fd());
  return s;
}

// One attempt to connect to each address of host:port, each bounded by the deadline; an invalid
// socket and `error` set where none answered.
Socket try_connect(const std::string& host, uint16_t port, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  const int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &addresses);
  if (gai != 0) {
    error = std::string("cannot resolve '") + host + "': " + gai_strerror(gai);
    return Socket();
  }
  Socket connected;
  for (addrinfo* a = addresses; a != nullptr && !connected.valid(); a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      error = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    set_nonblocking(s.fd());
    int rc = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (!wait_for(s.fd(), POLLOUT, deadline)) {
        error = "connection timed out";
        continue;
      }
      int so_error = 0;
      socklen_t length = sizeof so_error;
      getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &so_error, &length);
      rc = so_error == 0 ? 0 : -1;
      errno = so_error;
    }
    if (rc == 0) {
      connected = std::move(s);
    } else {
      error = std::strerror(errno);
    }
  }
  ::freeaddrinfo(addresses);
  return connected;
}

std::vector<uint8_t> serve_blob(const LaunchEnvironment& launch, std::span<const uint8_t> blob,
                                Clock::time_point deadline, const std::string& who) {
  Socket listener = listen_on(launch.port, launch.world_size, who);
  struct Pending {
    Socket socket;
    uint8_t hello[kHelloBytes];
    size_t got = 0;
  };
  std::vector<Pending> pending;
  std::vector<Socket> ranks(static_cast<size_t>(launch.world_size));  // ranks[r]: rank r's connection
  int joined = 1;
  while (joined < launch.world_size) {
    std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
    for (const Pending& p : pending) fds.push_back({p.socket.fd(), POLLIN, 0});
    const int wait = milliseconds_left(deadline);
    if (wait == 0) {
      std::string missing;
      int count = 0;
      for (int r = 1; r < launch.world_size; ++r) {
        if (ranks[r].valid()) continue;
        if (++count <= 8) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      if (count > 8) missing += " and " + std::to_string(count - 8) + " more";
      fail(who + ": rank" + (count > 1 ? "s " : " ") + missing + " did not connect to port " +
           std::to_string(launch.port) + " within " + seconds_text(launch.timeout));
    }
    const int ready = ::poll(fds.data(), fds.size(), wait);
    if (ready < 0 && errno != EINTR) fail(who + ": poll: " + std::strerror(errno));
    if (ready <= 0) continue;
    if (fds[0].revents & POLLIN) {
      while (true) {
        Socket client(::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!client.valid()) break;
        pending.push_back({std::move(client), {}, 0});
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Pending& p = pending[i - 1];
      const ssize_t n = ::recv(p.socket.fd(), p.hello + p.got, kHelloBytes - p.got, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        p.socket.reset();  // closed before its hello: not one of ours, or a rank that died
        continue;
      }
      if (n < 0) continue;
      p.got += static_cast<size_t>(n);
      if (p.got >= 4 && get_u32(p.hello) != kMagic) {
        p.socket.reset();  // a stray connection
        continue;
      }
      if (p.got < kHelloBytes) continue;
      const uint32_t version = get_u32(p.hello + 4), rank = get_u32(p.hello + 8), world = get_u32(p.hello + 12);
      if (version != kProtocolVersion)
        fail(who + ": a rank speaks rendezvous protocol " + std::to_string(version) + ", this one " +
             std::to_string(kProtocolVersion) + " (different fusekit builds)");
      if (static_cast<int>(world) != launch.world_size)
        fail(who + ": rank " + std::to_string(rank) + " was started for a world of " + std::to_string(world) +
             " ranks");
      if (rank == 0 || static_cast<int>(rank) >= launch.world_size)
        fail(who + ": a process says it is rank " + std::to_string(rank));
      if (ranks[rank].valid()) fail(who + ": two processes say they are rank " + std::to_string(rank));
      ranks[rank] = std::move(p.socket);
      ++joined;
    }
    std::erase_if(pending, [](const Pending& p) { return !p.socket.valid(); });
  }
  std::vector<uint8_t> message(4 + blob.size());
  put_u32(message.data(), static_cast<uint32_t>(blob.size()));
  std::copy(blob.begin(), blob.end(), message.begin() + 4);
  for (int r = 1; r < launch.world_size; ++r) {
    if (!send_all(ranks[r].fd(), message.data(), message.size(), deadline))
      fail(who + ": rank " + std::to_string(r) + " closed its connection before the blob was sent");
  }
  return std::vector<uint8_t>(blob.begin(), blob.end());
}

std::vector<uint8_t> fetch_blob(const LaunchEnvironment& launch, size_t bytes, Clock::time_point deadline,
                                const std::string& who) {
  const std::string where = launch.master_addr + ":" + std::to_string(launch.port);
  Socket s;
  std::string error = "no attempt";
  while (true) {
    s = try_connect(launch.master_addr, launch.port, deadline, error);
    if (s.valid()) break;
    if (Clock::now() + kRetryInterval >= deadline)
      fail(who + ": could not reach rank 0 at " + where + " within " + seconds_text(launch.timeout) + " (" + error +
           ")");
    std::this_thread::sleep_for(kRetryInterval);
  }
  uint8_t hello[kHelloBytes];
  put_u32(hello, kMagic);
  put_u32(hello + 4, kProtocolVersion);
  put_u32(hello + 8, static_cast<uint32_t>(launch.rank));
  put_u32(hello + 12, static_cast<uint32_t>(launch.world_size));
  if (!send_all(s.fd(), hello, kHelloBytes, deadline)) fail(who + ": rank 0 at " + where + " closed the connection");
  uint8_t size[4];
  ReadResult result = read_all(s.fd(), size, 4, deadline);
  std::vector<uint8_t> blob;
  if (result == ReadResult::done) {
    if (get_u32(size) != bytes)
      fail(who + ": rank 0 sent " + std::to_string(get_u32(size)) + " bytes, expected " + std::to_string(bytes));
    blob.resize(bytes);
    result = read_all(s.fd(), blob.data(), bytes, deadline);
  }
  if (result == ReadResult::timed_out)
    fail(who + ": rank 0 at " + where + " did not send the blob within " + seconds_text(launch.timeout) +
         " (are all ranks started?)");
  if (result == ReadResult::closed) fail(who + ": rank 0 at " + where + " closed the connection before the blob");
  return blob;
}

}  // namespace

LaunchEnvironment read_launch_environment(const std::function<std::optional<std::string>(const char*)>& lookup) {
  LaunchEnvironment launch;
  const std::optional<Found> rank = first_set(lookup, {"RANK", "OMPI_COMM_WORLD_RANK"});
  const std::optional<Found> world = first_set(lookup, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"});
  if (std::optional<Found> timeout = first_set(lookup, {"FUSEKIT_RENDEZVOUS_TIMEOUT"}))
    launch.timeout = std::chrono::seconds(parse_integer(timeout->name, timeout->value, 1, 86400));
  if (!rank && !world) {
    launch.launcher = "single";
    return launch;
  }
  const Found world_found = world ? *world : required(lookup, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"}, 0);
  launch.world_size = static_cast<int>(parse_integer(world_found.name, world_found.value, 1, 1 << 20));
  const Found rank_found = rank ? *rank : required(lookup, {"RANK", "OMPI_COMM_WORLD_RANK"}, launch.world_size);
  launch.rank = static_cast<int>(parse_integer(rank_found.name, rank_found.value, 0, launch.world_size - 1));
  const bool torchrun = lookup("TORCHELASTIC_RUN_ID").has_value() || lookup("TORCHELASTIC_USE_AGENT_STORE").has_value();
  launch.launcher = torchrun ? "torchrun" : std::string(rank_found.name) == "RANK" ? "environment" : "mpirun";
  if (launch.world_size == 1) {
    if (std::optional<Found> local = first_set(lookup, {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}))
      launch.local_rank = static_cast<int>(parse_integer(local->name, local->value, 0, 1 << 20));
    return launch;
  }
  const Found local = required(lookup, {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"}, launch.world_size);
  launch.local_rank = static_cast<int>(parse_integer(local.name, local.value, 0, 1 << 20));
  launch.master_addr = required(lookup, {"MASTER_ADDR"}, launch.world_size).value;
  if (launch.master_addr.empty()) fail(std::string("MASTER_ADDR is empty (") + kVariablesHint + ")");
  if (std::optional<Found> port = first_set(lookup, {"FUSEKIT_RENDEZVOUS_PORT"})) {
    launch.port = static_cast<uint16_t>(parse_integer(port->name, port->value, 1, 65535));
  } else {
    const Found master_port = required(lookup, {"MASTER_PORT"}, launch.world_size);
    // torchrun's agent serves its TCPStore on MASTER_PORT itself: take the next port.
    const bool agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    launch.port = static_cast<uint16_t>(
        parse_integer(master_port.name, master_port.value, 1, agent_store ? 65534 : 65535) + (agent_store ? 1 : 0));
  }
  return launch;
}

LaunchEnvironment read_launch_environment() {
  return read_launch_environment([](const char* name) -> std::optional<std::string> {
    const char* value = std::getenv(name);
    return value ? std::optional<std::string>(value) : std::nullopt;
  });
}

int local_device(int local_rank, int device_count) {
  if (device_count < 1) fail("no GPU is visible to local rank " + std::to_string(local_rank));
  if (device_count == 1) return 0;
  if (local_rank >= device_count)
    fail("local rank " + std::to_string(local_rank) + " has no GPU of its own: " + std::to_string(device_count) +
         " are visible (start at most one rank per GPU)");
  return local_rank;
}

std::vector<uint8_t> broadcast_blob(const LaunchEnvironment& launch, std::span<const uint8_t> root_blob, size_t bytes) {
  const std::string who =
      "rendezvous: rank " + std::to_string(launch.rank) + " of " + std::to_string(launch.world_size);
  if (launch.rank == 0 && root_blob.size() != bytes)
    fail(who + ": the blob has " + std::to_string(root_blob.size()) + " bytes, expected " + std::to_string(bytes));
  if (bytes > 0xFFFFFFFFu) fail(who + ": a blob of " + std::to_string(bytes) + " bytes is too large");
  if (launch.world_size == 1) return std::vector<uint8_t>(root_blob.begin(), root_blob.end());
  const Clock::time_point deadline = Clock::now() + launch.timeout;
  return launch.rank == 0 ? serve_blob(launch, root_blob, deadline, who) : fetch_blob(launch, bytes, deadline, who);
}

}  // namespace fusekit::dp
