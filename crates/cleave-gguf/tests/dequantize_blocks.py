"""Dequantizes raw blocks with gguf-py, for tests/dequantize.rs.

usage: python dequantize_blocks.py DIR TYPE...

For each ggml type name (F32, F16, BF16, Q8_0, Q4_0, ..., MXFP4) it
reads DIR/<TYPE>.blocks, whole blocks of that type back to back, and writes
DIR/<TYPE>.f32: gguf-py's `dequantize` of them, little-endian float32.
"""

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize


def main():
    folder = Path(sys.argv[1])
    for name in sys.argv[2:]:
        blocks = np.fromfile(folder / f"{name}.blocks", dtype=np.uint8)
        # The blocks hold every f16 scale, infinities and NaNs among them.
        with np.errstate(invalid="ignore", over="ignore"):
            values = dequantize(blocks, GGMLQuantizationType[name])
        values.astype("<f4").tofile(folder / f"{name}.f32")


if __name__ == "__main__":
    main()
