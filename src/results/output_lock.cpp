#include "results/output_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "config/command_options.h"
#include "control/mpi_check.h"
#include "control/control_wait.h"
#include "core/usage_error.h"
#include "results/provenance.h"

namespace scalestudy {
namespace {

// A holder writes itself into the file just after it takes the lock; a run refused in
// that instant waits this long for the line before it names the holder as unknown.
constexpr auto kHolderWait = std::chrono::seconds(1);
constexpr auto kHolderPoll = std::chrono::milliseconds(20);
// Each retry follows a holder that removed the file between our open and our lock; only
// a stream of runs starting and ending on one output could need more than a few.
constexpr int kMaxOpenAttempts = 100;

bool same_file(int fd, const std::string& path) {
  struct stat held {}, named {};
  if (fstat(fd, &held) != 0 || stat(path.c_str(), &named) != 0) return false;
  return held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

std::string read_holder(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + kHolderWait;
  while (true) {
    char text[512] = {0};
    const ssize_t got = pread(fd, text, sizeof(text) - 1, 0);
    std::string line = got > 0 ? std::string(text, static_cast<size_t>(got)) : "";
    line = line.substr(0, line.find('\n'));
    if (!line.empty()) return line;
    if (std::chrono::steady_clock::now() >= deadline) return "a run that has not yet written its host and pid";
    std::this_thread::sleep_for(kHolderPoll);
  }
}

bool write_holder(int fd) {
  const std::string line =
      "pid " + std::to_string(getpid()) + " on host " + host_name() + ", since " + utc_now() + "\n";
  return ftruncate(fd, 0) == 0 && pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
}

// Refuses the output, naming why its lock file cannot be locked: held by another run (named
// by the line it wrote), or a file system without flock.
[[noreturn]] void refuse(int fd, int error, const std::string& option, const std::string& output,
                         const std::string& path) {
  const std::string holder = error == EWOULDBLOCK ? read_holder(fd) : "";
  close(fd);
  if (error == EWOULDBLOCK)
    bad_value(option, output, "is being written by another run (" + holder + "; lock file " + path + ")");
  bad_value(option, output,
            "its lock file " + path + " cannot be locked (flock: " + std::strerror(error) +
                "): on a file system without locks a second run could write the same file; write the output "
                "where flock works (a local disk, NFS v4, Lustre mounted with -o flock)");
}

// The descriptor of the lock file, opened and locked, or -1 where the file was removed by
// its holder between the open and the lock (the name then leads to another file, or none).
int open_locked(const std::string& option, const std::string& output, const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) bad_value(option, output, "cannot open its lock file " + path + " (" + std::strerror(errno) + ")");
  int locked = -1;
  do locked = flock(fd, LOCK_EX | LOCK_NB);
  while (locked != 0 && errno == EINTR);
  if (locked != 0) refuse(fd, errno, option, output, path);
  if (same_file(fd, path)) return fd;
  close(fd);
  return -1;
}

}  // namespace

std::string output_lock_path(const std::string& output) { return output + ".lock"; }

OutputLock::OutputLock(const std::string& output, const std::string& option)
    : output_(output), path_(output_lock_path(output)) {
  for (int attempt = 0; attempt < kMaxOpenAttempts && fd_ < 0; ++attempt) fd_ = open_locked(option, output_, path_);
  if (fd_ < 0)
    bad_value(option, output, "its lock file " + path_ + " was replaced " + std::to_string(kMaxOpenAttempts) +
                                  " times while this run tried to lock it");
  if (!write_holder(fd_)) {
    const int error = errno;
    unlink(path_.c_str());
    close(fd_);
    bad_value(option, output, "cannot write its lock file " + path_ + " (" + std::strerror(error) + ")");
  }
}

OutputLock::~OutputLock() {
  // Only while the name still leads to the locked file: a file put there by another run
  // (after this one's was removed by hand) is that run's to remove.
  if (same_file(fd_, path_)) unlink(path_.c_str());
  close(fd_);
}

std::unique_ptr<OutputLock> lock_output(const OutputPathCheck& check, MPI_Comm comm) {
  int rank = 0;
  CHECK_MPI(MPI_Comm_rank(comm, &rank));
  std::unique_ptr<OutputLock> lock;
  std::string refusal;
  if (rank == 0) {
    try {
      lock = std::make_unique<OutputLock>(check.output);
      check_output_path(check);
    } catch (const UsageError& error) {
      lock.reset();
      refusal = error.what();
    }
  }
  const int refused = refusal.empty() ? 0 : 1;
  int any_refused = 0;
  control_allreduce(&refused, &any_refused, 1, MPI_INT, MPI_MAX, comm, "output lock");
  if (any_refused) throw UsageError(rank == 0 ? refusal : "rank 0 could not lock the output");
  return lock;
}

}  // namespace scalestudy
