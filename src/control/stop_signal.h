#pragma once
// The signals that end a run cleanly: SIGTERM (a Slurm time limit, scancel, a launcher
// that is killed), SIGINT (Ctrl-C) and SIGUSR1. The handler only records the signal; the
// run stops at its next safe point (the step's end, where the ranks agree to stop), or,
// where a rank stays blocked waiting for a collective, the wait ends the job
// (end_job_for_signal). A second signal of the same kind ends the process at once.
#include <chrono>
#include <string>

namespace scalestudy {

// Installs the handlers for SIGTERM, SIGINT and SIGUSR1, and the one that records
// SIGCONT (idempotent).
void install_stop_signal_handlers();
// The first stop signal received, or 0.
int stop_signal();
// Whether the process has been continued (SIGCONT) after a stop: a launcher that tears a
// job down wakes its stopped ranks so that they take its SIGTERM.
bool was_continued();
// "SIGTERM", "SIGINT", "SIGUSR1", else "signal N".
std::string signal_name(int signal);
// Why the run ended, for the result file: "terminated by SIGTERM (time limit, scancel or
// kill)", or, for a SIGTERM that came after a peer on this host ended without a word, that
// peer (control/peer_processes.h).
std::string stop_reason(int signal);
// The exit code of a run ended by a signal: 128 + the signal's number, as a shell reports it.
inline int stop_exit_code(int signal) { return 128 + signal; }

// How long a wait goes on after a stop signal before it ends the job: the peers, sent the
// same signal, still finish the collective and reach the step's end, where the run stops
// with every completed step kept. A wait that outlasts it is blocked on a peer.
inline constexpr std::chrono::milliseconds kStopGrace{500};

// Ends the job for a stop signal received while this rank waited in `where`: the abort
// hook marks the result file failed with stop_reason and where, and the job ends with
// stop_exit_code. A rank other than 0 that was stopped, and is woken by the teardown,
// ends without a line; a stopped rank 0 first waits as defer_to_reporting_rank_if_continued
// does (stop_signal.cpp says why).
[[noreturn]] void end_job_for_signal(int signal, const std::string& where);

// For a rank that was stopped and then woken, as a launcher's teardown does (SIGCONT, then
// SIGTERM): the rank that found it silent has ended the job and sent its notice, which
// waited while this rank was stopped. Waits briefly for that notice and, where it comes,
// ends quietly with its cause, which the result file records (defer_to_reporting_rank,
// core/check.h). Returns at once for a rank never stopped.
void defer_to_reporting_rank_if_continued();

}  // namespace scalestudy
