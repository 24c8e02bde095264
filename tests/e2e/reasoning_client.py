"""Reasoning content through the official OpenAI Python client against a
running `lazykv serve`. The default model does not think on its own, so a
guided_choice makes its reply a thinking block and an answer; the server's
--reasoning-parser decides what the client sees.

usage: reasoning_client.py BASE_URL MODEL split|off
  split (--reasoning-parser think): message.reasoning_content holds the
        thinking, content the answer; streamed as delta.reasoning_content;
        usage counts reasoning_tokens.
  off   (the default model's auto): the text comes back as written.
Exits non-zero on the first failed check.
"""
import sys

import openai

base_url, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
reply = "<think>\nTwelve times seven is eighty-four.\n</think>\n\n84"
request = dict(model=model, messages=[{"role": "user", "content": "What is 12*7?"}], max_tokens=64, temperature=0,
               extra_body={"guided_choice": [reply]})


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


whole = client.chat.completions.create(**request)
message = whole.choices[0].message
thinking = getattr(message, "reasoning_content", None)
pieces = {"reasoning_content": "", "content": ""}
usage = None
for chunk in client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}):
    usage = chunk.usage or usage
    for c in chunk.choices:
        pieces["reasoning_content"] += getattr(c.delta, "reasoning_content", None) or ""
        pieces["content"] += c.delta.content or ""
if mode == "split":
    check(thinking == "\nTwelve times seven is eighty-four.\n" and message.content == "84",
          f"reasoning_content and content apart: {thinking!r} / {message.content!r}")
    check(pieces == {"reasoning_content": thinking, "content": "84"}, f"streamed apart the same way: {pieces}")
    details = whole.usage.completion_tokens_details
    check(details is not None and 0 < details.reasoning_tokens < whole.usage.completion_tokens,
          f"usage counts reasoning tokens ({details})")
    check(usage.completion_tokens_details.reasoning_tokens == details.reasoning_tokens, "the stream's usage too")
else:
    check(thinking is None and message.content == reply, f"the parser off: the text as written ({message.content!r})")
    check(pieces == {"reasoning_content": "", "content": reply}, "streamed as written")
print("all reasoning checks passed")
