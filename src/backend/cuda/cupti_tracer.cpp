#include "backend/cuda/cupti_tracer.h"

#include <cuda.h>
#include <cupti_activity.h>
#include <cupti_result.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda/dynamic_symbol.h"
#include "core/check.h"
#include "profile/kernel_tag.h"

namespace scalestudy {
// CUPTI's own message for a CUptiResult; CUPTI is loaded at run time, so its message
// comes through the loaded library too.
std::string cupti_error_string(CUptiResult result);
}  // namespace scalestudy

#define CHECK_CUPTI(call) SCALESTUDY_CHECK_RESULT(call, CUPTI_SUCCESS, ::scalestudy::cupti_error_string)

namespace scalestudy {
namespace {

// The CUPTI entry points the tracer uses, resolved from the dlopen'd library.
struct CuptiApi {
  decltype(&cuptiGetResultString) get_result_string = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityPushExternalCorrelationId) push_external = nullptr;
  decltype(&cuptiActivityPopExternalCorrelationId) pop_external = nullptr;
  decltype(&cuptiGetStreamIdEx) stream_id = nullptr;
  decltype(&cuptiGetTimestamp) timestamp = nullptr;
};

// Where libcupti is looked for, in order: an explicit path, the loader's search (which
// honours LD_LIBRARY_PATH), then the toolkit this binary was built with.
std::vector<std::string> cupti_candidates() {
  std::vector<std::string> names;
  if (const char* path = std::getenv("SCALESTUDY_CUPTI_LIBRARY")) names.push_back(path);
  names.insert(names.end(), {"libcupti.so", "libcupti.so.13", "libcupti.so.12"});
#ifdef SCALESTUDY_CUPTI_BUILD_PATH
  names.push_back(SCALESTUDY_CUPTI_BUILD_PATH);
#endif
  return names;
}

template <class Fn>
void resolve(void* library, const char* symbol, Fn& fn) {
  if (!load_symbol(library, symbol, fn)) abort_job(__FILE__, __LINE__, std::string("dlsym ") + symbol, dlerror());
}

// Loaded once and never unloaded: CUPTI keeps threads and callbacks for the process's life.
const CuptiApi& cupti() {
  static const CuptiApi api = [] {
    void* library = nullptr;
    std::string tried;
    for (const std::string& name : cupti_candidates()) {
      library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (library) break;
      tried += "\n  " + name + ": " + dlerror();
    }
    if (!library)
      abort_job(__FILE__, __LINE__, "--profile-kernels: loading CUPTI",
                "libcupti was not found; set SCALESTUDY_CUPTI_LIBRARY to its path. Tried:" + tried);
    CuptiApi loaded;
    resolve(library, "cuptiGetResultString", loaded.get_result_string);
    resolve(library, "cuptiActivityRegisterCallbacks", loaded.register_callbacks);
    resolve(library, "cuptiActivityEnable", loaded.enable);
    resolve(library, "cuptiActivityDisable", loaded.disable);
    resolve(library, "cuptiActivityFlushAll", loaded.flush_all);
    resolve(library, "cuptiActivityGetNextRecord", loaded.next_record);
    resolve(library, "cuptiActivityPushExternalCorrelationId", loaded.push_external);
    resolve(library, "cuptiActivityPopExternalCorrelationId", loaded.pop_external);
    resolve(library, "cuptiGetStreamIdEx", loaded.stream_id);
    resolve(library, "cuptiGetTimestamp", loaded.timestamp);
    return loaded;
  }();
  return api;
}

constexpr CUpti_ExternalCorrelationKind kTagKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
// CUPTI hands out buffers of this size; 8-byte aligned as it requires.
constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kBufferAlignment = 8;

constexpr std::array<CUpti_ActivityKind, 6> kRecordedKinds = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    // Launch tags reach a kernel through its API call's correlation id: external
    // correlation records are emitted only for API records, so the API records must be on.
    // scalestudy launches its kernels through the runtime, and cuDNN (--attention-kernel
    // cudnn) through the driver API, so both are.
    CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

// The tag's external id is the category plus one, so that 0 never means a category.
void push_tag(KernelCategory category) {
  CHECK_CUPTI(cupti().push_external(kTagKind, static_cast<uint64_t>(category) + 1));
}
void pop_tag() {
  uint64_t last = 0;
  CHECK_CUPTI(cupti().pop_external(kTagKind, &last));
}
const KernelTagHooks kTagHooks = {push_tag, pop_tag};

std::string demangle(const char* name) {
  int status = 0;
  char* text = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || !text) return name;
  std::string out = text;
  std::free(text);
  return out;
}

