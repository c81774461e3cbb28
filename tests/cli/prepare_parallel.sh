#!/usr/bin/env bash
# tests/cli/prepare_parallel.sh: engine_prepare_data with several worker processes writes the
# same .bin/.idx, byte for byte, as one worker, on a JSONL cut into many units (one document
# per sentence of the corpus) plus the .txt corpus; a bad line in the middle of the JSONL stops it
# with the file and line named, exit code 2, and no part files left behind.
# Usage: prepare_parallel.sh ENGINE_PREPARE_DATA CORPUS_DIR
set -euo pipefail
python="$(cd "$(dirname "$0")/../.." && pwd)/tools/python"  # .venv's, tools/setup.sh
prepare="$1"
corpus="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$python" - "$corpus" "$work/lines.jsonl" <<'PY'
import json, os, sys
corpus, out = sys.argv[1], sys.argv[2]
with open(out, "w") as f:
    for name in sorted(os.listdir(corpus)):
        for sentence in open(os.path.join(corpus, name), encoding="utf-8").read().split(". "):
            if sentence.strip():
                f.write(json.dumps({"text": sentence + "."}) + "\n")
PY
"$prepare" --workers 1 --quiet -o "$work/one" "$work/lines.jsonl" "$corpus" > /dev/null
"$prepare" --workers 3 --chunk-mb 0.03 -o "$work/three" "$work/lines.jsonl" "$corpus" \
  > /dev/null 2> "$work/progress.txt"
cmp "$work/one.bin" "$work/three.bin"
cmp "$work/one.idx" "$work/three.idx"
grep -q "prepare: 100.0%" "$work/progress.txt"
documents=$("$python" -c "import sys; print(sum(1 for _ in open(sys.argv[1])))" "$work/lines.jsonl")
echo "workers 1 and 3 agree on $documents JSONL documents and the .txt corpus"

# A malformed line half way: named, exit 2, nothing left.
"$python" - "$work/lines.jsonl" "$work/bad.jsonl" <<'PY'
import sys
lines = open(sys.argv[1]).readlines()
lines[len(lines) // 2] = '{"text": 5}\n'
open(sys.argv[2], "w").writelines(lines)
PY
bad_line=$(( $(wc -l < "$work/lines.jsonl") / 2 + 1 ))
set +e
"$prepare" --workers 3 --chunk-mb 0.03 --quiet -o "$work/bad" "$work/bad.jsonl" 2> "$work/err.txt"
code=$?
set -e
[ "$code" -eq 2 ] || { echo "FAIL: exit code $code"; exit 1; }
grep -q "bad.jsonl:$bad_line: expected a JSON object" "$work/err.txt" || {
  echo "FAIL: the error does not name line $bad_line:"; cat "$work/err.txt"; exit 1; }
if ls "$work"/bad* 2>/dev/null | grep -q part; then echo "FAIL: part files left"; exit 1; fi
[ ! -e "$work/bad.bin" ] || { echo "FAIL: a dataset was written"; exit 1; }
echo "a bad line is named (line $bad_line) and nothing is written"
