#pragma once
// The GEMM algorithms that --gemm-algos sustained chose, kept in a text file
// (--gemm-algos-file) so that later runs on the same kind of GPU take them without timing
// them again. A choice holds only on the GPU model and cuBLASLt version it was made with,
// which the file's first line names; a file made elsewhere is set aside, not read.
//
// The format, one entry a line after the header:
//   scalestudy gemm algorithms for <machine>
//   <shape><TAB><algorithm>
// Both fields are the callers' strings (kernels/gemm_sustained.cuh), free of tabs and line
// breaks. A later entry for a shape replaces an earlier one.
//
// Each store() rewrites the whole file through a temporary beside it and a rename, so a
// reader never sees half a file. Ranks that share one file each write what they hold:
// the last to write wins, and with one model on one kind of GPU they choose for the same
// shapes. Choosing takes tens of seconds a shape, so store() also reports each choice, to
// a stream where it is given one.
#include <map>
#include <optional>
#include <ostream>
#include <string>

namespace scalestudy {

class GemmChoiceFile {
 public:
  // Reads `path` where it exists and names `machine`. An empty path keeps nothing.
  GemmChoiceFile(std::string path, std::string machine);

  // Why the file's choices were set aside (another machine), or empty.
  const std::string& set_aside_because() const { return set_aside_because_; }
  std::optional<std::string> find(const std::string& shape) const;
  // Keeps the choice, rewrites the file (where there is one) and writes a line about it to
  // the progress stream (where there is one).
  void store(const std::string& shape, const std::string& algorithm);
  size_t size() const { return choices_.size(); }
  // Where store() reports each choice it keeps; null (the default): nowhere.
  void report_progress_to(std::ostream* progress) { progress_ = progress; }

 private:
  void read();
  void write() const;

  std::string path_;
  std::string machine_;
  std::string set_aside_because_;
  std::map<std::string, std::string> choices_;
  std::ostream* progress_ = nullptr;
  int stored_ = 0;  // by this object, that is, in this run
};

}  // namespace scalestudy
