"""The official `openai` Python package's Embeddings API against `cleave
serve` on a sentence encoder, checked against sentence-transformers'
embeddings.

Run by tests/embedding_server.rs as: python openai_embeddings.py BASE_URL REFERENCE_JSON
"""

import json
import sys

import openai
from openai import OpenAI
from openai_checks import check, summary

base_url, reference_path = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
with open(reference_path) as f:
    cases = json.load(f)["cases"]


def close(got, want):
    return len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) < 1e-4


model = client.models.list().data[0].id
sentences = [case["sentence"] for case in cases]
# The client asks for base64 unless told otherwise, and decodes it itself.
for encoding in [None, "float"]:
    extra = {} if encoding is None else {"encoding_format": encoding}
    answer = client.embeddings.create(model=model, input=sentences, **extra)
    check(
        all(close(d.embedding, case["embedding"]) for d, case in zip(answer.data, cases)) and len(answer.data) == len(cases),
        f"every embedding is sentence-transformers' ({encoding or 'base64'})",
    )
check(answer.usage.prompt_tokens == sum(len(case["input_ids"]) for case in cases), "usage counts the inputs' tokens")

try:
    client.embeddings.create(model=model, input=sentences[0], dimensions=8)
    check(False, "dimensions the model lacks are refused")
except openai.BadRequestError as e:
    check("dimensions" in str(e), "dimensions the model lacks are refused")

print(f"openai {openai.__version__}: {summary()}")
