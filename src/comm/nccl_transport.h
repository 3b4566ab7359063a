#pragma once
// Which links NCCL uses between the ranks, set and measured.
//
// Set: --link-emulation socket makes NCCL talk between the GPUs of one host as it talks
// between nodes, through its network transport over TCP sockets, by setting NCCL's
// documented variables before its first call (socket_emulation_settings).
//
// Measured: NCCL has no API that says which transport connects two ranks, but its INFO
// log names it in one line per channel connection, e.g.
//   host:1234:1240 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read
//   host:1234:1240 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] [send] via NET/Socket/0
//   host:1234:1240 [0] NCCL INFO Channel 00 : 2[1] -> 0[0] via SHM/direct/direct
// NcclLog sends that log (subsystem INIT, which these lines belong to) into a private
// file of this process, and parse_nccl_transports reads the transports from it. Where the
// user set NCCL_DEBUG or NCCL_DEBUG_FILE the log is theirs: nothing is captured, and the
// transport is recorded as unknown, never guessed.
//
// Nothing here calls NCCL, so the CPU build tests it; the NCCL communicator uses it.
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace scalestudy {

// What the result files record where the transport cannot be known, and where no
// connection was made (one rank, or the cpu backend).
inline constexpr const char* kTransportUnknown = "unknown";
inline constexpr const char* kTransportNone = "none";

// The variables of this process's environment whose names start with `prefix`.
std::map<std::string, std::string> environment_with_prefix(const std::string& prefix);

// The variables --link-emulation socket sets: P2P, shared memory and InfiniBand off, the
// socket network on, over the loopback interface. NCCL_NVLS_ENABLE is left as it is.
// A variable the user set to the value the emulation needs is kept; NCCL_SOCKET_IFNAME,
// where set, is kept whatever it names (any interface of the host reaches the others).
// Any other value set by the user contradicts the emulation: UsageError naming
// --link-emulation and the variable. Returns the (name, value) pairs still to set.
std::vector<std::pair<std::string, std::string>> socket_emulation_settings(
    const std::map<std::string, std::string>& environment);
// Sets them in this process; call before the first NCCL call.
void apply_socket_emulation();

// The transports named by the channel connection lines of an NCCL INFO log, as NCCL names
// them: "P2P", "SHM", "NET/<network>" (NET/Socket, NET/IB, a plugin's name), "CollNet",
// and "NVLS" where NCCL set up NVLink SHARP buffers. Lines of any other kind are skipped.
std::set<std::string> parse_nccl_transports(const std::string& log);
// "NET/Socket,P2P"; kTransportNone for an empty set.
std::string transport_list(const std::set<std::string>& transports);
// NCCL's WARN lines in a log, which a captured log would otherwise hide.
std::vector<std::string> nccl_warnings(const std::string& log);

// The process's capture of NCCL's log: one private file for the life of the process, since
// NCCL opens its log once, at its first message. The first call to instance() sets
// NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT and NCCL_DEBUG_FILE unless the user set
// NCCL_DEBUG or NCCL_DEBUG_FILE; call it before the first NCCL call.
class NcclLog {
 public:
  static NcclLog& instance();
  NcclLog(const NcclLog&) = delete;
  NcclLog& operator=(const NcclLog&) = delete;

  bool capturing() const { return fd_ >= 0; }
  // Why nothing is captured ("" while capturing).
  const std::string& why_not() const { return why_not_; }
  // The log's length so far: a communicator reads its own lines from here on.
  size_t size() const;
  // The log from `offset` to its end.
  std::string read_from(size_t offset) const;
  // Removes the file's name once NCCL has opened it (after its first message): the file
  // itself lives on while open, and vanishes with the process however it ends.
  void remove_name();

 private:
  NcclLog();
  ~NcclLog();
  int fd_ = -1;
  std::string path_, why_not_;
};

}  // namespace scalestudy
