#include "core/gemm_choice_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <utility>

#include "core/check.h"

namespace scalestudy {
namespace {

constexpr const char* kHeaderPrefix = "scalestudy gemm algorithms for ";

bool printable_field(const std::string& text) {
  return !text.empty() && text.find_first_of("\t\n\r") == std::string::npos;
}

}  // namespace

GemmChoiceFile::GemmChoiceFile(std::string path, std::string machine)
    : path_(std::move(path)), machine_(std::move(machine)) {
  SCALESTUDY_CHECK(printable_field(machine_), "gemm algorithms file: the machine must be one line");
  if (!path_.empty()) read();
}

void GemmChoiceFile::read() {
  std::ifstream in(path_);
  if (!in) return;  // not made yet
  std::string line;
  SCALESTUDY_CHECK(std::getline(in, line) && line.rfind(kHeaderPrefix, 0) == 0,
                   "--gemm-algos-file " + path_ + ": line 1 must be \"" + kHeaderPrefix + "<machine>\"");
  const std::string machine = line.substr(std::string(kHeaderPrefix).size());
  if (machine != machine_) {
    set_aside_because_ = path_ + " was made for " + machine + ", this is " + machine_;
    return;
  }
  for (int number = 2; std::getline(in, line); ++number) {
    const size_t tab = line.find('\t');
    SCALESTUDY_CHECK(tab != std::string::npos && tab > 0 && tab + 1 < line.size() &&
                         line.find('\t', tab + 1) == std::string::npos,
                     "--gemm-algos-file " + path_ + ": line " + std::to_string(number) +
                         " must be <shape><TAB><algorithm>");
    choices_[line.substr(0, tab)] = line.substr(tab + 1);
  }
}

std::optional<std::string> GemmChoiceFile::find(const std::string& shape) const {
  const auto found = choices_.find(shape);
  if (found == choices_.end()) return std::nullopt;
  return found->second;
}

void GemmChoiceFile::store(const std::string& shape, const std::string& algorithm) {
  SCALESTUDY_CHECK(printable_field(shape) && printable_field(algorithm),
                   "gemm algorithms file: a shape and an algorithm are one field each");
  choices_[shape] = algorithm;
  if (!path_.empty()) write();
  ++stored_;
  if (progress_ != nullptr)
    *progress_ << "gemm algorithm " << stored_ << " chosen under sustained load: " << shape << ": " << algorithm
               << std::endl;
}

void GemmChoiceFile::write() const {
  // Unique to this process among the ranks of every node that may share the file.
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string temporary = path_ + ".tmp." + host + "." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    SCALESTUDY_CHECK(static_cast<bool>(out), "--gemm-algos-file: cannot write " + temporary);
    out << kHeaderPrefix << machine_ << "\n";
    for (const auto& [shape, algorithm] : choices_) out << shape << "\t" << algorithm << "\n";
    out.flush();
    SCALESTUDY_CHECK(static_cast<bool>(out), "--gemm-algos-file: writing " + temporary + " failed");
  }
  SCALESTUDY_CHECK(std::rename(temporary.c_str(), path_.c_str()) == 0,
                   "--gemm-algos-file: cannot rename " + temporary + " to " + path_);
}

}  // namespace scalestudy
