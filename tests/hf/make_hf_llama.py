"""tests/hf/make_hf_llama.py: an independent reference for Retort's Hugging Face import.

Writes a tiny random Llama-family model in Hugging Face layout (config.json and safetensors,
written here with json and struct, not with Retort's writer) and the logits of a plain-torch
implementation of the Hugging Face Llama forward (RMSNorm, rotate-half RoPE, GQA by
repeating kv heads, Mistral's sliding window, Qwen2's qkv bias, SwiGLU, tied or untied head)
for a fixed batch of tokens, into reference.safetensors (tokens as I64, logits as F32).

Usage: make_hf_llama.py OUT_DIR VARIANT [VOCAB]
VARIANT: llama_gqa_tied | llama_untied_sharded | qwen2_bias | mistral_window | llama_bf16"""
import json
import os
import struct
import sys

import torch

VARIANTS = {
    # model_type, heads, kv_heads, tied, window, bias, dtype, shards
    "llama_gqa_tied": dict(model_type="llama", heads=4, kv=2, tied=True),
    "llama_untied_sharded": dict(model_type="llama", heads=4, kv=4, tied=False, shards=3),
    "qwen2_bias": dict(model_type="qwen2", heads=4, kv=2, tied=False, bias=True),
    "mistral_window": dict(model_type="mistral", heads=4, kv=1, tied=False, window=5),
    "llama_bf16": dict(model_type="llama", heads=4, kv=2, tied=False, dtype="BF16"),
}
HIDDEN, LAYERS, FFN, VOCAB, SEQ, BATCH = 32, 2, 48, 101, 12, 2
THETA, EPS = 5000.0, 1e-5


def st_bytes(t, dtype):
    t = t.contiguous()
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    if dtype == "I64":
        return t.to(torch.int64).numpy().tobytes()
    return t.to(torch.float32).numpy().tobytes()


def write_safetensors(path, tensors):
    """tensors: list of (name, tensor, dtype name); raw little-endian data after a JSON header."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t, dtype in tensors:
        blob = st_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(w, v, tokens):
    heads, kv, d = v["heads"], v["kv"], HIDDEN // v["heads"]
    x = w["model.embed_tokens.weight"][tokens]
    seq = tokens.shape[1]
    inv_freq = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    i = torch.arange(seq).unsqueeze(1)
    j = torch.arange(seq).unsqueeze(0)
    allowed = j <= i
    if v.get("window"):
        allowed = allowed & (j > i - v["window"])  # Mistral: the last `window` positions
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"])

        def proj(name):
            out = h @ w[p + f"self_attn.{name}.weight"].T
            if v.get("bias"):
                out = out + w[p + f"self_attn.{name}.bias"]
            return out

        q = proj("q_proj").view(BATCH, seq, heads, d).transpose(1, 2)
        k = proj("k_proj").view(BATCH, seq, kv, d).transpose(1, 2)
        vv = proj("v_proj").view(BATCH, seq, kv, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(heads // kv, dim=1)
        vv = vv.repeat_interleave(heads // kv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / (d ** 0.5)
        scores = scores.masked_fill(~allowed, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ vv
        attn = attn.transpose(1, 2).reshape(BATCH, seq, HIDDEN)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if v["tied"] else w["lm_head.weight"]
    return x @ head.T


def main():
    global VOCAB
    out, name = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:  # a real tokenizer's vocabulary (examples/hf_path.sh)
        VOCAB = int(sys.argv[3])
    v = VARIANTS[name]
    torch.manual_seed(sum(map(ord, name)))
    heads, kv, d = v["heads"], v["kv"], HIDDEN // v["heads"]
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (HIDDEN,)
        shapes[p + "self_attn.q_proj.weight"] = (heads * d, HIDDEN)
        shapes[p + "self_attn.k_proj.weight"] = (kv * d, HIDDEN)
        shapes[p + "self_attn.v_proj.weight"] = (kv * d, HIDDEN)
        if v.get("bias"):
            shapes[p + "self_attn.q_proj.bias"] = (heads * d,)
            shapes[p + "self_attn.k_proj.bias"] = (kv * d,)
            shapes[p + "self_attn.v_proj.bias"] = (kv * d,)
        shapes[p + "self_attn.o_proj.weight"] = (HIDDEN, heads * d)
        shapes[p + "post_attention_layernorm.weight"] = (HIDDEN,)
        shapes[p + "mlp.gate_proj.weight"] = (FFN, HIDDEN)
        shapes[p + "mlp.up_proj.weight"] = (FFN, HIDDEN)
        shapes[p + "mlp.down_proj.weight"] = (HIDDEN, FFN)
    shapes["model.norm.weight"] = (HIDDEN,)
    if not v["tied"]:
        shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    dtype = v.get("dtype", "F32")
    weights = {}
    for n, s in shapes.items():
        t = 1.0 + 0.1 * torch.randn(s) if n.endswith("norm.weight") else 0.2 * torch.randn(s)
        if dtype == "BF16":  # the model is what the file holds
            t = t.to(torch.bfloat16).to(torch.float32)
        weights[n] = t
    os.makedirs(out, exist_ok=True)
    names = list(shapes)
    shards = v.get("shards", 1)
    if shards == 1:
        write_safetensors(os.path.join(out, "model.safetensors"),
                          [(n, weights[n], dtype) for n in names])
    else:
        weight_map = {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = names[s::shards]
            write_safetensors(os.path.join(out, file), [(n, weights[n], dtype) for n in part])
            weight_map.update({n: file for n in part})
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    config = {"model_type": v["model_type"], "vocab_size": VOCAB, "hidden_size": HIDDEN,
              "num_hidden_layers": LAYERS, "num_attention_heads": heads,
              "num_key_value_heads": kv, "intermediate_size": FFN, "rope_theta": THETA,
              "rms_norm_eps": EPS, "tie_word_embeddings": v["tied"], "hidden_act": "silu",
              "rope_scaling": None}
    if v["model_type"] == "mistral":
        config["sliding_window"] = v["window"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    tokens = torch.randint(VOCAB, (BATCH, SEQ))
    with torch.no_grad():
        logits = forward({n: t.double() for n, t in weights.items()}, v, tokens)
    write_safetensors(os.path.join(out, "reference.safetensors"),
                      [("tokens", tokens, "I64"), ("logits", logits.float(), "F32")])


if __name__ == "__main__":
    main()