const char* memcpy_name(uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy other";
  }
}

class CuptiTracer;
std::atomic<CuptiTracer*> active_tracer{nullptr};

class CuptiTracer final : public KernelTracer {
 public:
  explicit CuptiTracer(const std::string& device_name) {
    CuptiTracer* expected = nullptr;
    SCALESTUDY_CHECK(active_tracer.compare_exchange_strong(expected, this),
                     "only one kernel tracer may exist at a time in a process");
    static std::once_flag registered;
    std::call_once(registered, [] { CHECK_CUPTI(cupti().register_callbacks(buffer_requested, buffer_completed)); });
    trace_.device = device_name;
  }

  ~CuptiTracer() override {
    if (recording_) stop();
    active_tracer.store(nullptr);
  }

  void name_stream(const std::string& name, void* native_stream) override {
    uint32_t id = 0;
    CHECK_CUPTI(cupti().stream_id(nullptr, static_cast<CUstream>(native_stream), 0, &id));
    named_streams_[id] = name;
  }

  void start() override {
    if (recording_) return;
    if (!origin_set_) {
      uint64_t now = 0;
      CHECK_CUPTI(cupti().timestamp(&now));
      trace_.origin_ns = static_cast<int64_t>(now);
      origin_set_ = true;
    }
    for (CUpti_ActivityKind kind : kRecordedKinds) CHECK_CUPTI(cupti().enable(kind));
    set_kernel_tag_hooks(&kTagHooks);
    recording_ = true;
  }

  void collect(int64_t step) override {
    CHECK_CUPTI(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Pending& pending : pending_) {
      TraceRecord record = pending.record;
      record.step = step;
      record.start_ns -= trace_.origin_ns;
      record.end_ns -= trace_.origin_ns;
      record.name = name_index(pending.raw_name, record.kind);
      record.stream = stream_index(pending.stream_id);
      LaunchTag tag;
      if (auto found = external_ids_.find(pending.correlation); found != external_ids_.end() && found->second > 0) {
        tag.tagged = true;
        tag.category = static_cast<KernelCategory>(found->second - 1);
      }
      record.category = categorize(record.kind, trace_.names[static_cast<size_t>(record.name)], tag);
      trace_.records.push_back(record);
    }
    pending_.clear();
  }

  void stop() override {
    if (!recording_) return;
    set_kernel_tag_hooks(nullptr);
    for (CUpti_ActivityKind kind : kRecordedKinds) CHECK_CUPTI(cupti().disable(kind));
    recording_ = false;
  }

  RankTrace take_trace() override {
    std::lock_guard<std::mutex> lock(mutex_);
    RankTrace out = std::move(trace_);
    std::stable_sort(out.records.begin(), out.records.end(),
                     [](const TraceRecord& a, const TraceRecord& b) { return a.start_ns < b.start_ns; });
    trace_ = RankTrace{};
    trace_.device = out.device;
    trace_.origin_ns = out.origin_ns;
    name_indices_.clear();
    stream_indices_.clear();
    external_ids_.clear();
    return out;
  }

