#pragma once
// Entry points of the libraries loaded at run time (CUPTI, NVML), so that the executable
// needs neither at link time, nor on a machine that does not use them.
#include <dlfcn.h>

namespace scalestudy {

// Sets fn to `symbol` in a dlopen'd library; false, and fn null, where it has none.
template <class Fn>
bool load_symbol(void* library, const char* symbol, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, symbol));
  return fn != nullptr;
}

}  // namespace scalestudy
