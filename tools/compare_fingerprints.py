#!/usr/bin/env python3
"""tools/compare_fingerprints.py BEFORE AFTER: holds two folders written by
tools/behaviour_fingerprint.sh to "the same behaviour", bitwise. Every HDF5 record (the
consistency suite's per-layout gradients and losses) must hold the same datasets with the same
values bit for bit; every metrics file the same rows with the same losses, gradient norms and
learning rates (times and rates are left out: they differ from run to run). Prints each
difference and exits 1 if there is any."""
import json
import os
import sys

import h5py
import numpy as np

COMPARED = ("loss", "grad_norm", "lr", "step", "tokens", "skipped")


def datasets(path):
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: found.__setitem__(name, item[()])
                     if isinstance(item, h5py.Dataset) else None)
    return found


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        return a.tobytes() == b.tobytes()
    return np.array_equal(a, b)


def compare_h5(before, after, name, problems):
    a, b = datasets(before), datasets(after)
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            problems.append(f"{name}: dataset {key} only in {'after' if key in b else 'before'}")
        elif not same_bits(a[key], b[key]):
            problems.append(f"{name}: dataset {key} differs")


def compared_fields(row):
    return {k: v for k, v in row.items() if any(word in k for word in COMPARED)
            and "per_s" not in k and "seconds" not in k}


def compare_jsonl(before, after, name, problems):
    rows_a = [json.loads(line) for line in open(before) if line.strip()]
    rows_b = [json.loads(line) for line in open(after) if line.strip()]
    if len(rows_a) != len(rows_b):
        problems.append(f"{name}: {len(rows_a)} rows before, {len(rows_b)} after")
    for i, (ra, rb) in enumerate(zip(rows_a, rows_b)):
        fa, fb = compared_fields(ra), compared_fields(rb)
        if fa != fb:
            keys = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
            problems.append(f"{name}: row {i}: " +
                            ", ".join(f"{k} {fa.get(k)} -> {fb.get(k)}" for k in keys))


def files(root):
    return {os.path.relpath(os.path.join(d, f), root)
            for d, _, names in os.walk(root) for f in names
            if f.endswith((".h5", ".jsonl"))}


def main(before, after):
    problems = []
    a, b = files(before), files(after)
    for name in sorted(a ^ b):
        problems.append(f"{name}: only in {'after' if name in b else 'before'}")
    compared = 0
    for name in sorted(a & b):
        compare = compare_h5 if name.endswith(".h5") else compare_jsonl
        compare(os.path.join(before, name), os.path.join(after, name), name, problems)
        compared += 1
    for p in problems:
        print(p)
    print(f"{compared} files compared, {len(problems)} difference(s)")
    return 1 if problems or compared == 0 else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
