// Problems a check found, collected instead of thrown (validate reports
// every one). A reader given a ProblemSink reports each problem it can read
// past and goes on; without one it fails on the first, as it always did, with
// the same error (consolidate and reshard depend on that).
#pragma once

#include <string>
#include <vector>

#include "core/error.h"

namespace ckpt {

struct Problem {
  Problem() = default;
  Problem(ErrorCode code_, std::string message_, std::string file_ = "", int rank_ = -1, std::string tensor_ = "",
          std::string kind_ = "")
      : code(code_),
        message(std::move(message_)),
        file(std::move(file_)),
        rank(rank_),
        tensor(std::move(tensor_)),
        kind(std::move(kind_)) {}

  ErrorCode code = ErrorCode::kDataLoss;  // kUnsafe makes validate exit 3
  std::string message;                    // a whole sentence; names what `file`, `rank`, `tensor` say too
  std::string file;                       // the file at fault, when one is
  int rank = -1;                          // the rank that wrote it, when known
  std::string tensor;                     // the key (dotted path) concerned, when one is
  // What kind of problem it is when the code alone does not say: "WorldSize"
  // (the checkpoint is sound, but not of the world size asked for). Reports
  // show it instead of the code's name.
  std::string kind = {};
};

class ProblemSink {
 public:
  void report(Problem problem) {
    problem.message = printable_text(problem.message);  // names read from files: see printable_text
    problem.file = printable_text(problem.file);
    problem.tensor = printable_text(problem.tensor);
    problems_.push_back(std::move(problem));
  }
  // An error caught while reading: its code, its whole text (context
  // included) and its place; what the error's place does not know is taken
  // from the reporting layer's arguments.
  void report(const Error& error, std::string file = "", int rank = -1, std::string tensor = "") {
    const Place& at = error.place();
    report(Problem{error.code(), error.what(), at.file.empty() ? std::move(file) : at.file,
                   at.rank >= 0 ? at.rank : rank, at.tensor.empty() ? std::move(tensor) : at.tensor});
  }
  const std::vector<Problem>& problems() const { return problems_; }

  // Set by validate when its data pass will read every tensor's bytes
  // anyway (--finite, manifests): the CRC-32 of the records tensors are
  // read from is then checked there, beside that scan, and readers check
  // only the other records (and all of an archive they fail to decode).
  bool tensor_records_checked_later = false;

 private:
  std::vector<Problem> problems_;
};

// Reports to `sink`, or throws Error(problem.code, problem.message) when
// there is none: the one switch between fail-fast readers and collecting ones.
inline void report_or_fail(ProblemSink* sink, Problem problem) {
  if (!sink) fail(problem.code, std::move(problem.message));
  sink->report(std::move(problem));
}

// Runs fn; with a sink an ckpt::Error escaping it is reported (with the
// given file/rank/tensor) and false returned, without one it propagates.
template <class Fn>
bool run_reporting(ProblemSink* sink, const std::string& file, int rank, const std::string& tensor, Fn&& fn) {
  if (!sink) {
    fn();
    return true;
  }
  try {
    fn();
    return true;
  } catch (const Error& e) {
    sink->report(e, file, rank, tensor);
    return false;
  }
}

}  // namespace ckpt
