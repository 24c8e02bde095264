"""Structured outputs through the official OpenAI Python client against a
running `lazykv serve`: 50 generated JSON schemas (nested objects, enums,
arrays, number ranges, anyOf) sampled concurrently, each reply validated by
`jsonschema`; json_object; a pydantic model through the client's parse();
streaming; guided_choice; and the 400 that names an unsupported keyword.

usage: structured_outputs_client.py BASE_URL MODEL
Exits non-zero on the first failed check.
"""
import concurrent.futures
import json
import random
import sys

import jsonschema
import openai
import pydantic

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=300)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def random_schema(rng, depth):
    """A schema whose every value is bounded, so a reply always ends."""
    kind = rng.randrange(9 if depth > 0 else 6)
    if kind == 0:
        return {"type": "string", "maxLength": rng.randint(1, 16)}
    if kind == 1:
        return {"type": "integer", "minimum": -rng.randrange(10), "maximum": rng.randint(1, 500)}
    if kind == 2:
        return {"type": "number", "minimum": 0, "exclusiveMaximum": rng.randint(1, 100) + 0.5}
    if kind == 3:
        return {"type": "boolean"}
    if kind == 4:
        return {"enum": rng.sample(["red", "green", "blue", "cyan", 3, None, True], 3)}
    if kind == 5:
        return {"type": ["integer", "null"], "minimum": 0, "maximum": 9}
    if kind == 6:
        most = rng.randint(1, 3)
        return {"type": "array", "items": random_schema(rng, depth - 1), "minItems": rng.randint(0, most),
                "maxItems": most}
    if kind == 7:
        return {"anyOf": [random_schema(rng, depth - 1), random_schema(rng, depth - 1)]}
    names = rng.sample(["id", "name", "color", "count", "tags", "score", "ok"], rng.randint(1, 4))
    properties = {n: random_schema(rng, depth - 1) for n in names}
    return {"type": "object", "properties": properties,
            "required": [n for n in names if rng.random() < 0.6], "additionalProperties": False}


def ask(i, schema):
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Reply with a JSON value for this schema: "
                                + json.dumps(schema)}],
        max_tokens=512, temperature=0.7, seed=i,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    return reply.choices[0]


rng = random.Random(20261127)
schemas = [{"type": "object", "properties": {"v": random_schema(rng, 3)}, "required": ["v"],
            "additionalProperties": False} for _ in range(50)]
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    choices = list(pool.map(ask, range(len(schemas)), schemas))
valid = 0
for i, (schema, choice) in enumerate(zip(schemas, choices)):
    check(choice.finish_reason == "stop", f"schema {i}: the reply ended by the grammar ({choice.finish_reason})")
    try:
        jsonschema.validate(json.loads(choice.message.content), schema)
        valid += 1
    except (ValueError, jsonschema.ValidationError) as e:
        check(False, f"schema {i}: {json.dumps(schema)}\nreply {choice.message.content!r}\n{e}")
check(valid == 50, "50 generated schemas: every reply validates with jsonschema")

# json_object: any JSON object.
obj = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Describe a cat as a JSON object with 2 keys."}],
    max_tokens=96, temperature=0, response_format={"type": "json_object"})
if obj.choices[0].finish_reason == "stop":
    check(isinstance(json.loads(obj.choices[0].message.content), dict), "json_object: the reply is an object")
else:
    check(obj.choices[0].message.content.startswith("{"), "json_object: a long reply still starts as an object")


# A pydantic model through the client's parse(), as applications use it.
class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int = pydantic.Field(ge=0, le=120)
    pets: list[pydantic.constr(max_length=16)] = pydantic.Field(max_length=3)


parsed = client.chat.completions.parse(
    model=model, messages=[{"role": "user", "content": "Invent a person with a name, an age and pets."}],
    max_tokens=256, temperature=0, response_format=Person)
check(isinstance(parsed.choices[0].message.parsed, Person), f"parse() gives a Person: {parsed.choices[0].message.parsed}")

# Streamed: the pieces join to a valid reply.
schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer"], "additionalProperties": False}
pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is 6*7? Answer in JSON."}], max_tokens=64,
    temperature=0, stream=True,
    response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}) if c.choices]
jsonschema.validate(json.loads("".join(pieces)), schema)
check(True, f"streamed structured output validates: {''.join(pieces)!r}")

# guided_choice (extension): exactly one of the choices.
choice = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Is fire cold?"}], max_tokens=8, temperature=0,
    extra_body={"guided_choice": ["yes", "no", "maybe"]})
check(choice.choices[0].message.content in ("yes", "no", "maybe"), f"guided_choice: {choice.choices[0].message.content!r}")

try:
    client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": {
            "type": "object", "properties": {"mail": {"type": "string", "format": "email"}}}}})
    check(False, "an unsupported keyword is refused")
except openai.BadRequestError as e:
    check(e.status_code == 400 and "'format'" in e.message and "#/properties/mail" in e.message,
          f"an unsupported keyword -> 400 naming it and where: {e.message}")
print("all structured-output checks passed")
