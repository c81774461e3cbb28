#!/usr/bin/python3
"""tests/cli/read_checkpoint_h5py.py: a Retort checkpoint read as docs/checkpoint-format.md
describes it, with h5py and numpy only: index.json's header, every tensor's pieces tiling its
global shape exactly, each piece's CRC-32C (computed here, bit by bit from the polynomial,
independently of Retort's table and SSE4.2 code) and the generator state in rank 0's file.

Usage: read_checkpoint_h5py.py CHECKPOINT_DIR"""
import json
import os
import sys

import h5py
import numpy as np


def crc32c(data):
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def main():
    directory = sys.argv[1]
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    assert index["format"] == "retort-checkpoint" and index["version"] == 2, index["format"]
    assert index["step"] > 0 and "model" in index
    files = {}
    checked = 0
    for key, tensor in index["tensors"].items():
        covered = np.zeros(tensor["shape"], dtype=np.int32)
        for piece in tensor["pieces"]:
            if piece["file"] not in files:
                files[piece["file"]] = h5py.File(os.path.join(directory, piece["file"]), "r")
            data = files[piece["file"]]["/" + key][...]
            assert list(data.shape) == piece["shape"], (key, data.shape, piece["shape"])
            assert data.dtype == np.dtype(tensor["dtype"]), (key, data.dtype)
            assert crc32c(np.ascontiguousarray(data).tobytes()) == piece["crc32c"], key
            box = tuple(slice(o, o + s) for o, s in zip(piece["offset"], piece["shape"]))
            covered[box] += 1
            checked += 1
        assert (covered == 1).all(), f"{key}: pieces do not tile the tensor exactly"
    rng = files.get(index["rng_file"]) or h5py.File(os.path.join(directory, index["rng_file"]), "r")
    assert rng["/rng/torch_cpu"].dtype == np.uint8
    print(f"{len(index['tensors'])} tensors, {checked} pieces, checksums and tiling hold")


if __name__ == "__main__":
    main()
