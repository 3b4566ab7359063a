#pragma once
// Which ranks hold a collective up. A rank whose collective has timed out takes a roll
// call: it asks every other rank, over point-to-point messages, how many control
// collectives it has entered. A rank that answers with fewer than the stuck one's number
// did not arrive; a rank that does not answer within the window is stopped (SIGSTOP, a
// frozen node) or gone. The answers come from a thread of each rank's own (the responder),
// so a rank answers whatever its main thread is doing: computing, waiting in another
// collective, or deadlocked.
//
// Why a roll call and not a one-sided window where each rank writes its count on rank 0:
//   - The window needs nothing from rank 0 only where the one-sided transport is real
//     memory access. In Open MPI 4.1, osc/sm is that on one node; across nodes over TCP
//     osc/rdma refuses to create the window on btl/tcp, and osc/pt2pt refuses
//     MPI_THREAD_MULTIPLE, which scalestudy needs. Where a transport emulates a put by
//     messages, MPI_Win_flush waits for the target to make progress, so a stopped rank 0
//     would hang every rank at its next control collective, where each should instead
//     reach its own deadline.
//   - A rank that is stopped inside a collective has written its count already: the window
//     shows it as arrived. Silence to a roll call shows it as stopped.
//   - The window is made by a collective call at start-up; the roll call needs none.
// What the roll call costs: a size check and a relaxed atomic increment per control
// collective, and a thread that tests one posted receive every 10 ms. Messages are sent
// only when a collective has timed out.
//
// The messages use MPI_COMM_WORLD with the tags below; no other point-to-point traffic of
// scalestudy uses that communicator.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace scalestudy {

inline constexpr int kRollCallQueryTag = 32001;
inline constexpr int kRollCallAnswerTag = 32002;

// How long a roll call waits for the answers: a live responder answers within its 10 ms
// period, and the window leaves rank 0 most of kPeerTimeoutMarginS (1 s) to mark the
// result file failed before the other ranks give up.
inline constexpr std::chrono::milliseconds kRollCallWindow{300};

// Counts a control collective on `comm` that this rank is about to enter. Returns its
// number (1, 2, ...) when comm spans every rank of the world, else 0: a collective of a
// subset of the ranks has no place in the count that all ranks share.
int64_t enter_control_collective(MPI_Comm comm);
// The number of the last control collective this rank entered.
int64_t control_collectives_entered();

// Starts this rank's responder (after MPI_Init), and stops it (before MPI_Finalize).
void start_roll_call_responder();
void stop_roll_call_responder();

struct RollCall {
  bool taken = false;            // false where this rank has no responder, or alone
  int caller = 0;                // the rank that took it
  std::vector<int> silent;       // gave no answer within the window: stopped or gone
  std::vector<int> behind;       // answered with a count below the collective's number
};

// Asks every other rank for its count and waits up to `window` for the answers. A rank is
// behind when its count is below `collective`.
RollCall take_roll_call(int64_t collective, std::chrono::milliseconds window = kRollCallWindow);

// Whether the caller is the rank to report a failure its roll call found: the lowest rank
// that responds. Where rank 0 is stopped, every other rank times out at about the same
// moment; one line from the lowest of them says it, and the others wait for its notice
// (defer_to_reporting_rank, core/check.h).
bool is_reporting_rank(const RollCall& roll_call);

// "rank 3 does not respond (stopped or gone)", "ranks 1-2 did not arrive (...)", or,
// where every rank answered in time, `all_answered`.
std::string describe_roll_call(const RollCall& roll_call, const std::string& all_answered);

// "rank 3", "ranks 2, 5-7": sorted, each run of consecutive ranks as a range.
std::string rank_list(std::vector<int> ranks);

}  // namespace scalestudy
