#pragma once
// `scalestudy train --check`: a run's options resolved and validated as the run itself
// would on --check-ranks ranks, without MPI, a backend, or any file or folder made, so
// that a sweep can check every point before it writes or submits one.
#include "config/run_config.h"

namespace scalestudy {

// Throws UsageError naming the option that stops the run; prints one line and returns 0
// when it would start.
int run_train_check(RunConfig config);

}  // namespace scalestudy
