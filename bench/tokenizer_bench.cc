// Tokenizer throughput on the reference corpus (GSM8K questions plus
// hand-written Unicode, code and whitespace cases) with SmolLM2's vocabulary.
// Run with --benchmark_format=json for machine-readable output.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "coordinator/tokenizer/tokenizer.h"

namespace {

const std::filesystem::path kDataDir =
    std::filesystem::path(__FILE__).parent_path().parent_path() / "tests" / "data" / "tokenizer";

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    std::ifstream in(kDataDir / "smollm2_reference.jsonl");
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line).at("text"));
    return out;
  }();
  return texts;
}

const lazykv::Tokenizer& tokenizer(const std::string& pre) {
  static const lazykv::TokenizerSpec base =
      lazykv::Tokenizer::spec_from_hf_json((kDataDir / "smollm2" / "tokenizer.json").string());
  static const lazykv::Tokenizer smollm(base);
  static const lazykv::Tokenizer qwen2 = [] {
    lazykv::TokenizerSpec spec = base;
    spec.pre = "qwen2";
    return lazykv::Tokenizer(spec);
  }();
  return pre == "qwen2" ? qwen2 : smollm;
}

int64_t corpus_bytes() {
  int64_t bytes = 0;
  for (const std::string& text : corpus()) bytes += static_cast<int64_t>(text.size());
  return bytes;
}

void encode_corpus(benchmark::State& state, const std::string& pre) {
  const lazykv::Tokenizer& tok = tokenizer(pre);
  int64_t tokens = 0;
  for (auto _ : state) {
    for (const std::string& text : corpus()) {
      const std::vector<int32_t> ids = tok.encode(text);
      tokens += static_cast<int64_t>(ids.size());
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(state.iterations() * corpus_bytes());
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

void BM_EncodeSmolLM2(benchmark::State& state) { encode_corpus(state, "smollm"); }
void BM_EncodeQwen2PreTokenizer(benchmark::State& state) { encode_corpus(state, "qwen2"); }

void BM_StreamDecode(benchmark::State& state) {
  const lazykv::Tokenizer& tok = tokenizer("smollm");
  std::vector<int32_t> ids;
  for (const std::string& text : corpus()) {
    const std::vector<int32_t> part = tok.encode(text);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  for (auto _ : state) {
    lazykv::StreamDecoder decoder(tok);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += decoder.push(id).size();
    bytes += decoder.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["tokens_per_second"] = benchmark::Counter(
      static_cast<double>(state.iterations() * ids.size()), benchmark::Counter::kIsRate);
}

BENCHMARK(BM_EncodeSmolLM2)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeQwen2PreTokenizer)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_StreamDecode)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
