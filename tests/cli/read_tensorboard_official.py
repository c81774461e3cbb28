"""tests/cli/read_tensorboard_official.py RUN_DIR: TensorBoard's own reader (the `tensorboard`
package's EventAccumulator, pinned in tools/requirements.txt; run with tools/python) loads a
run's event files and must find every scalar of every metrics.jsonl line at the same step
with the same value (as float32). Beside read_tensorboard.py, which decodes the records with
code of its own. Exits non-zero naming the first problem."""
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from read_tensorboard import check_metrics


def main(run_dir):
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})  # 0: keep every event
    accumulator.Reload()
    scalars = {}  # (step, tag) -> value
    for tag in accumulator.Tags()["scalars"]:
        for event in accumulator.Scalars(tag):
            scalars[(event.step, tag)] = event.value
    if not scalars:
        sys.exit(f"TensorBoard found no scalars in {run_dir}")
    rows, checked = check_metrics(run_dir, scalars, "TensorBoard: ")
    print(f"TensorBoard's reader: all {checked} scalars of {len(rows)} metrics lines found")


if __name__ == "__main__":
    main(sys.argv[1])
