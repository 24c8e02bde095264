"""The official OpenAI Python client against a running `lazykv serve`.

usage: openai_client_test.py BASE_URL MODEL [API_KEY]
Exits non-zero on the first failed check (each check names what it tests).
"""
import collections
import json
import re
import sys
import urllib.request

import openai

base_url, model = sys.argv[1], sys.argv[2]
api_key = sys.argv[3] if len(sys.argv) > 3 else "unused"
client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


models = client.models.list()
check([m.id for m in models.data] == [model], "models.list names the served model")
max_model_len = models.data[0].to_dict().get("max_model_len", 0)
check(max_model_len > 0, f"the model card has max_model_len ({max_model_len})")


def post(path, body):
    request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


# vLLM's /tokenize and /detokenize.
tokenized = post("/tokenize", {"model": model, "prompt": "Hello world", "add_special_tokens": False,
                               "return_token_strs": True})
check(tokenized["count"] == len(tokenized["tokens"]) > 0 and tokenized["max_model_len"] == max_model_len,
      f"/tokenize: {tokenized['tokens']}")
check("".join(tokenized["token_strs"]) == "Hello world", "/tokenize token_strs join to the text")
check(post("/detokenize", {"tokens": tokenized["tokens"]})["prompt"] == "Hello world", "/detokenize inverts /tokenize")

# Chat, whole.
chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0)
check(chat.object == "chat.completion", "chat object")
check(chat.choices[0].message.role == "assistant", "assistant role")
check(isinstance(chat.choices[0].message.content, str) and chat.choices[0].message.content, "chat content")
check(chat.choices[0].finish_reason in ("stop", "length"), "chat finish_reason")
check(chat.usage.prompt_tokens > 0 and 0 < chat.usage.completion_tokens <= 16, "chat usage")
check(chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens, "total_tokens")

# Greedy is deterministic: the same request twice gives the same text; streamed
# text equals the whole response's text.
again = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0)
check(again.choices[0].message.content == chat.choices[0].message.content, "greedy chat is deterministic")
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=16, temperature=0,
    stream=True, stream_options={"include_usage": True})
pieces, finish, usage, roles, objects = [], None, None, [], set()
for chunk in stream:
    objects.add(chunk.object)
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.role:
            roles.append(c.delta.role)
        if c.delta.content:
            pieces.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
check(objects == {"chat.completion.chunk"}, "every chunk is a chat.completion.chunk")
check(roles == ["assistant"], "streamed role once")
check("".join(pieces) == chat.choices[0].message.content, "streamed chat text equals the whole response")
check(finish == chat.choices[0].finish_reason, "streamed finish_reason")
check(usage is not None and usage.completion_tokens == chat.usage.completion_tokens, "stream usage chunk")

# Completions, whole and streamed, n and logprobs.
comp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
check(comp.object == "text_completion" and comp.choices[0].text, "completion text")
streamed = "".join(c.choices[0].text for c in client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True) if c.choices)
check(streamed == comp.choices[0].text, "streamed completion equals the whole one")
many = client.completions.create(model=model, prompt=["One, two,", "Red, green,"], max_tokens=4, n=2,
                                 temperature=0.8, seed=7)
check(sorted(c.index for c in many.choices) == [0, 1, 2, 3], "two prompts x n=2 give four choices")
lp = client.completions.create(model=model, prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2)
check(len(lp.choices[0].logprobs.tokens) == len(lp.choices[0].logprobs.token_logprobs) > 0, "completion logprobs")
check(all(x <= 0 for x in lp.choices[0].logprobs.token_logprobs), "log-probabilities are <= 0")
check(all(len(t) == 2 for t in lp.choices[0].logprobs.top_logprobs), "two alternatives per token")
clp = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                     temperature=0, logprobs=True, top_logprobs=3)
check(len(clp.choices[0].logprobs.content) > 0 and len(clp.choices[0].logprobs.content[0].top_logprobs) == 3,
      "chat logprobs with top_logprobs")
# Greedy: the sampled token is the most likely one.
first = clp.choices[0].logprobs.content[0]
check(abs(first.logprob - first.top_logprobs[0].logprob) < 1e-4, "greedy picks the top token")

# The kv_policy extension and a stop string.
lazy = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Count from 1 to 20."}], max_tokens=40, temperature=0,
    extra_body={"kv_policy": {"name": "lazy", "budget": 32, "window": 8}})
check(lazy.choices[0].message.content, "a request with kv_policy lazy")
stopped = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[","])
check("," not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop", "stop string")

# Errors surface as the client's typed exceptions with the server's message.
try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}],
                                   extra_body={"kv_policy": {"name": "nope"}})
    check(False, "unknown policy rejected")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "lazy" in str(e), "unknown policy -> 400 listing the valid ones")
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    check(False, "unknown model rejected")
except openai.NotFoundError as e:
    check(e.status_code == 404, "unknown model -> 404")
try:
    client.completions.create(model=model, prompt="x", max_tokens=10**6)
    check(False, "context overflow rejected")
except openai.BadRequestError as e:
    check("maximum context length" in str(e) and "completion tokens fit" in e.message
          and not re.search(r"-\d", e.message),
          "context overflow -> 400 context_length_exceeded saying what fits")

# logit_bias: every token greedy decoding chose, banned, never comes back.
def greedy_tokens(prompt, **extra):
    out = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=0, **extra)
    return out.choices[0].logprobs.tokens


prompt = "The capital of France is"
first = greedy_tokens(prompt)
id_of = {}  # a generated token's text -> its id, where the text is that one token
for text in set(first):
    ids = post("/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    if len(ids) == 1:
        id_of[text] = ids[0]
check(len(id_of) >= len(set(first)) // 2, f"greedy tokens {first} map to ids {id_of}")
second = greedy_tokens(prompt, logit_bias={str(i): -100 for i in id_of.values()})
check(not set(id_of) & set(second), f"logit_bias -100: none of {sorted(id_of)} in {second}")

# Penalties: greedy on a repetitive prompt repeats; a frequency penalty spreads the output.
repetitive = "1, 1, 1, 1, 1, 1, 1, 1, 1, 1,"
plain = greedy_tokens(repetitive)
penalized = greedy_tokens(repetitive, frequency_penalty=2.0, presence_penalty=1.0)
most_plain = collections.Counter(plain).most_common(1)[0][1]
most_penalized = collections.Counter(penalized).most_common(1)[0][1]
check(most_penalized < most_plain,
      f"frequency/presence penalties: most repeated token {most_plain}x -> {most_penalized}x")
repeated = greedy_tokens(repetitive, extra_body={"repetition_penalty": 1.5})
check(repeated != plain, "repetition_penalty (extension) changes greedy output")
print("all OpenAI client checks passed")
