#include "control/stop_signal.h"

#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>

#include "control/mpi_check.h"
#include "control/peer_processes.h"

namespace scalestudy {
namespace {

// How long a rank that receives SIGTERM waits for another rank's job-end notice; far
// longer than a message takes between the ranks of one job, and short beside the seconds
// that Slurm leaves between SIGTERM and SIGKILL.
constexpr std::chrono::milliseconds kTeardownNoticeWait{500};
// How long a rank woken after a stop waits for another rank's job-end notice before it
// records a cause of its own: a notice sent while it was stopped is read on the first poll.
constexpr std::chrono::milliseconds kContinuedRankNoticeWait{200};

// Whether this process is rank 0 of MPI_COMM_WORLD, or runs without MPI.
bool is_world_rank_zero() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return true;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank == 0;
}

volatile std::sig_atomic_t received_signal = 0;
volatile std::sig_atomic_t continued = 0;

extern "C" void record_continue(int) { continued = 1; }

extern "C" void record_stop_signal(int signal) {
  if (received_signal == signal) {
    // The second of its kind: the user insists, so the default action ends the process.
    std::signal(signal, SIG_DFL);
    std::raise(signal);
    return;
  }
  if (received_signal == 0) received_signal = signal;
}

}  // namespace

void install_stop_signal_handlers() {
  const auto install = [](int signal, void (*handler)(int), int flags) {
    struct sigaction action {};
    action.sa_handler = handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = flags;
    sigaction(signal, &action, nullptr);
  };
  // No SA_RESTART: a blocking system call returns EINTR, so a wait can see the signal.
  for (int signal : {SIGTERM, SIGINT, SIGUSR1}) install(signal, record_stop_signal, 0);
  // SA_RESTART: a continue is no reason for a blocking call to return early.
  install(SIGCONT, record_continue, SA_RESTART);
}

int stop_signal() { return received_signal; }

bool was_continued() { return continued != 0; }

std::string signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
  }
  return "signal " + std::to_string(signal);
}

std::string stop_reason(int signal) {
  const char* cause = signal == SIGTERM ? " (time limit, scancel or kill)"
                      : signal == SIGINT ? " (interrupted)"
                                         : "";
  // A launcher sends SIGTERM to the ranks left when one of them ended without a word; the
  // peer, not the signal, is then the cause.
  const std::string ended_peers = signal == SIGTERM ? ended_peers_note() : "";
  if (!ended_peers.empty()) return ended_peers + ", and the launcher then stopped this rank with SIGTERM";
  return "terminated by " + signal_name(signal) + cause;
}

void end_job_for_signal(int signal, const std::string& where) {
  // A launcher tears every rank down with SIGTERM once one rank has ended the job, and that
  // rank's notice, which names the real cause, may still be on its way: a rank that finds
  // it in time ends quietly instead of blaming the signal.
  const std::string reason = stop_reason(signal) + " while " + where;
  if (signal == SIGTERM && !is_world_rank_zero()) {
    defer_to_reporting_rank(kTeardownNoticeWait);
    // A stopped rank (SIGSTOP) is the one its peers found silent: the rank that reports
    // names it. The launcher's teardown wakes it (SIGCONT, then SIGTERM), and the notice
    // may never reach it, queued at the reporting rank behind the messages that this rank
    // could not take while stopped. Its own line would only blame the signal.
    if (was_continued()) end_job_quietly(reason + ", after it was stopped", stop_exit_code(signal));
  } else if (signal == SIGTERM) {
    // Rank 0 marks the result file failed in the time the launcher leaves before SIGKILL,
    // so it waits only where it was stopped itself. Without a notice it still ends the job
    // with its own line: a job that Slurm suspended and resumed, then ended, has no other
    // rank to name the signal.
    defer_to_reporting_rank_if_continued();
  }
  end_job(reason, stop_exit_code(signal));
}

void defer_to_reporting_rank_if_continued() {
  if (was_continued()) defer_to_reporting_rank(kContinuedRankNoticeWait);
}

}  // namespace scalestudy
