"""tests/cli/read_tensorboard_official.py RUN_DIR: TensorBoard's own reader (the `tensorboard`
package's EventAccumulator, pinned in tools/requirements.txt; run with tools/python) loads a
run's event files and must find every scalar of every metrics.jsonl line at the same step
with the same value (as float32). Beside read_tensorboard.py, which decodes the records with
code of its own. Exits non-zero naming the first problem."""
import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from read_tensorboard import flatten


def main(run_dir):
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})  # 0: keep every event
    accumulator.Reload()
    scalars = {}  # (step, tag) -> value
    for tag in accumulator.Tags()["scalars"]:
        for event in accumulator.Scalars(tag):
            scalars[(event.step, tag)] = event.value
    if not scalars:
        sys.exit(f"TensorBoard found no scalars in {run_dir}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    checked = 0
    for row in rows:
        for tag, value in flatten(row):
            if (row["step"], tag) not in scalars:
                sys.exit(f"TensorBoard: step {row['step']}: '{tag}' is not in the event file")
            stored = scalars[(row["step"], tag)]
            expected = struct.unpack("<f", struct.pack("<f", value))[0]
            if not (stored == expected or (math.isnan(stored) and math.isnan(expected))):
                sys.exit(f"TensorBoard: step {row['step']}: '{tag}' is {stored}, {value} in "
                         "metrics.jsonl")
            checked += 1
    print(f"TensorBoard's reader: all {checked} scalars of {len(rows)} metrics lines found")


if __name__ == "__main__":
    main(sys.argv[1])
