#pragma once
// Which peers on this rank's host had already ended when a stop signal came. A launcher
// that loses a rank to SIGKILL or the out-of-memory killer tears the other ranks down with
// SIGTERM, and a result file that blamed that SIGTERM alone would name the wrong cause.
// Every rank's process id and host are gathered once at start-up; a rank told to stop
// looks up the peers that share its host (the only processes it can see).
#include <string>
#include <vector>

namespace scalestudy {

// Gathers every rank's host name and process id (a collective on MPI_COMM_WORLD, once,
// after MPI_Init).
void record_peer_processes();

// The ranks on this host, other than this one, whose process no longer runs (reaped or a
// zombie), in rank order. Empty before record_peer_processes.
std::vector<int> ended_peers_on_this_host();

// "rank 2 (pid 4711 on this host) had ended without a word (SIGKILL or the out-of-memory
// killer)", or "" where every peer on this host still runs.
std::string ended_peers_note();

}  // namespace scalestudy
