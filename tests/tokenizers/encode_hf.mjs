// tests/tokenizers/encode_hf.mjs: the independent reference for Retort's byte-level BPE:
// Hugging Face's own JavaScript implementation (@huggingface/tokenizers, installed by
// tools/setup.sh into build/npm) encodes each file (read as UTF-8, invalid bytes replaced by
// U+FFFD as Node decodes) and prints one JSON object {file: ids}.
// Usage: node encode_hf.mjs NODE_MODULES TOKENIZER_DIR FILE...
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const [modules, tokenizerDir, ...files] = process.argv.slice(2);
const entry = path.join(modules, "@huggingface", "tokenizers", "dist", "tokenizers.mjs");
const { Tokenizer } = await import(pathToFileURL(entry).href);
const json = JSON.parse(fs.readFileSync(path.join(tokenizerDir, "tokenizer.json"), "utf8"));
const configPath = path.join(tokenizerDir, "tokenizer_config.json");
const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
const tokenizer = new Tokenizer(json, config);
const out = {};
for (const file of files) out[file] = tokenizer.encode(fs.readFileSync(file, "utf8")).ids;
process.stdout.write(JSON.stringify(out));