 private:
  // A record as CUPTI delivered it, before collect() names and categorises it.
  struct Pending {
    TraceRecord record;
    std::string raw_name;  // kernels: the mangled name; copies: the direction
    uint32_t stream_id = 0;
    uint32_t correlation = 0;
  };

  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
    SCALESTUDY_CHECK(*buffer != nullptr, "out of host memory for a CUPTI activity buffer");
    *size = kBufferBytes;
    *max_records = 0;  // as many as fit
  }

  static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
    if (CuptiTracer* tracer = active_tracer.load()) tracer->consume(buffer, valid_bytes);
    std::free(buffer);
  }

  void consume(uint8_t* buffer, size_t valid_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    CUpti_Activity* record = nullptr;
    while (true) {
      const CUptiResult status = cupti().next_record(buffer, valid_bytes, &record);
      if (status == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
      CHECK_CUPTI(status);
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          Pending& pending = add_pending(TraceRecordKind::kernel, kernel->start, kernel->end, 0,
                                         kernel->name ? kernel->name : "(unnamed kernel)", kernel->streamId,
                                         kernel->correlationId);
          pending.record.grid = {kernel->gridX, kernel->gridY, kernel->gridZ};
          pending.record.block = {kernel->blockX, kernel->blockY, kernel->blockZ};
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          add_pending(TraceRecordKind::memcpy, copy->start, copy->end, copy->bytes, memcpy_name(copy->copyKind),
                      copy->streamId, copy->correlationId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          add_pending(TraceRecordKind::memset, set->start, set->end, set->bytes, "memset", set->streamId,
                      set->correlationId);
          break;
        }
        case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
          const auto* external = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
          if (external->externalKind == kTagKind) external_ids_[external->correlationId] = external->externalId;
          break;
        }
        default: break;  // API records: only their correlation ids matter, via the above
      }
    }
  }

  Pending& add_pending(TraceRecordKind kind, uint64_t start_ns, uint64_t end_ns, uint64_t bytes,
                       const char* raw_name, uint32_t stream_id, uint32_t correlation) {
    Pending& pending = pending_.emplace_back();
    pending.record.kind = kind;
    pending.record.start_ns = static_cast<int64_t>(start_ns);
    pending.record.end_ns = static_cast<int64_t>(end_ns);
    pending.record.bytes = static_cast<int64_t>(bytes);
    pending.raw_name = raw_name;
    pending.stream_id = stream_id;
    pending.correlation = correlation;
    return pending;
  }

  int32_t name_index(const std::string& raw_name, TraceRecordKind kind) {
    auto [at, inserted] = name_indices_.try_emplace(raw_name, static_cast<int32_t>(trace_.names.size()));
    if (inserted) trace_.names.push_back(kind == TraceRecordKind::kernel ? demangle(raw_name.c_str()) : raw_name);
    return at->second;
  }

  int32_t stream_index(uint32_t stream_id) {
    auto [at, inserted] = stream_indices_.try_emplace(stream_id, static_cast<int32_t>(trace_.stream_names.size()));
    if (inserted) {
      auto named = named_streams_.find(stream_id);
      trace_.stream_names.push_back(named != named_streams_.end() ? named->second
                                                                  : "stream " + std::to_string(stream_id));
    }
    return at->second;
  }

  std::mutex mutex_;  // CUPTI may deliver buffers on its own thread
  bool recording_ = false, origin_set_ = false;
  RankTrace trace_;
  std::vector<Pending> pending_;
  std::unordered_map<uint32_t, uint64_t> external_ids_;  // correlation id -> tag
  std::unordered_map<std::string, int32_t> name_indices_;
  std::unordered_map<uint32_t, int32_t> stream_indices_;
  std::map<uint32_t, std::string> named_streams_;
};

}  // namespace

std::string cupti_error_string(CUptiResult result) {
  const char* text = nullptr;
  if (cupti().get_result_string(result, &text) != CUPTI_SUCCESS || !text)
    return "CUPTI error " + std::to_string(static_cast<int>(result));
  return text;
}

std::unique_ptr<KernelTracer> make_cupti_tracer(const std::string& device_name) {
  return std::make_unique<CuptiTracer>(device_name);
}

bool cupti_library_loaded() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcupti") != std::string::npos) return true;
  return false;
}

}  // namespace scalestudy
