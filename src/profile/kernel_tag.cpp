#include "profile/kernel_tag.h"

namespace scalestudy {
namespace {
std::atomic<const KernelTagHooks*> installed_hooks{nullptr};
}  // namespace

void set_kernel_tag_hooks(const KernelTagHooks* hooks) { installed_hooks.store(hooks, std::memory_order_release); }

const KernelTagHooks* active_kernel_tag_hooks() { return installed_hooks.load(std::memory_order_acquire); }

}  // namespace scalestudy
