#!/usr/bin/env python3
"""Reference renderings of chat templates for lazykv's C++ template engine.

Renders every template in tests/data/chat/ with Python jinja2 set up the way
Hugging Face transformers renders chat templates (apply_chat_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[loopcontrols]) plus the {% generation %}
tag, with raise_exception, strftime_now and a tojson
filter that is json.dumps(ensure_ascii=False). Each (template, context) pair
becomes one line of tests/data/chat/expected.jsonl:
  {"template": file, "context": {...}, "output": "..."}   or
  {"template": file, "context": {...}, "error": "..."}
The SmolLM2 template is first extracted from the default model's GGUF.

Pins (same as the reference venv): jinja2==3.1.6, gguf==0.19.0.
Usage: make_chat_reference.py [--model PATH] [--out DIR]
"""

import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MODEL = os.path.expanduser("~/.cache/lazykv/models/SmolLM2-135M-Instruct.Q4_1.gguf")


class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} tag (assistant-token tracking): renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def extract_gguf_template(model_path):
    import gguf
    reader = gguf.GGUFReader(model_path)
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def msg(role, content):
    return {"role": role, "content": content}


SYSTEM = msg("system", "You are a terse assistant.")
UNICODE = "héllo wörld — 世界 🙂\ttab \"quotes\" 'single' back\\slash\n second line  "
JINJA_LOOKING = "Render {{ x }} and {% if y %}z{% endif %} and {# c #} literally"

COMMON = [
    {"messages": [SYSTEM, msg("user", "Hello!")], "add_generation_prompt": True},
    {"messages": [msg("user", "Hello!")], "add_generation_prompt": True},
    {"messages": [msg("user", "Hello!")], "add_generation_prompt": False},
    {"messages": [SYSTEM, msg("user", "What is 2+2?"), msg("assistant", "4."),
                  msg("user", "And 3+3?")], "add_generation_prompt": True},
    {"messages": [msg("user", "What is 2+2?"), msg("assistant", "4.")],
     "add_generation_prompt": False},
    {"messages": [msg("user", UNICODE)], "add_generation_prompt": True},
    {"messages": [msg("user", JINJA_LOOKING), msg("assistant", "{{ raise_exception('no') }}")],
     "add_generation_prompt": True},
    {"messages": [msg("user", "  spaced  "), msg("assistant", "\n\nanswer\n\n")],
     "add_generation_prompt": True},
]

THINKING = [
    {"messages": [msg("user", "Why is the sky blue?"),
                  msg("assistant", "<think>\nRayleigh scattering...\n</think>\n\nBecause of Rayleigh scattering."),
                  msg("user", "Thanks")], "add_generation_prompt": True},
    {"messages": [SYSTEM, msg("user", "Hi"),
                  msg("assistant", "<think>a</think>b</think>final")], "add_generation_prompt": False},
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Current time",
                                              "parameters": {"type": "object", "properties": {}}}}


def tool_call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


QWEN_TOOLS = [
    {"messages": [msg("user", "Weather in Paris?")], "tools": [WEATHER_TOOL, TIME_TOOL],
     "add_generation_prompt": True},
    {"messages": [SYSTEM, msg("user", "Weather in Paris and Oslo?"),
                  {"role": "assistant", "content": "",
                   "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 2}),
                                  tool_call("get_weather", {"city": "Oslo", "unit": "celsius",
                                                            "ratio": 0.5})]},
                  msg("tool", "{\"temp\": 21}"), msg("tool", "{\"temp\": 3}"),
                  msg("assistant", "Paris is 21°C, Oslo is 3°C.")],
     "tools": [WEATHER_TOOL], "add_generation_prompt": False},
    {"messages": [msg("user", "Time?"),
                  {"role": "assistant", "content": "Let me check.",
                   "tool_calls": [{"name": "get_time", "arguments": {}}]},
                  msg("tool", "12:00")], "add_generation_prompt": True},
]

