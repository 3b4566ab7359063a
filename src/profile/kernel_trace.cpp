#include "profile/kernel_trace.h"

#include <cstring>

#include "control/control_wait.h"
#include "control/mpi_check.h"

namespace scalestudy {
namespace {

// A trace as one byte string: the strings NUL-terminated after their counts, then the
// records' bytes.
void put_int(std::vector<char>& out, int64_t value) {
  const char* bytes = reinterpret_cast<const char*>(&value);
  out.insert(out.end(), bytes, bytes + sizeof(value));
}

void put_strings(std::vector<char>& out, const std::vector<std::string>& strings) {
  put_int(out, static_cast<int64_t>(strings.size()));
  for (const std::string& s : strings) out.insert(out.end(), s.c_str(), s.c_str() + s.size() + 1);
}

std::vector<char> pack(const RankTrace& trace) {
  std::vector<char> out;
  put_strings(out, {trace.device});
  put_int(out, trace.origin_ns);
  put_strings(out, trace.names);
  put_strings(out, trace.stream_names);
  put_int(out, static_cast<int64_t>(trace.records.size()));
  const char* records = reinterpret_cast<const char*>(trace.records.data());
  out.insert(out.end(), records, records + trace.records.size() * sizeof(TraceRecord));
  return out;
}

class Reader {
 public:
  Reader(const char* begin, const char* end) : at_(begin), end_(end) {}
  int64_t get_int() {
    int64_t value = 0;
    take(&value, sizeof(value));
    return value;
  }
  std::vector<std::string> get_strings() {
    std::vector<std::string> strings(static_cast<size_t>(get_int()));
    for (std::string& s : strings) {
      const char* nul = static_cast<const char*>(std::memchr(at_, '\0', static_cast<size_t>(end_ - at_)));
      SCALESTUDY_CHECK(nul != nullptr, "a gathered kernel trace is truncated");
      s.assign(at_, nul);
      at_ = nul + 1;
    }
    return strings;
  }
  void take(void* dst, size_t bytes) {
    SCALESTUDY_CHECK(static_cast<size_t>(end_ - at_) >= bytes, "a gathered kernel trace is truncated");
    // An empty array's data() may be null, which memcpy must not be given even for 0 bytes.
    if (bytes > 0) std::memcpy(dst, at_, bytes);
    at_ += bytes;
  }

 private:
  const char* at_;
  const char* end_;
};

RankTrace unpack(const char* begin, const char* end) {
  Reader reader(begin, end);
  RankTrace trace;
  trace.device = reader.get_strings().at(0);
  trace.origin_ns = reader.get_int();
  trace.names = reader.get_strings();
  trace.stream_names = reader.get_strings();
  trace.records.resize(static_cast<size_t>(reader.get_int()));
  reader.take(trace.records.data(), trace.records.size() * sizeof(TraceRecord));
  return trace;
}

}  // namespace

std::vector<RankTrace> gather_traces(MPI_Comm comm, const RankTrace& mine) {
  int rank = 0, size = 1;
  CHECK_MPI(MPI_Comm_rank(comm, &rank));
  CHECK_MPI(MPI_Comm_size(comm, &size));
  const std::vector<char> packed = pack(mine);
  SCALESTUDY_CHECK(packed.size() < (size_t{1} << 31), "a rank's kernel trace exceeds 2 GiB; trace fewer steps");
  const int count = static_cast<int>(packed.size());
  std::vector<int> counts(rank == 0 ? size : 0), offsets(counts.size());
  control_gather(&count, 1, MPI_INT, counts.data(), 0, comm, "kernel trace");
  size_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    SCALESTUDY_CHECK(total + static_cast<size_t>(counts[r]) < (size_t{1} << 31),
                     "the gathered kernel traces exceed 2 GiB; trace fewer steps");
    offsets[r] = static_cast<int>(total);
    total += static_cast<size_t>(counts[r]);
  }
  std::vector<char> all(total);
  control_gatherv({.send = packed.data(), .count = count, .type = MPI_BYTE, .recv = all.data(),
                   .counts = counts.data(), .offsets = offsets.data(), .root = 0},
                  comm, "kernel trace");
  std::vector<RankTrace> traces;
  for (size_t r = 0; r < counts.size(); ++r)
    traces.push_back(unpack(all.data() + offsets[r], all.data() + offsets[r] + counts[r]));
  return traces;
}

}  // namespace scalestudy
