#pragma once
// Gathers every rank's step records to rank 0, keeps them for the summary, and (when an
// output path is given) writes them to the run's HDF5 file as docs/results-schema.md
// describes: under "<output>.partial" while running, flushed every --flush-every steps,
// renamed to <output> once marked complete or failed.
//
// Every rank constructs one and calls on_step and finish_* in the same order: they are
// collective over the control communicator. Construction takes the output's lock
// (results/output_lock.h) before any file of its name is touched, and throws UsageError on
// every rank where another run holds it.
#include <mpi.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "core/memory_estimate.h"
#include "profile/kernel_trace.h"
#include "results/provenance.h"
#include "results/run_summary.h"
#include "results/step_record.h"

namespace scalestudy {

// The memory preflight's figures of rank 0, which the file's header holds.
struct MemoryPreflightRecord {
  MemoryEstimate estimate;
  size_t available_bytes = 0;
};

class RunRecorder final : public StepObserver {
 public:
  // memory: written as root attributes with the header, where given (a training run).
  RunRecorder(const RunConfig& config, const RunIdentity& identity, MPI_Comm control,
              const std::optional<MemoryPreflightRecord>& memory = std::nullopt);
  ~RunRecorder() override;
  RunRecorder(const RunRecorder&) = delete;
  RunRecorder& operator=(const RunRecorder&) = delete;

  void on_step(const StepRecord& record) override;
  // Gathers every rank's kernel trace and writes it, with the tracing cost measured
  // from the recorded steps, as /kernel_trace. Collective; call after the last step and
  // before finish_complete.
  void record_kernel_trace(const RankTrace& mine, int first_step, int last_step);
  // Writes memory and the summary, marks the file complete once it reads back whole
  // (results/complete_mark.h), or failed where it does not (file_failure() says why), and
  // renames it. Returns the summary on rank 0 (other ranks get an empty one).
  RunSummary finish_complete(const MemoryReport& memory);
  // Marks the file failed with the reason and renames it. Needs only rank 0.
  void finish_failed(const std::string& reason);

  const std::vector<GatheredStep>& steps() const { return steps_; }
  const std::string& output() const { return output_; }
  // Rank 0, after finish_complete: "" when the file is complete, else why it is not.
  const std::string& file_failure() const { return file_failure_; }

 private:
  class File;
  RunConfig config_;
  RunIdentity identity_;
  MPI_Comm control_;
  int rank_ = 0, world_size_ = 1;
  std::string output_;
  std::string file_failure_;
  std::vector<GatheredStep> steps_;  // rank 0 only
  std::unique_ptr<File> file_;       // rank 0 only, when there is an output
};

// The canonical config hash of the result file: sorted key=value lines without output
// and repeat (which differ between the points of one series).
std::string result_config_hash(const RunConfig& config);

}  // namespace scalestudy
