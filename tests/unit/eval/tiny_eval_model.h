// For the eval tests: a tiny random model and its tokenizer, loaded once per
// test suite, and batched runners over it.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "eval/batch_runner.h"
#include "tests/unit/tiny_model_fixture.h"

namespace lazykv::eval {

class TinyEvalModelTest : public ::testing::Test {
 protected:
  // From a suite's SetUpTestSuite; `name` keeps concurrent binaries' files apart.
  static void load(const std::string& name, int n_ctx) {
    TinyModelSpec spec;
    spec.n_ctx = n_ctx;
    TinyModel tiny = load_tiny_model(name, spec);
    model_ = tiny.model.release();
    tokenizer_ = tiny.tokenizer.release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
    tokenizer_ = nullptr;
    model_ = nullptr;
  }

  static BatchRunner runner(int batch) {
    BatchRunnerOptions options;
    options.batch = batch;
    options.threads = 2;
    return BatchRunner(*model_, *tokenizer_, options);
  }

  static inline Model* model_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
};

}  // namespace lazykv::eval
