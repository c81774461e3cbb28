"""tests/tokenizers/compare_sentencepiece.py: Retort's SentencePiece path (engine_prepare_data
--tokenizer X.model, through Debian's libsentencepiece) against PyPI's sentencepiece package
(tools/requirements.txt), on the shipped corpus and the adversarial file of compare_bpe.py.
The model is trained here, from the corpus, as Llama 2's is configured (BPE, byte fallback,
digits split, no normalisation), with that package's trainer: nothing is downloaded. Python
reads each file as UTF-8 with invalid bytes replaced (U+FFFD), then BOS + ids + EOS is what
the .bin must hold.

Usage: compare_sentencepiece.py ENGINE_PREPARE_DATA CORPUS_DIR WORK_DIR"""
import os
import subprocess
import sys

import sentencepiece as spm

from compare_bpe import ADVERSARIAL


def main():
    prepare, corpus, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    files = sorted(os.path.join(corpus, n) for n in os.listdir(corpus) if n.endswith(".txt"))
    model_prefix = os.path.join(work, "llama2_like")
    spm.SentencePieceTrainer.train(
        input=",".join(files), model_prefix=model_prefix, vocab_size=1500, model_type="bpe",
        byte_fallback=True, split_digits=True, character_coverage=1.0,
        normalization_rule_name="identity", num_threads=1, minloglevel=2,
        max_sentence_length=1 << 20)
    adversarial = os.path.join(work, "adversarial.txt")
    with open(adversarial, "wb") as f:
        f.write(ADVERSARIAL)
    files.append(adversarial)
    sp = spm.SentencePieceProcessor(model_file=model_prefix + ".model")
    failures, tokens = 0, 0
    for i, path in enumerate(files):
        with open(path, encoding="utf-8", errors="replace", newline="") as f:  # keep \r\n
            want = [sp.bos_id()] + sp.encode(f.read()) + [sp.eos_id()]
        prefix = os.path.join(work, f"doc{i}")
        subprocess.run([prepare, "--tokenizer", model_prefix + ".model", "--dtype", "int32", "-o",
                        prefix, path], check=True, capture_output=True)
        with open(prefix + ".bin", "rb") as f:
            data = f.read()
        ours = [int.from_bytes(data[k:k + 4], "little", signed=True) for k in range(0, len(data), 4)]
        tokens += len(want)
        if ours != want:
            failures += 1
            at = next((k for k, (a, b) in enumerate(zip(ours, want)) if a != b),
                      min(len(ours), len(want)))
            print(f"MISMATCH {path}: {len(ours)} vs {len(want)} ids, first difference at {at}: "
                  f"ours {ours[max(0, at - 3):at + 5]} reference {want[max(0, at - 3):at + 5]}")
    print(f"{len(files)} files, {tokens} tokens, {failures} mismatching")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
