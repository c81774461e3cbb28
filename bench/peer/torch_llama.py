"""bench/peer/torch_llama.py: the PyTorch training loop a user would write for the same Llama
as bench_throughput (nn.Linear layers, RMSNorm, rotate-half RoPE, GQA, SwiGLU, causal
F.scaled_dot_product_attention, F.cross_entropy, torch.optim.AdamW with fp32 weights), timed
on random tokens, in one of three modes:
  eager     fp32, eager;
  bf16      the same under torch.autocast(device_type="cpu", dtype=torch.bfloat16);
  compiled  fp32, the model through torch.compile (Inductor's C++ code for the CPU; the
            warm-up step pays the compilation);
  compiled_bf16  the compiled model under the same bf16 autocast.
With --device cuda the same on the GPU (autocast on cuda). Prints one JSON line:
{"tokens_per_s": ..., "step_s": ..., "threads": ..., "mode": ..., "device": ..., "parameters": ...}. Run
with tools/python (torch 2.11) by bench/peer/run_peer.py; the threads and allocator settings
come from its command line and environment."""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, hidden, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, hidden, heads, kv_heads, ffn, eps):
        super().__init__()
        self.attn_norm = RMSNorm(hidden, eps)
        self.attn = Attention(hidden, heads, kv_heads)
        self.mlp_norm = RMSNorm(hidden, eps)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.blocks = nn.ModuleList(
            Block(a.hidden, a.heads, a.kv_heads, a.ffn, 1e-5) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, 1e-5)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        head_dim = a.hidden // a.heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(a.seq).float(), inv)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.head(self.norm(x))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("hidden", 512), ("layers", 8), ("heads", 8), ("kv_heads", 8),
                          ("ffn", 1536), ("vocab", 32000), ("seq", 256), ("batch", 4),
                          ("steps", 5), ("threads", 2)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--mode", choices=["eager", "bf16", "compiled", "compiled_bf16"],
                   default="eager")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama(a).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    forward = torch.compile(model) if a.mode.startswith("compiled") else model
    autocast = torch.autocast(device_type=a.device, dtype=torch.bfloat16,
                              enabled=a.mode in ("bf16", "compiled_bf16"))
    g = torch.Generator().manual_seed(1)

    def step():
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g).to(a.device)
        with autocast:
            logits = forward(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    step()  # warm-up (loss.item() waits for the GPU)
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    seconds = time.perf_counter() - start
    parameters = sum(p.numel() for p in model.parameters())
    print(json.dumps({"tokens_per_s": a.steps * a.batch * a.seq / seconds,
                      "step_s": seconds / a.steps, "threads": a.threads, "mode": a.mode,
                      "device": a.device, "parameters": parameters}))


if __name__ == "__main__":
    main()
