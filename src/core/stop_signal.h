#pragma once
// The signals that end a run cleanly: SIGTERM (a Slurm time limit, scancel, a launcher
// that is killed), SIGINT (Ctrl-C) and SIGUSR1. The handler only records the signal; the
// run stops at its next safe point (the step's end, where the ranks agree to stop), or,
// where a rank stays blocked waiting for a collective, the wait ends the job
// (end_job_for_signal). A second signal of the same kind ends the process at once.
#include <string>

namespace scalestudy {

// Installs the handlers for SIGTERM, SIGINT and SIGUSR1 (idempotent).
void install_stop_signal_handlers();
// The first stop signal received, or 0.
int stop_signal();
// "SIGTERM", "SIGINT", "SIGUSR1", else "signal N".
std::string signal_name(int signal);
// Why the run ended, for the result file: "terminated by SIGTERM (time limit or scancel)".
std::string stop_reason(int signal);
// The exit code of a run ended by a signal: 128 + the signal's number, as a shell reports it.
inline int stop_exit_code(int signal) { return 128 + signal; }

// Ends the job for a stop signal received while this rank waited in `where`: the abort
// hook marks the result file failed with stop_reason and where, and the job ends with
// stop_exit_code.
[[noreturn]] void end_job_for_signal(int signal, const std::string& where);

}  // namespace scalestudy
