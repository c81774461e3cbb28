"""tests/tokenizers/compare_bpe.py: Retort's byte-level BPE (engine_prepare_data --tokenizer)
against Hugging Face's own tokenizers library (the Rust one, PyPI's `tokenizers`, pinned in
tools/requirements.txt; run with tools/python) on every file of the shipped corpus and on an
adversarial file written here: whitespace runs (spaces, tabs,
newlines, CR, no-break and ideographic spaces), digit runs, emoji (with ZWJ sequences and
skin tones), contractions in both cases, accented and non-Latin scripts, special-token
strings in and around words, and invalid UTF-8 (a lone continuation byte, a truncated
sequence, an overlong form, a surrogate, bytes F5..FF). Each file is prepared alone, so its
.bin holds exactly its ids, then the tokenizer's EOS; the .bin is read here as raw int32. The
reference reads each file as UTF-8 with every invalid sequence replaced by U+FFFD (Python's
decoder replaces maximal subparts, as the Unicode standard recommends) and encodes it with
the tokenizer's own post-processor (this tokenizer.json's is ByteLevel: no BOS is added).

With --nfc, both run a copy of the tokenizer with Qwen2's NFC normalizer added (the
adversarial file holds decomposed letters and Hangul jamo, which NFC composes).

Usage: compare_bpe.py ENGINE_PREPARE_DATA TOKENIZER_DIR CORPUS_DIR WORK_DIR [--nfc]"""
import json
import os
import shutil
import subprocess
import sys

from tokenizers import Tokenizer

ADVERSARIAL = (
    "Hello  world\t\ttabs\n\n\n  leading and trailing   \r\n"
    "numbers 1 12 123 1234 12345 3.14159 1,000,000 0x1F 2024-12-03\n"
    "emoji 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✨✨\n"
    "contractions: I'm, you're, he's, we've, they'll, I'd, DON'T, It'S\n"
    "accents: café naïve coöperate façade Æsir straße ÇA\n"
    "scripts: Привет мир 你好，世界 こんにちは 안녕하세요 مرحبا שלום नमस्ते\n"
    "special tokens: <|begin_of_text|>inside<|end_of_text|> <|eot_id|>x<|reserved_special_token_3|>\n"
    "almost special: <|begin_of_text| <begin_of_text|> <||>\n"
    "spaces:\u00a0nbsp\u3000ideographic\u2003em\u2028line sep\n"
    "decomposed: cafe\u0301 n\u0303o A\u030angstro\u0308m \u1100\u1161\u11a8 \u212b\n"
    "unicode space runs:\u3000\u3000word x\u00a0\u00a0\u00a0y \u2003 \u2003\nz\u2002\u2002\n"
    "      \n\t\n \n"
).encode("utf-8") + (
    b"invalid: \x80 lone, \xc3 truncated, \xe2\x82 cut, \xc0\xaf overlong, "
    b"\xed\xa0\x80 surrogate, \xf5\xff\xfe high, \xe0\x80\x80 overlong3, "
    b"\xf0\x80\x80\x80 overlong4, \xf4\x90\x80\x80 beyond, end\xe2"
)


def main():
    prepare, tokenizer, corpus, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    if "--nfc" in sys.argv[5:]:
        nfc_dir = os.path.join(work, "tokenizer_nfc")
        os.makedirs(nfc_dir, exist_ok=True)
        with open(os.path.join(tokenizer, "tokenizer.json")) as f:
            spec = json.load(f)
        spec["normalizer"] = {"type": "NFC"}
        with open(os.path.join(nfc_dir, "tokenizer.json"), "w") as f:
            json.dump(spec, f)
        shutil.copy(os.path.join(tokenizer, "tokenizer_config.json"), nfc_dir)
        tokenizer = nfc_dir
    adversarial = os.path.join(work, "adversarial.txt")
    with open(adversarial, "wb") as f:
        f.write(ADVERSARIAL)
    files = sorted(os.path.join(corpus, n) for n in os.listdir(corpus) if n.endswith(".txt"))
    files.append(adversarial)
    reference_tokenizer = Tokenizer.from_file(os.path.join(tokenizer, "tokenizer.json"))
    reference = {}
    for path in files:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:  # keep \r\n
            reference[path] = reference_tokenizer.encode(f.read()).ids
    eos = None
    with open(os.path.join(tokenizer, "tokenizer_config.json")) as f:
        eos_name = json.load(f)["eos_token"]
    with open(os.path.join(tokenizer, "tokenizer.json")) as f:
        for t in json.load(f)["added_tokens"]:
            if t["content"] == eos_name:
                eos = t["id"]
    failures, tokens = 0, 0
    for i, path in enumerate(files):
        prefix = os.path.join(work, f"doc{i}")
        subprocess.run([prepare, "--tokenizer", tokenizer, "--dtype", "int32", "-o", prefix, path],
                       check=True, capture_output=True)
        with open(prefix + ".bin", "rb") as f:
            data = f.read()
        ours = [int.from_bytes(data[k:k + 4], "little", signed=True) for k in range(0, len(data), 4)]
        want = reference[path] + [eos]
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
