"""Structured outputs through the official `openai` Python package against
`cleave serve`: every answer held to a JSON schema validates against it
(Python's `jsonschema`), greedy and sampled; json_object answers are JSON
objects; llama.cpp's `grammar` and vLLM's regex and choice hold the text
to their strings; a streamed answer is as valid as a whole one; what
cannot be honoured is a 400 naming its field.

Run by tests/server.rs as: python openai_structured.py BASE_URL
"""

import json
import re
import sys

import jsonschema
import openai
from openai import OpenAI
from openai_checks import check, summary

base_url = sys.argv[1]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "admin": {"type": "boolean"},
        },
        "required": ["name", "age", "admin"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {"type": "string", "enum": ["tea", "cake", "soup"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "total": {"type": "number", "minimum": 0, "maximum": 100},
            "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 10}]},
        },
        "required": ["items", "total", "note"],
        "additionalProperties": False,
    },
    "point": {
        "type": "object",
        "properties": {
            "where": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            },
            "label": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        },
        "required": ["where", "label"],
        "additionalProperties": False,
    },
    "list": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 9}, "maxItems": 4},
}

PROMPTS = ["Your fortune:", "The best way to", "Tell me about", "Computers are", "Once upon a time"]


def schema_format(name):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


# 20 requests over the schemas: greedy and sampled (seeded), chat and completions.
requests = 0
for i, name in enumerate(SCHEMAS):
    for j, prompt in enumerate(PROMPTS):
        sampled = j % 2 == 1
        kwargs = dict(model=model, max_tokens=256, temperature=0.9 if sampled else 0, seed=i * 10 + j)
        if j < 3:
            answer = client.chat.completions.create(
                messages=[{"role": "user", "content": prompt}], response_format=schema_format(name), **kwargs
            )
            text, reason = answer.choices[0].message.content, answer.choices[0].finish_reason
        else:
            answer = client.completions.create(prompt=prompt, extra_body={"response_format": schema_format(name)}, **kwargs)
            text, reason = answer.choices[0].text, answer.choices[0].finish_reason
        requests += 1
        try:
            jsonschema.validate(json.loads(text), SCHEMAS[name])
            valid = True
        except (ValueError, jsonschema.ValidationError) as e:
            valid = False
            print(f"{name} / {prompt!r}: {text!r}: {e}")
        check(valid and reason == "stop", f"{name} answer {j} ({'sampled' if sampled else 'greedy'}) validates")
check(requests == 20, "20 schema requests")

for seed in range(4):
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPTS[seed]}], max_tokens=200, temperature=1.0,
        seed=seed, response_format={"type": "json_object"},
    )
    text = answer.choices[0].message.content
    try:
        is_object = isinstance(json.loads(text), dict)
    except ValueError:
        is_object = False
    # A free JSON object may run past the token limit; one that ended must parse.
    check(is_object or answer.choices[0].finish_reason == "length", f"json_object answer {seed} is an object ({text[:60]!r})")

stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Your fortune:"}], max_tokens=256, temperature=0.9, seed=7,
    response_format=schema_format("person"), stream=True,
)
streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
try:
    jsonschema.validate(json.loads(streamed), SCHEMAS["person"])
    valid = True
except (ValueError, jsonschema.ValidationError):
    valid = False
check(valid, f"a streamed answer validates ({streamed!r})")

gbnf = 'root ::= ("yes" | "no") ", " [0-9]{1,3} " times"\n'
for seed in range(3):
    text = client.completions.create(
        model=model, prompt="Answer:", max_tokens=32, temperature=1.0, seed=seed, extra_body={"grammar": gbnf}
    ).choices[0].text
    check(re.fullmatch(r"(yes|no), [0-9]{1,3} times", text) is not None, f"llama.cpp's GBNF grammar holds ({text!r})")

text = client.completions.create(
    model=model, prompt="Date:", max_tokens=32, temperature=1.0, seed=1,
    extra_body={"structured_outputs": {"regex": "20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"}},
).choices[0].text
check(re.fullmatch(r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]", text) is not None, f"a regex holds ({text!r})")
text = client.completions.create(
    model=model, prompt="Pick:", max_tokens=16, temperature=1.0, seed=2,
    extra_body={"structured_outputs": {"choice": ["red", "green", "blue"]}},
).choices[0].text
check(text in ("red", "green", "blue"), f"a choice is one of the choices ({text!r})")


def refused(what, param, **kwargs):
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, **kwargs)
        check(False, f"{what} is refused")
    except openai.BadRequestError as e:
        body = e.body or {}
        check(body.get("param") == param, f"{what} is a 400 naming {param} ({body.get('message')!r})")


unsupported = {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}
refused("a schema with an unsupported construct", "response_format",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": unsupported}})
refused("a grammar that matches nothing", "grammar", extra_body={"grammar": "root ::= [^\\x00-\\U0010FFFF]"})
refused("a grammar that is not GBNF", "grammar", extra_body={"grammar": "root ::= undefined-rule"})
refused("two constraints at once", "grammar",
        response_format={"type": "json_object"}, extra_body={"grammar": 'root ::= "a"'})

print(f"openai {openai.__version__}: {summary()}")
