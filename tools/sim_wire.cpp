// tools/sim_wire.cpp: the slow link between simulated hosts (tools/sim_hosts.sh), for kernels
// without the netem queue. Each host's network namespace has a TUN device; this one process
// reads every packet a host sends on it, holds it for the link's serialisation at the given
// rate (per sending host, as a capped uplink) plus the one-way delay, and writes it to the
// destination host's device. The destination is the last octet of the IPv4 destination
// address (host h has address SUBNET.(h + 1)). Packets queue without limit up to a cap, past
// which they are dropped (TCP resends them), as a router's buffer would.
//   sim_wire --delay-ms D --rate-mbit R --device NAME NETNS...
// Runs until killed. Needs root (setns, /dev/net/tun). No torch here.
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "sim_wire: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Opens the existing TUN device `name` inside network namespace `netns`.
int open_tun_in(const std::string& netns, const std::string& name) {
  const int home = open("/proc/self/ns/net", O_RDONLY);
  const int target = open(("/var/run/netns/" + netns).c_str(), O_RDONLY);
  if (home < 0 || target < 0) fail("cannot open the namespace " + netns);
  if (setns(target, CLONE_NEWNET) != 0) fail("setns " + netns);
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK);
  if (fd < 0) fail("/dev/net/tun");
  ifreq request{};
  request.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(request.ifr_name, name.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &request) != 0) fail("attach to " + name + " in " + netns);
  if (setns(home, CLONE_NEWNET) != 0) fail("setns back");
  close(home);
  close(target);
  return fd;
}

struct Packet {
  Clock::time_point due;
  int from = 0, to = 0;  // hosts; from for the sender's queue account
  std::vector<char> bytes;
};
struct Later {
  bool operator()(const Packet* a, const Packet* b) const { return a->due > b->due; }
};

}  // namespace

int main(int argc, char** argv) {
  double delay_ms = 0, rate_mbit = 0;
  std::string device = "wire0";
  std::vector<std::string> namespaces;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--delay-ms" && i + 1 < argc)
      delay_ms = std::atof(argv[++i]);
    else if (a == "--rate-mbit" && i + 1 < argc)
      rate_mbit = std::atof(argv[++i]);
    else if (a == "--device" && i + 1 < argc)
      device = argv[++i];
    else
      namespaces.push_back(a);
  }
  if (namespaces.size() < 2 || delay_ms < 0 || rate_mbit <= 0) {
    std::fprintf(stderr,
                 "usage: sim_wire --delay-ms D --rate-mbit R [--device NAME] NETNS NETNS...\n");
    return 2;
  }
  std::vector<int> fds;
  for (const std::string& ns : namespaces) fds.push_back(open_tun_in(ns, device));
  const auto delay = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(delay_ms));
  const double seconds_per_byte = 8.0 / (rate_mbit * 1e6);
  constexpr size_t kQueueCap = 64 << 20;  // bytes held per sending host before drops
  std::vector<Clock::time_point> uplink_free(fds.size(), Clock::now());
  std::vector<size_t> queued(fds.size(), 0);
  std::priority_queue<Packet*, std::vector<Packet*>, Later> in_flight;
  std::vector<pollfd> polls(fds.size());
  std::vector<char> buffer(1 << 16);
  std::fprintf(stderr, "sim_wire: %zu hosts, %.3f ms one way, %.0f Mbit/s per host\n", fds.size(),
               delay_ms, rate_mbit);
  for (;;) {
    // Sleep until a packet arrives or the next one is due, to the nanosecond (no spinning:
    // the ranks need the cores).
    timespec until{}, *timeout = nullptr;
    if (!in_flight.empty()) {
      const int64_t wait = std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::nanoseconds>(in_flight.top()->due - Clock::now())
              .count());
      until = {time_t(wait / 1000000000), long(wait % 1000000000)};
      timeout = &until;
    }
    for (size_t h = 0; h < fds.size(); ++h) polls[h] = {fds[h], POLLIN, 0};
    if (ppoll(polls.data(), polls.size(), timeout, nullptr) < 0 && errno != EINTR) fail("ppoll");
    const Clock::time_point now = Clock::now();
    for (size_t h = 0; h < fds.size(); ++h) {
      if (!(polls[h].revents & POLLIN)) continue;
      for (;;) {
        const ssize_t n = read(fds[h], buffer.data(), buffer.size());
        if (n <= 0) break;
        if (n < 20 || (buffer[0] >> 4) != 4) continue;  // IPv4 only
        const int to = int(static_cast<unsigned char>(buffer[19])) - 1;
        if (to < 0 || to >= int(fds.size()) || to == int(h)) continue;
        if (queued[h] + size_t(n) > kQueueCap) continue;  // the buffer is full: dropped
        // Serialised on the sender's uplink after what it queued before, then delayed.
        const Clock::time_point start = std::max(now, uplink_free[h]);
        uplink_free[h] = start + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(double(n) * seconds_per_byte));
        auto* packet =
            new Packet{uplink_free[h] + delay, int(h), to, {buffer.data(), buffer.data() + n}};
        queued[h] += size_t(n);
        in_flight.push(packet);
      }
    }
    while (!in_flight.empty() && in_flight.top()->due <= Clock::now()) {
      Packet* packet = in_flight.top();
      in_flight.pop();
      queued[size_t(packet->from)] -= packet->bytes.size();
      if (write(fds[size_t(packet->to)], packet->bytes.data(), packet->bytes.size()) < 0 &&
          errno != EAGAIN)
        fail("write");
      delete packet;
    }
  }
}
