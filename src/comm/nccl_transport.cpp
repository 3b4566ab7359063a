#include "comm/nccl_transport.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/usage_error.h"

extern char** environ;

namespace scalestudy {
namespace {

bool same_text_ignoring_case(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

bool contains(const std::string& line, const char* part) { return line.find(part) != std::string::npos; }

// "P2P/IPC/read" -> "P2P", "NET/Socket/0" -> "NET/Socket", "NET/IBext_v8/2" ->
// "NET/IBext_v8": the transport, and for the network transport which network.
std::string transport_of(const std::string& via) {
  const size_t slash = via.find('/');
  const std::string kind = via.substr(0, slash);
  if (kind == "NET" && slash != std::string::npos) {
    const size_t next = via.find('/', slash + 1);
    return "NET/" + via.substr(slash + 1, next == std::string::npos ? std::string::npos : next - slash - 1);
  }
  if (same_text_ignoring_case(kind, "collnet")) return "CollNet";
  return kind;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

}  // namespace

std::map<std::string, std::string> environment_with_prefix(const std::string& prefix) {
  std::map<std::string, std::string> found;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text(*entry);
    const size_t equals = text.find('=');
    if (equals == std::string::npos || text.compare(0, prefix.size(), prefix) != 0) continue;
    found[text.substr(0, equals)] = text.substr(equals + 1);
  }
  return found;
}

std::vector<std::pair<std::string, std::string>> socket_emulation_settings(
    const std::map<std::string, std::string>& environment) {
  // The values the emulation needs, with the reason each is needed.
  struct Needed {
    const char* name;
    const char* value;
    const char* why;
  };
  static const Needed needed[] = {
      {"NCCL_P2P_DISABLE", "1", "NCCL would connect the GPUs directly (NVLink or PCIe)"},
      {"NCCL_SHM_DISABLE", "1", "NCCL would connect them through host shared memory"},
      {"NCCL_NET", "Socket", "NCCL would use another network than its TCP sockets"},
      {"NCCL_IB_DISABLE", "1", "NCCL would use InfiniBand or RoCE"},
  };
  std::vector<std::pair<std::string, std::string>> to_set;
  for (const Needed& variable : needed) {
    const auto set = environment.find(variable.name);
    if (set == environment.end()) {
      to_set.emplace_back(variable.name, variable.value);
      continue;
    }
    if (!same_text_ignoring_case(set->second, variable.value))
      throw UsageError("--link-emulation socket: the environment sets " + std::string(variable.name) + "=" +
                       one_line(set->second) + ", with which " + variable.why + "; the emulation needs " +
                       variable.name + "=" + variable.value + " (unset it, or leave --link-emulation out)");
  }
  if (environment.find("NCCL_SOCKET_IFNAME") == environment.end()) to_set.emplace_back("NCCL_SOCKET_IFNAME", "lo");
  return to_set;
}

void apply_socket_emulation() {
  for (const auto& [name, value] : socket_emulation_settings(environment_with_prefix("NCCL_")))
    setenv(name.c_str(), value.c_str(), 1);
}

std::set<std::string> parse_nccl_transports(const std::string& log) {
  std::set<std::string> transports;
  for (const std::string& line : lines_of(log)) {
    if (!contains(line, "NCCL INFO")) continue;
    if (contains(line, "NCCL INFO Channel")) {
      const size_t via = line.find(" via ");
      if (via == std::string::npos) continue;
      const size_t begin = via + 5;
      const size_t end = line.find_first_of(" \t\r", begin);
      const std::string route = line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
      if (!route.empty()) transports.insert(transport_of(route));
      continue;
    }
    // NVLink SHARP connects no channel pair by pair; NCCL says so when it sets up its
    // buffers for a communicator and when it connects its tree across nodes.
    if (contains(line, "NCCL INFO NVLS comm ") || contains(line, "NCCL INFO Connected NVLS")) transports.insert("NVLS");
    if (contains(line, "NCCL INFO Connected") && (contains(line, "CollNet") || contains(line, "collnet")))
      transports.insert("CollNet");
  }
  return transports;
}

std::string transport_list(const std::set<std::string>& transports) {
  std::string joined;
  for (const std::string& transport : transports) joined += (joined.empty() ? "" : ",") + transport;
  return joined.empty() ? kTransportNone : joined;
}

std::vector<std::string> nccl_warnings(const std::string& log) {
  std::vector<std::string> warnings;
  for (const std::string& line : lines_of(log))
    if (contains(line, " NCCL WARN ")) warnings.push_back(line);
  return warnings;
}

NcclLog& NcclLog::instance() {
  static NcclLog log;
  return log;
}

NcclLog::NcclLog() {
  const auto environment = environment_with_prefix("NCCL_");
  for (const char* users : {"NCCL_DEBUG", "NCCL_DEBUG_FILE"}) {
    if (environment.count(users)) {
      why_not_ = std::string(users) + " is set in the environment, so NCCL's log is the user's";
      return;
    }
  }
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/scalestudy-nccl-log-XXXXXX";
  fd_ = mkstemp(path.data());
  if (fd_ < 0) {
    why_not_ = "no private file for NCCL's log could be made in " + path.substr(0, path.rfind('/'));
    return;
  }
  path_ = path;
  // NCCL expands %h and %p in the name; mkstemp's letters hold neither.
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT", 1);
  setenv("NCCL_DEBUG_FILE", path_.c_str(), 1);
}

NcclLog::~NcclLog() {
  remove_name();
  if (fd_ >= 0) close(fd_);
}

size_t NcclLog::size() const {
  struct stat status {};
  if (fd_ < 0 || fstat(fd_, &status) != 0) return 0;
  return static_cast<size_t>(status.st_size);
}

std::string NcclLog::read_from(size_t offset) const {
  std::string text;
  if (fd_ < 0) return text;
  char buffer[4096];
  for (;;) {
    const ssize_t got = pread(fd_, buffer, sizeof(buffer), static_cast<off_t>(offset + text.size()));
    if (got <= 0) break;
    text.append(buffer, static_cast<size_t>(got));
  }
  return text;
}

void NcclLog::remove_name() {
  if (path_.empty()) return;
  unlink(path_.c_str());
  path_.clear();
}

}  // namespace scalestudy
