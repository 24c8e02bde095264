#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "common/error.h"
#include "common/model_registry.h"

namespace lazykv {

LoadedModel load_model(const std::string& name_or_path, FilePages pages) {
  LoadedModel m;
  const std::string path = resolve_model_path(name_or_path);
  m.model = Model::load(path, pages);
  if (m.model->is_hf_dir()) {
    m.tokenizer = std::make_unique<Tokenizer>(Tokenizer::spec_from_hf_json(path + "/tokenizer.json"));
  } else {
    m.tokenizer = std::make_unique<Tokenizer>(m.model->tokenizer_spec());
  }
  if (m.tokenizer->n_vocab() > m.model->config().n_vocab) {
    throw Error(ErrorCode::kInvalidModel, "the tokenizer has " + std::to_string(m.tokenizer->n_vocab()) +
                                              " tokens but the model's embedding only " +
                                              std::to_string(m.model->config().n_vocab));
  }
  return m;
}

}  // namespace lazykv

#include "common/error.h"
#include "coordinator/server/prompt_encoder.h"

namespace lazykv {

std::vector<int32_t> encode_prompt(const LoadedModel& m, const std::string& text, bool chat, const std::string& system) {
  const PromptEncoder encoder(*m.tokenizer);
  if (!chat) return encoder.encode_text(text);
  if (!encoder.has_chat_template()) throw Error(ErrorCode::kInvalidArgument, "--chat: the model has no chat template");
  std::vector<ChatMessage> messages;
  if (!system.empty()) messages.push_back({"system", system});
  messages.push_back({"user", text});
  return encoder.encode_chat(messages);
}

std::vector<int32_t> text_file_tokens(const LoadedModel& m, const std::string& path, int64_t max_tokens,
                                      const std::string& command) {
  if (path.empty()) throw Error(ErrorCode::kInvalidArgument, command + ": --input is required");
  if (max_tokens < 1) throw Error(ErrorCode::kInvalidArgument, command + ": --max-tokens must be at least 1");
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kNotFound, command + ": cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<int32_t> tokens = m.tokenizer->encode(text.str(), false);
  tokens.resize(size_t(std::min<int64_t>({int64_t(tokens.size()), max_tokens, m.model->config().n_ctx_train})));
  return tokens;
}

}  // namespace lazykv

namespace lazykv {

cpu::ActivationPrecision parse_activations(const std::string& value) {
  if (value == "f32") return cpu::ActivationPrecision::kF32;
  if (value == "int8") return cpu::ActivationPrecision::kInt8;
  throw Error(ErrorCode::kInvalidArgument, "--activations must be f32 or int8, got '" + value + "'");
}

}  // namespace lazykv