DEEPSEEK_TOOLS = [
    {"messages": [msg("user", "Weather in Paris and Oslo?"),
                  {"role": "assistant", "content": None,
                   "tool_calls": [tool_call("get_weather", "{\"city\": \"Paris\"}"),
                                  tool_call("get_weather", "{\"city\": \"Oslo\"}")]},
                  msg("tool", "21"), msg("tool", "3"),
                  msg("assistant", "Paris 21, Oslo 3.")], "add_generation_prompt": True},
    {"messages": [msg("user", "Weather?"),
                  {"role": "assistant", "content": None,
                   "tool_calls": [tool_call("get_weather", "{\"city\": \"Rome\"}")]},
                  msg("tool", "25")], "add_generation_prompt": True},
]

LLAMA_TOOLS = [
    {"messages": [SYSTEM, msg("user", "Weather in Paris?")], "tools": [WEATHER_TOOL],
     "date_string": "01 Jan 2025", "add_generation_prompt": True},
    {"messages": [msg("user", "Weather in Paris?"),
                  {"role": "assistant", "tool_calls": [tool_call("get_weather", {"city": "Paris"})]},
                  {"role": "tool", "content": {"temp": 21, "sky": "clear"}},
                  msg("assistant", "It is 21 degrees.")],
     "tools": [WEATHER_TOOL], "date_string": "01 Jan 2025", "tools_in_user_message": False,
     "add_generation_prompt": True},
    {"messages": [msg("user", "Two calls"),
                  {"role": "assistant", "tool_calls": [tool_call("a", {}), tool_call("b", {})]}],
     "date_string": "01 Jan 2025", "add_generation_prompt": False},
    {"messages": [SYSTEM], "tools": [TIME_TOOL], "date_string": "01 Jan 2025",
     "add_generation_prompt": True},
]

FEATURES = [
    {"messages": [SYSTEM, msg("user", "  first  "), msg("assistant", "second"), msg("user", "third")],
     "tools": [WEATHER_TOOL, TIME_TOOL]},
    {"messages": [], "tools": []},
]

# (template file, bos_token, eos_token, conversations)
TEMPLATES = [
    ("smollm2.jinja", "<|im_start|>", "<|im_end|>", COMMON + [{"messages": [], "add_generation_prompt": True}]),
    ("qwen2.5-instruct.jinja", "", "<|im_end|>", COMMON + THINKING + QWEN_TOOLS),
    ("qwen2.5-coder-instruct.jinja", "", "<|im_end|>", COMMON + QWEN_TOOLS[:1]),
    ("deepseek-r1-distill-qwen.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
     COMMON + THINKING + DEEPSEEK_TOOLS),
    ("llama3-instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", COMMON + THINKING),
    ("llama3.2-instruct.jinja", "<|begin_of_text|>", "<|eot_id|>",
     [dict(c, date_string="01 Jan 2025") for c in COMMON] + LLAMA_TOOLS),
    ("features.jinja", "<s>", "</s>", FEATURES),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "data", "chat"))
    args = parser.parse_args()
    if jinja2.__version__ != "3.1.6":
        print(f"warning: jinja2 {jinja2.__version__}, the references were made with 3.1.6", file=sys.stderr)

    with open(os.path.join(args.out, "smollm2.jinja"), "w", encoding="utf-8", newline="") as f:
        f.write(extract_gguf_template(args.model))
    # A real Qwen2.5 GGUF, when cached, is the authority for the Qwen template.
    models_dir = os.path.dirname(args.model)
    for entry in sorted(os.listdir(models_dir)) if os.path.isdir(models_dir) else []:
        lowered = entry.lower()
        if lowered.endswith(".gguf") and "qwen2.5" in lowered and "instruct" in lowered:
            target = "qwen2.5-coder-instruct.jinja" if "coder" in lowered else "qwen2.5-instruct.jinja"
            with open(os.path.join(args.out, target), "w", encoding="utf-8", newline="") as f:
                f.write(extract_gguf_template(os.path.join(models_dir, entry)))

    env = make_environment()
    lines = []
    for name, bos, eos, conversations in TEMPLATES:
        with open(os.path.join(args.out, name), encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        for conversation in conversations:
            context = dict(conversation, bos_token=bos, eos_token=eos)
            record = {"template": name, "context": context}
            try:
                record["output"] = template.render(**context)
            except jinja2.exceptions.TemplateError as error:
                record["error"] = str(error)
            lines.append(json.dumps(record, ensure_ascii=False))
    with open(os.path.join(args.out, "expected.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} renderings to {args.out}/expected.jsonl")


if __name__ == "__main__":
    main()
