#pragma once
// Device scratch that a launcher borrows from its caller: `elems` floats at `data`, which
// the launcher may also use as storage of another type. Each launcher says how many floats
// it needs (its *_scratch_elems function); its contents are not kept between launches.
#include <cstddef>

namespace scalestudy::cuda {

struct Scratch {
  float* data = nullptr;
  size_t elems = 0;
};

}  // namespace scalestudy::cuda
