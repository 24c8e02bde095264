"""Tool calls through the official OpenAI Python client (tests/e2e/tool_calls_test.sh).

usage: tool_calls_client.py BASE_URL MODEL
Exits non-zero on the first failed check.
"""
import json
import sys

import jsonschema
import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)
tools = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
question = [{"role": "user", "content": "What is the weather in Paris today?"}]


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


# tool_choice "required": the reply is a call, parsed by the client into objects.
reply = client.chat.completions.create(model=model, messages=question, tools=tools, tool_choice="required",
                                       temperature=0, max_tokens=64)
choice = reply.choices[0]
calls = choice.message.tool_calls or []
check(len(calls) == 1 and calls[0].function.name == "get_weather", f"required: one call of get_weather ({calls})")
arguments = json.loads(calls[0].function.arguments)
check(isinstance(arguments, dict) and "city" in arguments, f"its arguments are a JSON object: {arguments}")
check(choice.finish_reason == "tool_calls" and calls[0].id.startswith("call_"), "finish_reason tool_calls, an id")

# A required call's arguments follow the function's schema (enum, integer
# range, required keys): the grammar holds them to it, at any temperature.
thermostat = {"type": "object", "properties": {
    "room": {"enum": ["kitchen", "bedroom", "hall"]},
    "celsius": {"type": "integer", "minimum": 12, "maximum": 28},
    "eco": {"type": "boolean"}}, "required": ["room", "celsius"]}
both = tools + [{"type": "function", "function": {
    "name": "set_thermostat", "description": "Set a room's thermostat", "parameters": thermostat}}]
for seed in range(4):
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Make the kitchen warm, about 30 degrees."}], tools=both,
        tool_choice="required", temperature=1.0, seed=seed, max_tokens=96)
    calls = reply.choices[0].message.tool_calls or []
    check(len(calls) == 1, f"seed {seed}: one call ({reply.choices[0].message})")
    schema = thermostat if calls[0].function.name == "set_thermostat" else tools[0]["function"]["parameters"]
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)
    check(True, f"seed {seed}: {calls[0].function.name}({calls[0].function.arguments}) validates against its schema")

# A named function, streamed: the call arrives as delta.tool_calls.
stream = client.chat.completions.create(
    model=model, messages=question, tools=tools, temperature=0, max_tokens=64, stream=True,
    tool_choice={"type": "function", "function": {"name": "get_weather"}})
streamed, finish, pieces, ids = {}, None, 0, []
for chunk in stream:
    for c in chunk.choices:
        for call in c.delta.tool_calls or []:
            entry = streamed.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
            pieces += bool(call.function.arguments)
            if call.id:
                ids.append(call.id)
        finish = c.finish_reason or finish
check(list(streamed) == [0] and streamed[0]["name"] == "get_weather", f"streamed call: {streamed}")
check(pieces > 1 and len(ids) == 1, f"the arguments streamed in {pieces} pieces, the id once ({ids})")
check(json.loads(streamed[0]["arguments"]) == arguments, "streamed arguments equal the whole reply's")
check(finish == "tool_calls", "streamed finish_reason tool_calls")

# The round trip: the call and its result in the history, then an answer.
history = question + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function",
         "function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
    {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temperature_c": 21, "sky": "sunny"})}]
final = client.chat.completions.create(model=model, messages=history, tools=tools, tool_choice="none",
                                       temperature=0, max_tokens=48)
check(final.choices[0].message.role == "assistant" and isinstance(final.choices[0].message.content, str),
      f"answer after the tool result: {final.choices[0].message.content!r}")
check("21" in final.choices[0].message.content, "the answer uses the tool's result (greedy, this model)")
print("all tool-call checks passed")
