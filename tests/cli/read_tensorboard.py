"""tests/cli/read_tensorboard.py RUN_DIR: reads the TensorBoard event files of a run with
code of its own (TFRecord framing, masked CRC-32C computed bit by bit here, the protobuf wire
format decoded by hand) and checks that every scalar of every metrics.jsonl line is in an
event at the same step with the same value (as float32); the first event must carry
file_version "brain.Event:2". Exits non-zero naming the first problem."""
import glob
import json
import math
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    blob = open(path, "rb").read()
    at = 0
    while at < len(blob):
        if at + 12 > len(blob):
            sys.exit(f"{path}: truncated record header at byte {at}")
        header = blob[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[at + 8:at + 12])
        if length_crc != masked(header):
            sys.exit(f"{path}: bad length CRC at byte {at}")
        payload = blob[at + 12:at + 12 + length]
        (payload_crc,) = struct.unpack("<I", blob[at + 12 + length:at + 16 + length])
        if payload_crc != masked(payload):
            sys.exit(f"{path}: bad payload CRC at byte {at}")
        yield payload
        at += 16 + length


def varint(buf, at):
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def fields(buf):
    """(field number, value) pairs of one message: ints, bytes or raw fixed-width bytes."""
    at = 0
    while at < len(buf):
        key, at = varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(buf, at)
        elif wire == 1:
            value, at = buf[at:at + 8], at + 8
        elif wire == 2:
            length, at = varint(buf, at)
            value, at = buf[at:at + length], at + length
        elif wire == 5:
            value, at = buf[at:at + 4], at + 4
        else:
            sys.exit(f"unexpected wire type {wire}")
        yield number, value


def flatten(row):
    for key, value in row.items():
        if isinstance(value, dict):
            for name, inner in value.items():
                yield f"{key}/{name}", inner
        elif key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield key, value


def check_metrics(run_dir, scalars, reader):
    """Exits naming the first scalar of the run's metrics.jsonl that `scalars` ((step, tag) ->
    value, from `reader`) lacks or holds with another value (as float32); returns the rows and
    the number of scalars checked."""
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    checked = 0
    for row in rows:
        for tag, value in flatten(row):
            if (row["step"], tag) not in scalars:
                sys.exit(f"{reader}step {row['step']}: '{tag}' is not in the event file")
            stored = scalars[(row["step"], tag)]
            expected = struct.unpack("<f", struct.pack("<f", value))[0]
            if not (stored == expected or (math.isnan(stored) and math.isnan(expected))):
                sys.exit(f"{reader}step {row['step']}: '{tag}' is {stored} in the event file, "
                         f"{value} in metrics.jsonl")
            checked += 1
    return rows, checked


def main(run_dir):
    files = sorted(glob.glob(f"{run_dir}/events.out.tfevents.*"))
    if not files:
        sys.exit(f"no event file in {run_dir}")
    scalars = {}  # (step, tag) -> value
    versions = []
    for path in files:
        for index, payload in enumerate(records(path)):
            event = dict(fields(payload))
            if index == 0:
                versions.append(event.get(3, b"").decode())
            if 5 not in event:
                continue
            step = event.get(2, 0)
            for number, value in fields(event[5]):
                entry = dict(fields(value))
                scalars[(step, entry[1].decode())] = struct.unpack("<f", entry[2])[0]
    if any(v != "brain.Event:2" for v in versions):
        sys.exit(f"file_version of the first events: {versions}")
    rows, checked = check_metrics(run_dir, scalars, "")
    tags = sorted({tag for _, tag in scalars})
    print(f"{len(files)} event file(s), {len(rows)} metrics lines: all {checked} scalars found "
          f"({len(tags)} tags: {', '.join(tags)})")


if __name__ == "__main__":
    main(sys.argv[1])
