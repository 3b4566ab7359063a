#pragma once
// One writer per result file, and per choice file of gemm-search. Before a run touches any
// file of its output's name, its writing rank takes an exclusive flock(2) on
// "<output>.lock", a file beside the output that holds the holder's host, pid and start
// time; a second run on the same output is refused with exit code 2, naming that holder,
// before it creates or truncates anything.
//
// flock is taken on an open descriptor, so the kernel releases it when the holder dies,
// however it dies: a lock file left by a killed run is free for the next one, which
// takes it and writes itself into it. The holder removes the file while it still holds
// the lock; a run that opened the old file in between finds, once it holds the lock,
// that the name now leads to another file (or none), and opens the name again.
//
// flock reaches across hosts where the file system passes locks to its server (local
// disks, NFS v4, Lustre mounted with -o flock). Where flock fails the run is refused,
// naming the file system's error: it cannot be kept from sharing its output. Lustre's
// -o localflock locks on one node only, so runs on different nodes are not kept apart.
#include <mpi.h>

#include <memory>
#include <string>

#include "config/output_path.h"

namespace scalestudy {

class OutputLock {
 public:
  // Takes the lock on `output` for this process, or throws UsageError naming the option
  // that gave the file (--output, or gemm-search's --gemm-algos-file) and the holder (host
  // and pid), or the lock file and why it cannot be locked.
  explicit OutputLock(const std::string& output, const std::string& option = "output");
  // Removes the lock file, then releases the lock.
  ~OutputLock();
  OutputLock(const OutputLock&) = delete;
  OutputLock& operator=(const OutputLock&) = delete;

  const std::string& output() const { return output_; }
  const std::string& path() const { return path_; }

 private:
  std::string output_, path_;
  int fd_ = -1;
};

// The lock file of a result file: "<output>.lock".
std::string output_lock_path(const std::string& output);

// Collective over `comm`: rank 0, which writes the file, takes the lock on check.output
// and checks the path again under it (config/output_path.h), so that a file another run
// completed after this one's options were checked is not replaced without --overwrite.
// Where rank 0 is refused, every rank throws UsageError (rank 0's names the cause).
// Returns rank 0's lock, and nullptr on the other ranks.
std::unique_ptr<OutputLock> lock_output(const OutputPathCheck& check, MPI_Comm comm);

}  // namespace scalestudy
