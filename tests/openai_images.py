"""The official `openai` Python package's Images API against `cleave serve`
on a FLUX pipeline.

Run by tests/image_server.rs as: python openai_images.py BASE_URL PROMPT OUT_DIR
Writes the PNGs it receives into OUT_DIR for the Rust side to compare.
"""

import base64
import os
import sys

import openai
from openai import OpenAI
from openai_checks import check, summary

base_url, prompt, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)


def save(image, name):
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(base64.b64decode(image.b64_json))


model = client.models.list().data[0].id
check(model == "flux-tiny", f"the pipeline is listed ({model})")

fixture_call = {"seed": 42, "num_inference_steps": 4, "max_sequence_length": 32}
one = client.images.generate(model=model, prompt=prompt, size="32x32", response_format="b64_json", extra_body=fixture_call)
check(len(one.data) == 1 and one.created > 0, "one image, with its creation time")
save(one.data[0], "seed42.png")

two = client.images.generate(model=model, prompt=prompt, n=2, size="32x32", response_format="b64_json", extra_body=fixture_call)
check(len(two.data) == 2, "n=2 gives two images")
save(two.data[0], "n0.png")
save(two.data[1], "n1.png")


def refused(field, **asked):
    try:
        client.images.generate(model=model, prompt=prompt, extra_body=fixture_call, **asked)
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.param == field and field in str(e.body), f"{asked} names {field}: {e.body}")
        return
    sys.exit(f"FAILED: {asked} was served")


refused("size", size="30x30")
refused("n", n=5, size="32x32")
refused("response_format", size="32x32", response_format="url")

try:
    client.completions.create(model=model, prompt="Hello", max_tokens=4)
    sys.exit("FAILED: a pipeline served a completion")
except openai.NotFoundError as e:
    check("/v1/images/generations" in str(e.body), f"a completion's 404 names the image route: {e.body}")

print(summary())
