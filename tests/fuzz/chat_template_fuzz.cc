// libFuzzer target: chat templates come from model files, i.e. from outside.
// Arbitrary template source is parsed and rendered over a fixed conversation;
// lazykv::Error (syntax or runtime error) is the expected failure, anything
// else (another exception, a crash, a sanitizer report, a hang) is a bug.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "coordinator/chat/chat_template.h"

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
  return 0;
}
