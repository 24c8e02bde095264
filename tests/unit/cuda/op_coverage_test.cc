// The cross-backend cases of the CUDA ops: one row per op that
// kernels/cuda/ops.h declares, naming the test that runs it on the GPU
// against the CPU kernel (or its exact definition) and why its tolerance is
// what it is. Runs in every CUDA build, GPU or not (CI has none): an op
// added to ops.h without a row, or a row naming a test this binary lacks,
// fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace lazykv::cuda {
namespace {

struct OpCase {
  const char* op;
  const char* test;       // suite.name in this binary; empty: not a computation
  const char* tolerance;  // and why
};

constexpr OpCase kOpCases[] = {
    {"cuda_device_available", "", "a device query: whether the GPU cases run at all"},
    {"usable_device_count", "CudaForwardTest.BadInputIsRefusedAndTheCacheStaysUsable",
     "a device query: a device past the count is refused"},
    {"measure_copy_rate", "", "a measurement the benchmarks divide by, not a computation"},
    {"rms_norm", "CudaOpsTest.RmsNormMatchesCpu", "1e-5 relative: the sum of squares in another order"},
    {"add_rms_norm", "CudaOpsTest.AddRmsNormEqualsAddThenRmsNorm", "exact: the bits of add_inplace then rms_norm"},
    {"silu_mul", "CudaOpsTest.SiluMulMatchesCpu", "2e-6 relative: expf and std::exp each within about an ulp"},
    {"add_inplace", "CudaOpsTest.AddAndToF16MatchCpuExactly", "exact: one rounding"},
    {"add_rows", "CudaOpsTest.AddRowsScatterPagesAndScatterKvRows", "exact: one rounding"},
    {"to_f16", "CudaOpsTest.AddAndToF16MatchCpuExactly", "exact: round to nearest even on both"},
    {"rope", "CudaOpsTest.RopeMatchesCpuBothStyles", "2e-5: sinf/cosf and libm a few ulp apart at ~3000 rad"},
    {"rope_qk_to_f16", "CudaOpsTest.RopeQkToF16EqualsTheSeparateOps", "exact: the bits of rope, rope, to_f16, to_f16"},
    {"dequantize_supported", "CudaOps.RejectsUnsupportedArgumentsBeforeLaunching", "a predicate: the types refused"},
    {"dequantize_rows", "CudaOpsTest.DequantizeRowsMatchesCpu", "1e-6: d·q - m may be one FMA (a rounding fewer)"},
    {"matmul_supported", "CudaOps.RejectsUnsupportedArgumentsBeforeLaunching", "a predicate: the types refused"},
    {"tiled_bytes", "CudaOpsTest.MatmulMatchesCpu", "sizes the tiled weights every matmul case reads"},
    {"tile_weights", "CudaOpsTest.MatmulMatchesCpu", "a layout: a wrong one is ~100% off in every matmul case"},
    {"matmul", "CudaOpsTest.MatmulMatchesCpu",
     "5e-5 of Σ|w||x| against the exact product; 1e-4 RMS against cpu::matmul (summation order)"},
    {"matmul_shared_input", "CudaOpsTest.MatmulSharedInputEqualsSeparateMatmuls", "exact: the same per-tile sums"},
    {"quantize_q8", "CudaOpsTest.QuantizeQ8MatchesTheHost", "exact: the host's f32 operations"},
    {"matmul_q8_supported", "CudaOpsTest.MatmulQ8SharedInputEqualsSeparateLaunchesAndRefusesOtherTypes",
     "a predicate: the types refused"},
    {"matmul_q8_shared_input", "CudaOpsTest.MatmulQ8MatchesTheExactProductOfQuantizedActivations",
     "5e-5 of Σ|w||x̂| (f32 rounding of the block terms); 2% RMS against f32 activations (quantization)"},
    {"scatter_pages", "CudaOpsTest.AddRowsScatterPagesAndScatterKvRows", "exact: bytes moved"},
    {"scatter_kv_rows", "CudaOpsTest.AddRowsScatterPagesAndScatterKvRows", "exact: halves moved"},
    {"attention_group", "CudaOpsTest.AttentionGroupMatchesCpu",
     "1e-5 probabilities, 2e-5 outputs: exponentials and sums in another order"},
    {"attention_scratch_floats", "CudaOpsTest.AttentionUnitsMatchCpuPerUnit",
     "sizes the scratch of every attention_units case"},
    {"attention_units", "CudaOpsTest.AttentionUnitsMatchCpuPerUnit",
     "1e-5 probabilities, 2e-5 outputs, per token of each unit: as attention_group"},
};

// The free functions ops.h declares: a return type at the start of a line
// (ops.h's style), then the name and its parenthesis.
std::set<std::string> declared_ops() {
  std::ifstream in(std::string(LAZYKV_TEST_DATA_DIR) + "/../../kernels/cuda/ops.h");
  std::stringstream text;
  text << in.rdbuf();
  const std::string source = text.str();
  std::set<std::string> ops;
  const std::regex declaration(R"((?:^|\n)(?:void|bool|int|int32_t|int64_t|size_t|double|float)\*? ([a-z_0-9]+)\()");
  for (auto it = std::sregex_iterator(source.begin(), source.end(), declaration); it != std::sregex_iterator(); ++it) {
    ops.insert((*it)[1]);
  }
  return ops;
}

std::set<std::string> registered_tests() {
  std::set<std::string> tests;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      tests.insert(std::string(suite.name()) + "." + suite.GetTestInfo(t)->name());
    }
  }
  return tests;
}

TEST(CudaOpCoverage, EveryOpInOpsHHasACrossBackendCase) {
  const std::set<std::string> ops = declared_ops();
  ASSERT_GE(ops.size(), 20u) << "ops.h not found or not parsed";
  const std::set<std::string> tests = registered_tests();
  std::set<std::string> rows;
  for (const OpCase& c : kOpCases) {
    rows.insert(c.op);
    EXPECT_TRUE(ops.count(c.op)) << c.op << ": a row for an op ops.h does not declare";
    EXPECT_TRUE(std::string(c.test).empty() || tests.count(c.test)) << c.op << ": no test " << c.test;
    EXPECT_NE(std::string(c.tolerance), "") << c.op;
  }
  for (const std::string& op : ops) EXPECT_TRUE(rows.count(op)) << op << " (ops.h) has no cross-backend case";
}

}  // namespace
}  // namespace lazykv::cuda
