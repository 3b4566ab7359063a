#include "control/peer_processes.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <string>

#include "control/mpi_check.h"
#include "control/roll_call.h"

namespace scalestudy {
namespace {

struct PeerProcess {
  std::array<char, 256> host{};
  int32_t pid = 0;
};

std::vector<PeerProcess>& peers() {
  static std::vector<PeerProcess> table;
  return table;
}
int& own_rank() {
  static int rank = -1;
  return rank;
}

PeerProcess this_process() {
  PeerProcess process;
  gethostname(process.host.data(), process.host.size() - 1);
  process.pid = static_cast<int32_t>(getpid());
  return process;
}

// Whether `pid` no longer runs: gone (reaped by its launcher), or a zombie not yet reaped.
bool has_ended(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  // The state follows the command name, which is in parentheses and may hold spaces.
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

}  // namespace

void record_peer_processes() {
  int size = 1;
  CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &own_rank()));
  CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  const PeerProcess mine = this_process();
  peers().assign(static_cast<size_t>(size), PeerProcess{});
  CHECK_MPI(MPI_Allgather(&mine, sizeof(PeerProcess), MPI_BYTE, peers().data(), sizeof(PeerProcess),
                          MPI_BYTE, MPI_COMM_WORLD));
}

std::vector<int> ended_peers_on_this_host() {
  std::vector<int> ended;
  const auto& table = peers();
  if (own_rank() < 0) return ended;
  const auto& host = table[static_cast<size_t>(own_rank())].host;
  for (int rank = 0; rank < static_cast<int>(table.size()); ++rank) {
    const PeerProcess& peer = table[static_cast<size_t>(rank)];
    if (rank == own_rank() || peer.host != host) continue;
    if (has_ended(static_cast<pid_t>(peer.pid))) ended.push_back(rank);
  }
  return ended;
}

std::string ended_peers_note() {
  const std::vector<int> ended = ended_peers_on_this_host();
  if (ended.empty()) return "";
  std::string pids;
  for (int rank : ended) {
    pids += (pids.empty() ? "" : ", ") + std::to_string(peers()[static_cast<size_t>(rank)].pid);
  }
  const bool one = ended.size() == 1;
  return rank_list(ended) + " (pid" + (one ? " " : "s ") + pids + " on this host) had ended " +
         "without a word (SIGKILL or the out-of-memory killer)";
}

}  // namespace scalestudy
