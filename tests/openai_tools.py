"""Tool calls through the official `openai` Python package against `cleave
serve` (a random-weight model under a published template that declares
tools): a named function and `required` return calls whose arguments
validate against the function's schema (Python's `jsonschema`), greedy
and sampled; a stream's tool-call deltas reassemble to the whole answer's
call; the call goes back through the template with its result (ids as
the template takes them); a conversation holding a call and its result
is rendered as transformers renders it (its prompt tokens are
transformers'); the Responses API gives the same call as a function_call
item, whole and streamed, and renders the same conversation sent as its
items; bad tools are 400s naming the field.

Run by tests/server.rs as: python openai_tools.py BASE_URL CASE, where
CASE is the JSON of tests/fixtures/chat-templates/published.json's tool
conversation for the template (its messages, tools and transformers' ids).
"""

import json
import sys

import jsonschema
import openai
from openai import OpenAI
from openai_checks import check, summary

base_url, case = sys.argv[1], json.loads(sys.argv[2])
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a zone.", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "Weather in Bern?"}]


def valid_call(call, names):
    try:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        return call.function.name in names and call.type == "function" and bool(call.id)
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False


named = {"type": "function", "function": {"name": "get_weather"}}
for seed, temperature in [(0, 0), (1, 0.9), (2, 0.9)]:
    answer = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=128, temperature=temperature, seed=seed
    )
    choice = answer.choices[0]
    calls = choice.message.tool_calls or []
    check(
        choice.finish_reason == "tool_calls" and len(calls) == 1 and valid_call(calls[0], ["get_weather"]),
        f"a named function is called with valid arguments (seed {seed}: {choice.message})",
    )

for seed in range(4):
    answer = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        max_tokens=128, temperature=1.0, seed=seed,
    )
    calls = answer.choices[0].message.tool_calls or []
    check(len(calls) == 1 and valid_call(calls[0], SCHEMAS), f"required gives a valid call (seed {seed}: {answer.choices[0].message})")

whole = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=128, temperature=0)
stream = client.chat.completions.create(
    model=model, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=128, temperature=0, stream=True
)
names, arguments, finish = {}, {}, None
for chunk in stream:
    if not chunk.choices:
        continue
    delta = chunk.choices[0].delta
    for call in delta.tool_calls or []:
        names[call.index] = names.get(call.index, "") + (call.function.name or "")
        arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
    finish = chunk.choices[0].finish_reason or finish
named_call = call = whole.choices[0].message.tool_calls[0]
check(
    names == {0: call.function.name} and arguments == {0: call.function.arguments} and finish == "tool_calls",
    f"streamed tool-call deltas reassemble to the whole answer's call ({names}, {arguments}, {finish})",
)

# The answer's own call, sent back with a result: its id is one the
# template takes (Mistral's takes nine letters and digits only).
returned = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": "{\"temperature\": 3}"},
]
answer = client.chat.completions.create(model=model, messages=returned, tools=TOOLS, max_tokens=4, temperature=0)
check(answer.usage.prompt_tokens > 0, f"the answer's call and its result go back through the template (id {call.id!r})")

# A call and its result go back through the template: published.json's
# tool conversation, its call's arguments sent as OpenAI's client sends
# them (a JSON text).
conversation = case["messages"]
for message in conversation:
    for call in message.get("tool_calls", []):
        call["function"]["arguments"] = json.dumps(call["function"]["arguments"], ensure_ascii=False)
published_tools = case["tools"]
prompt_tokens = len(case["ids"])
answer = client.chat.completions.create(model=model, messages=conversation, tools=published_tools, max_tokens=4, temperature=0)
check(answer.usage.prompt_tokens == prompt_tokens, f"a tool result is rendered as transformers renders it ({answer.usage.prompt_tokens} tokens)")
check(answer.choices[0].finish_reason in ("stop", "length", "tool_calls"), "auto answers freely")


# The Responses API: its function tools are flat, its calls are items.
flat_tools = [{"type": "function", **tool["function"]} for tool in TOOLS]
flat_named = {"type": "function", "name": "get_weather"}
response = client.responses.create(
    model=model, input=ASK, tools=flat_tools, tool_choice=flat_named, max_output_tokens=128, temperature=0
)
items = [item for item in response.output if item.type == "function_call"]
check(
    len(items) == 1 and (items[0].name, items[0].arguments) == (named_call.function.name, named_call.function.arguments)
    and bool(items[0].call_id),
    f"a named function is a function_call item holding the chat's call ({response.output})",
)
events = list(client.responses.create(
    model=model, input=ASK, tools=flat_tools, tool_choice=flat_named, max_output_tokens=128, temperature=0, stream=True
))
done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
last = events[-1]
check(
    done == [named_call.function.arguments] and last.type == "response.completed"
    and [(i.type, i.arguments) for i in last.response.output] == [("function_call", named_call.function.arguments)],
    f"the stream gives the same call as its events ({done}, {last.type})",
)
check([e.sequence_number for e in events] == list(range(len(events))), "the call's events are numbered in order")
items = []
for message in conversation:
    if message["role"] == "tool":
        items.append({"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]})
        continue
    if message.get("content"):
        items.append({"role": message["role"], "content": message["content"]})
    for c in message.get("tool_calls", []):
        items.append({"type": "function_call", "call_id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]})
flat_published = [{"type": "function", **tool["function"]} for tool in published_tools]
response = client.responses.create(model=model, input=items, tools=flat_published, max_output_tokens=4, temperature=0)
check(response.usage.input_tokens == prompt_tokens, f"a call and its output as items render as the chat's ({response.usage.input_tokens} tokens)")
try:
    client.responses.create(model=model, input="hi", tools=[{"type": "web_search"}])
    check(False, "hosted tools are refused")
except openai.BadRequestError as e:
    check((e.body or {}).get("param") == "tools", "a hosted tool is a 400 naming tools")


def refused(what, param, **kwargs):
    try:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=8, **kwargs)
        check(False, f"{what} is refused")
    except openai.BadRequestError as e:
        body = e.body or {}
        check(body.get("param") == param, f"{what} is a 400 naming {param} ({body.get('message')!r})")


refused("a tool without a name", "tools", tools=[{"type": "function", "function": {"description": "x"}}])
refused("a call of an undeclared function", "tool_choice", tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "launch"}})
refused("required without tools", "tool_choice", tool_choice="required")
refused("a named call beside a response format", "tool_choice", tools=TOOLS, tool_choice=named,
        response_format={"type": "json_object"})
try:
    client.completions.create(model=model, prompt="hi", max_tokens=4, extra_body={"tools": TOOLS})
    check(False, "tools on completions are refused")
except openai.BadRequestError as e:
    check((e.body or {}).get("param") == "tools", "tools on completions are a 400 naming tools")

print(f"openai {openai.__version__}: {summary()}")
