#pragma once
// Launch tags: each op of a GPU backend opens a ScopedKernelTag with its category, so that
// a kernel tracer can tell which op launched each kernel (rule 4 of kernel_category.h).
// Without an active tracer a tag is one atomic load; nothing else is touched.
#include <atomic>

#include "profile/kernel_category.h"

namespace scalestudy {

// Installed by a kernel tracer while it records; push and pop bracket the launches of
// one op on the calling thread.
struct KernelTagHooks {
  void (*push)(KernelCategory category);
  void (*pop)();
};

// One slot for the whole program: an inline variable has one definition across the layers.
inline std::atomic<const KernelTagHooks*> installed_kernel_tag_hooks{nullptr};

inline void set_kernel_tag_hooks(const KernelTagHooks* hooks) {
  installed_kernel_tag_hooks.store(hooks, std::memory_order_release);
}
inline const KernelTagHooks* active_kernel_tag_hooks() {
  return installed_kernel_tag_hooks.load(std::memory_order_acquire);
}

class ScopedKernelTag {
 public:
  explicit ScopedKernelTag(KernelCategory category) : hooks_(active_kernel_tag_hooks()) {
    if (hooks_) hooks_->push(category);
  }
  ~ScopedKernelTag() {
    if (hooks_) hooks_->pop();
  }
  ScopedKernelTag(const ScopedKernelTag&) = delete;
  ScopedKernelTag& operator=(const ScopedKernelTag&) = delete;

 private:
  // The hooks that pushed, so the pop matches even if tracing stops inside the op.
  const KernelTagHooks* hooks_;
};

}  // namespace scalestudy
