"""The official `openai` Python package's Responses API against `cleave
serve`: a response is the chat completion of the same messages, streamed
or not.

Run by tests/server.rs as: python openai_responses.py BASE_URL
"""

import json
import sys

import openai
from openai import OpenAI
from openai_checks import check, summary

base_url = sys.argv[1]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
model = client.models.list().data[0].id


def chat(messages, max_tokens):
    return client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0)


answer = chat([{"role": "user", "content": "The best way to"}], 12)
response = client.responses.create(model=model, input="The best way to", max_output_tokens=12, temperature=0)
check(response.output_text == answer.choices[0].message.content, f"a response is the chat's answer ({response.output_text!r})")
check(response.usage.input_tokens == answer.usage.prompt_tokens and response.usage.output_tokens == answer.usage.completion_tokens, "usage counts the chat's tokens")
check(response.status in ("completed", "incomplete") and response.output[0].role == "assistant", "the response holds the assistant's message")

messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Computers are"}]
answer = chat(messages, 8)
items = [{"role": "user", "content": [{"type": "input_text", "text": "Computers are"}]}]
response = client.responses.create(model=model, instructions="Be brief.", input=items, max_output_tokens=8, temperature=0)
check(response.output_text == answer.choices[0].message.content, "instructions are the system message")

events = list(client.responses.create(model=model, instructions="Be brief.", input=items, max_output_tokens=8, temperature=0, stream=True))
streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
kinds = [e.type for e in events]
check(streamed == response.output_text, f"the stream spells the same answer ({streamed!r})")
check(kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), f"the stream opens and closes the response ({kinds[0]}, {kinds[-1]})")
check([e.sequence_number for e in events] == list(range(len(events))), "events are numbered in order")
check(events[-1].response.output_text == streamed, "the last event holds the whole response")

schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": False}
response = client.responses.create(model=model, input="Pick a number", max_output_tokens=32, temperature=0,
                                   text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}})
picked = json.loads(response.output_text)
check(set(picked) == {"n"} and 0 <= picked["n"] <= 9, f"text.format holds the answer to its schema ({response.output_text!r})")
check(response.text.format.type == "json_schema", "the response says the format it was held to")

try:
    client.responses.create(model=model, input="hi", previous_response_id="resp_1")
    check(False, "previous_response_id is refused")
except openai.BadRequestError as e:
    check("previous_response_id" in str(e), "previous_response_id is refused")

print(f"openai {openai.__version__}: {summary()}")
