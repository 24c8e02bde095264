// Renders every (template, context) pair of tests/data/chat/expected.jsonl and
// compares byte for byte with Python jinja2's rendering
// (scripts/reference/make_chat_reference.py).
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "coordinator/chat/chat_template.h"

namespace lazykv {
namespace {

const std::string kDataDir = std::string(LAZYKV_TEST_DATA_DIR) + "/chat/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(ChatReference, MatchesPythonJinja) {
  std::ifstream lines(kDataDir + "expected.jsonl");
  ASSERT_TRUE(lines.good());
  std::map<std::string, ChatTemplate> templates;
  std::string line;
  int checked = 0, errors = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    auto record = nlohmann::ordered_json::parse(line);
    const std::string name = record["template"];
    auto it = templates.find(name);
    if (it == templates.end()) it = templates.emplace(name, ChatTemplate(read_file(kDataDir + name))).first;
    const auto& context = record["context"];
    SCOPED_TRACE(name + " with context " + context.dump().substr(0, 300));
    if (record.contains("error")) {
      try {
        it->second.render(context);
        ADD_FAILURE() << "expected error: " << record["error"];
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_EQ(std::string(e.what()), record["error"].get<std::string>());
      }
      ++errors;
    } else {
      EXPECT_EQ(it->second.render(context), record["output"].get<std::string>());
    }
    ++checked;
  }
  EXPECT_GE(checked, 60);
  EXPECT_GE(errors, 2);
  EXPECT_EQ(templates.size(), 7u);
}

// The engine's common entry point on the default model's template.
TEST(ChatReference, SmolLM2MessagesOverload) {
  ChatTemplate smollm(read_file(kDataDir + "smollm2.jinja"));
  std::string out = smollm.render({{"user", "Hi"}}, true);
  EXPECT_EQ(out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  std::string with_system = smollm.render({{"system", "S"}, {"user", "U"}}, false);
  EXPECT_EQ(with_system, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatReference, DeepSeekDropsReasoningFromHistory) {
  ChatTemplate r1(read_file(kDataDir + "deepseek-r1-distill-qwen.jinja"));
  std::string out = r1.render({{"user", "Q"}, {"assistant", "<think>secret</think>A"}, {"user", "Q2"}},
                              true, "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(out,
            "<｜begin▁of▁sentence｜><｜User｜>Q<｜Assistant｜>A<｜end▁of▁sentence｜><｜User｜>Q2"
            "<｜Assistant｜><think>\n");
}

}  // namespace
}  // namespace lazykv
