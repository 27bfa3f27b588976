"""Dequantizes every tensor of GGUF files with gguf-py, for tests/dequantize.rs.

usage: python dequantize_reference.py OUT_DIR FILE.gguf...

For each file and tensor it writes OUT_DIR/<file index>/<tensor index>.f32
(little-endian float32, the tensor in transformers' shape: gguf-py's
`dequantize`), and for the query and key projections of llama-architecture
files also <tensor index>.hf.f32: the same values with llama.cpp's row
permutation undone by transformers' own formula (`reverse_permute` in
transformers' modeling_gguf_pytorch_utils.py). OUT_DIR/index.json lists
them: [{"path", "tensors": [{"name", "type", "shape", "hf_order"}]}].
"""

import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def reverse_permute(weights, n_head, num_kv_heads=None):
    # transformers' TensorProcessor for llama, verbatim.
    if num_kv_heads is not None and n_head != num_kv_heads:
        n_head = num_kv_heads
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def main():
    out = Path(sys.argv[1])
    index = []
    for i, path in enumerate(sys.argv[2:]):
        reader = GGUFReader(path)
        arch = field(reader, "general.architecture")
        heads = field(reader, f"{arch}.attention.head_count")
        kv_heads = field(reader, f"{arch}.attention.head_count_kv")
        folder = out / str(i)
        folder.mkdir(parents=True)
        tensors = []
        for j, t in enumerate(reader.tensors):
            values = dequantize(t.data, t.tensor_type).astype(np.float32)
            values.astype("<f4").tofile(folder / f"{j}.f32")
            hf = None
            if arch == "llama" and ".attn_q." in t.name:
                hf = reverse_permute(values, heads, heads)
            elif arch == "llama" and ".attn_k." in t.name:
                hf = reverse_permute(values, heads, kv_heads)
            if hf is not None:
                hf.astype("<f4").tofile(folder / f"{j}.hf.f32")
            tensors.append(
                {
                    "name": t.name,
                    "type": t.tensor_type.name,
                    "shape": [int(d) for d in values.shape],
                    "hf_order": hf is not None,
                }
            )
        index.append({"path": path, "tensors": tensors})
    (out / "index.json").write_text(json.dumps(index))


if __name__ == "__main__":
    main()
