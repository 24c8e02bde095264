// libFuzzer target: chat templates come from model files, i.e. from outside.
// Arbitrary template source is parsed and rendered over a fixed conversation;
// lazykv::Error (syntax or runtime error) is the expected failure, anything
// else (another exception, a crash, a sanitizer report, a hang) is a bug.
// The same bytes are also read as a model's reply (thinking, tool calls),
// and as a tool call's arguments in the history.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "coordinator/chat/chat_template.h"
#include "coordinator/chat/reply_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const lazykv::ChatTemplate tmpl(source);
    const std::vector<lazykv::ChatMessage> messages = {
        {"system", "be brief"}, {"user", "hi {{ x }}"}, {"assistant", "<think>a</think>b"}, {"user", "again"}};
    volatile size_t sink = tmpl.render(messages, true, "<s>", "</s>").size();
    (void)sink;
  } catch (const lazykv::Error&) {
  }
  for (const lazykv::ToolCallFormat format : {lazykv::ToolCallFormat::kHermes, lazykv::ToolCallFormat::kLlama3}) {
    lazykv::ReplyText reply(lazykv::ReasoningFormat::kThink, size % 2 == 1, format);
    const size_t half = size / 2;
    volatile size_t sink = reply.push(source.substr(0, half)).content.size();
    sink = sink + reply.finish(source.substr(half)).calls.size();
    (void)sink;
  }
  try {
    const lazykv::ChatTemplate qwen(
        "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}{% endfor %}");
    std::vector<lazykv::ChatMessage> messages = {{"assistant", ""}};
    messages[0].tool_calls = {{"call_1", "f", source}};
    volatile size_t sink = qwen.render(messages, true).size();
    (void)sink;
  } catch (const lazykv::Error&) {
  }
  return 0;
}
