// The records file of `lazykv eval accuracy --records FILE`: JSON lines, a
// header naming the run, then one record per (configuration, problem), each
// written and flushed as its job ends. With --resume a stopped run goes on
// from the file: its records are reused and only the missing jobs run.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/accuracy.h"
#include "eval/datasets.h"

namespace lazykv::eval {

// The first line of a records file: what a resumed run must share with the
// run that wrote the file, since it changes the answers (the data set, the
// token limit, how budgets are set, the loop stop). The model is named by
// its name and by its file (name and size: two quantizations of one model
// share the name).
nlohmann::json accuracy_records_header(const std::string& model, const std::string& model_path,
                                       const AccuracyOptions& options, const std::string& activations);

// One record line: the problem's id and gold answer, the configuration and
// the outcome.
nlohmann::json accuracy_record_json(const AccuracyRecord& record, const std::vector<Problem>& problems);

class AccuracyRecordLog {
 public:
  // Starts `path` afresh with `header`; or, with resume and an existing file,
  // reads it first: its header must equal `header` (else Error(kInvalidArgument)
  // naming the field that differs), records of `problems` become resumed(),
  // records of other problems are kept in the file, and a torn last line (a
  // run killed while writing) is dropped. Any other malformed line, or a
  // record whose gold answer differs from the data set's, is an error naming
  // the line. The file is then rewritten through a temporary file, so it is
  // whole at every moment.
  AccuracyRecordLog(const std::string& path, const nlohmann::json& header, bool resume,
                    const std::vector<Problem>& problems);

  const std::vector<AccuracyRecord>& resumed() const { return resumed_; }
  bool dropped_torn_line() const { return dropped_torn_line_; }

  // Appends one record line and flushes it.
  void append(const AccuracyRecord& record);

 private:
  std::string path_;
  const std::vector<Problem>& problems_;
  std::vector<AccuracyRecord> resumed_;
  bool dropped_torn_line_ = false;
  std::ofstream out_;
};

}  // namespace lazykv::eval
