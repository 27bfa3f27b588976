"""The official `openai` Python package against `cleave serve`.

Run by tests/server.rs as: python openai_client.py BASE_URL API_KEY
"""

import sys
from concurrent.futures import ThreadPoolExecutor

import openai
from openai import OpenAI
from openai_checks import check, summary

base_url, api_key = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0)

model = client.models.list().data[0].id
check(model == "fortune-llama-3m", f"the model is listed ({model})")

messages = [{"role": "user", "content": "The best way to"}]
chat = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)
answer = chat.choices[0].message.content
check(chat.choices[0].message.role == "assistant" and answer, "a chat completion answers")
check(chat.usage.completion_tokens > 0 and chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens, "usage adds up")

stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0, stream=True)
streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
check(streamed == answer, f"the stream gives the same answer ({streamed!r} vs {answer!r})")

completion = client.completions.create(model=model, prompt="Computers are", max_tokens=12, seed=5, temperature=0.9)
check(completion.choices[0].text and completion.object == "text_completion", "a completion answers")


def sampled(seed):
    stream = client.completions.create(model=model, prompt="Computers are", max_tokens=12, seed=seed, temperature=0.9, stream=True)
    return "".join(chunk.choices[0].text for chunk in stream)


with ThreadPoolExecutor(4) as pool:
    texts = list(pool.map(sampled, [5, 6, 5, 6]))
check(texts[0] == texts[2] == completion.choices[0].text and texts[1] == texts[3], "concurrent streams with a seed repeat exactly")

reported = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2)
content = reported.choices[0].logprobs.content
check(len(content) == reported.usage.completion_tokens and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content), "a chat reports each token's log-probability")
check("".join(t.token for t in content) == reported.choices[0].message.content, "the reported tokens spell the answer")
reported = client.completions.create(model=model, prompt="Computers are", max_tokens=6, temperature=0, logprobs=3)
logprobs = reported.choices[0].logprobs
check(len(logprobs.token_logprobs) == len(logprobs.tokens) == reported.usage.completion_tokens and 1 <= len(logprobs.top_logprobs[0]) <= 3, "a completion reports each token's log-probability")

stopped = client.completions.create(model=model, prompt="The best way to", max_tokens=40, temperature=0, stop=[" man"])
check(" man" not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop", "a stop string ends the text")

try:
    OpenAI(base_url=base_url + "/v1", api_key="wrong", max_retries=0).models.list()
    check(False, "a wrong key is refused")
except openai.AuthenticationError:
    check(True, "a wrong key is refused")

try:
    client.completions.create(model=model, prompt="hi", max_tokens=100000)
    check(False, "max_tokens past the context is refused")
except openai.BadRequestError as e:
    check(e.code == "context_length_exceeded", "max_tokens past the context is refused")

print(f"openai {openai.__version__}: {summary()}")
