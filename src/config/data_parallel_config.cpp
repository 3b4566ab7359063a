#include "config/data_parallel_config.h"

namespace scalestudy {

const char* strategy_name(Strategy s) { return s == Strategy::ddp ? "ddp" : "zero2"; }

}  // namespace scalestudy
