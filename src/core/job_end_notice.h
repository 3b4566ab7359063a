#pragma once
// The rank that ends the job tells the others first. The launcher then tears them down with
// SIGTERM, and each would otherwise report that signal as its own reason: the user would
// read one line per rank, the first of them naming the real cause and the rest misleading.
// A rank that finds a notice when it ends ends quietly, and rank 0 marks the result file
// failed with the reason that the notice carries.
//
// The notice is a point-to-point message on MPI_COMM_WORLD (tag kJobEndNoticeTag), sent
// without waiting: the sender is about to abort, and a stopped peer never receives it.
#include <string>

namespace scalestudy {

inline constexpr int kJobEndNoticeTag = 32003;  // after roll_call.h's tags

// Sends `reason` to every other rank, once per process; later calls send nothing.
void send_job_end_notice(const std::string& reason);

// The first notice that another rank sent, as "rank R: REASON", or "" when none has come.
std::string take_job_end_notice();

}  // namespace scalestudy
