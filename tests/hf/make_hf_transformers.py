"""tests/hf/make_hf_transformers.py: Hugging Face's own models as the reference for Retort's
import and export (run with tools/python: transformers, safetensors and torch from PyPI,
pinned in tools/requirements.txt).

  make  OUT_DIR VARIANT   builds a Llama, Mistral, Qwen2, Qwen3 or Phi-3 ForCausalLM from a
                          config with random weights, writes it with save_pretrained
                          (config.json and safetensors, as a user's checkpoint is), and writes
                          reference.safetensors: a batch of tokens (I64), transformers' own
                          fp32 forward logits for them (F32), and a prompt (the first row's
                          first PROMPT tokens) with the GENERATED tokens transformers'
                          greedy generate() continues it with (I64); and one training
                          step in float64: STEP_LOSS (F64), the mean next-token
                          cross-entropy of the tokens, and in step_gradients/ (config.json
                          and model.safetensors, so Retort's importer reads them as it reads
                          weights) the gradient of every parameter under its own name.
  check DIR REFERENCE_DIR loads DIR (a Retort export) with from_pretrained, whose weights
                          the safetensors library reads, runs the same tokens and exits 1
                          unless its logits match the reference within 1e-5 of their largest
                          magnitude.

VARIANT: llama_gqa_tied | llama_gqa_untied | mistral_window | qwen2_bias | qwen25_bias_tied |
         mistral_head_dim | llama3_rope | llama_linear_rope | qwen2_yarn (the RoPE scalings'
         original context is 8 positions, shorter than the reference's sequence) |
         qwen3_qk_norm | phi3_layout"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched: every model is built here
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import shutil

import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from safetensors.torch import load_file, save_file

HIDDEN, LAYERS, FFN, VOCAB, SEQ, BATCH = 32, 2, 48, 101, 12, 2
PROMPT, GENERATED = 5, 10  # the generation runs past the RoPE scalings' original context
THETA, EPS = 5000.0, 1e-5
# heads, kv heads, tied head, sliding window, class
VARIANTS = {
    "llama_gqa_tied": (4, 2, True, None, "Llama"),
    "llama_gqa_untied": (4, 2, False, None, "Llama"),
    "mistral_window": (4, 1, False, 5, "Mistral"),
    "qwen2_bias": (4, 2, False, None, "Qwen2"),  # Qwen2's q, k and v projections carry a bias
    "qwen25_bias_tied": (4, 2, True, None, "Qwen2"),  # Qwen2.5's small models: bias, tied head
    "mistral_head_dim": (4, 2, False, None, "Mistral"),  # Mistral-Nemo's own head_dim, below
    "llama3_rope": (4, 2, True, None, "Llama"),  # Llama 3.2's RoPE scaling, below
    "llama_linear_rope": (4, 2, False, None, "Llama"),
    "qwen2_yarn": (4, 2, False, None, "Qwen2"),
    "qwen3_qk_norm": (4, 2, True, None, "Qwen3"),  # per-head q and k norms, its own head_dim
    "phi3_layout": (4, 2, False, None, "Phi3"),  # q, k, v and gate, up stored fused
}
# Config keys beyond the shared ones: heads 12 wide where hidden / heads is 8; RoPE scalings
# whose original context (8) is shorter than SEQ.
EXTRA = {
    "mistral_head_dim": {"head_dim": 12},
    "qwen3_qk_norm": {"head_dim": 12},
    "phi3_layout": {"pad_token_id": None},  # its default id (32000) is beyond this vocabulary
    "llama3_rope": {"rope_parameters": {"rope_type": "llama3", "rope_theta": THETA, "factor": 4.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8}},
    "llama_linear_rope": {"rope_parameters": {"rope_type": "linear", "rope_theta": THETA,
                                              "factor": 2.0}},
    "qwen2_yarn": {"rope_parameters": {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0,
                                       "original_max_position_embeddings": 8}},
}


def build(variant):
    heads, kv, tied, window, family = VARIANTS[variant]
    config_class = getattr(transformers, family + "Config")
    model_class = getattr(transformers, family + "ForCausalLM")
    kwargs = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
                  num_hidden_layers=LAYERS, num_attention_heads=heads, num_key_value_heads=kv,
                  rms_norm_eps=EPS, tie_word_embeddings=tied, hidden_act="silu",
                  max_position_embeddings=64, rope_theta=THETA)
    if window:
        kwargs["sliding_window"] = window
    kwargs.update(EXTRA.get(variant, {}))
    config = config_class(**kwargs)
    config._attn_implementation = "eager"  # the plain softmax(QK^T)V, masks as the model builds them
    torch.manual_seed(sum(map(ord, variant)))
    model = model_class(config).float().eval()
    with torch.no_grad():  # random weights far from the initialiser's near-identity norms
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight")
                    else 0.2 * torch.randn_like(p))
    return model


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


class Float64Names:
    """transformers names torch.float and torch.float32 where it computes the RoPE frequencies
    and tables and the attention softmax, so a float64 model still runs those in float32
    (errors near 1e-7). Inside this block both names mean float64; nothing else changes."""

    def __enter__(self):
        self.saved = torch.float, torch.float32
        torch.float = torch.float32 = torch.float64

    def __exit__(self, *_):
        torch.float, torch.float32 = self.saved


def float64_step(model, tokens, out):
    """The loss and every gradient of one training step of `model` in float64. The loss is
    computed here: transformers' own causal-LM loss casts the logits to float32 first."""
    model = model.double()
    with Float64Names():
        for module in model.modules():  # the tables again, now in float64
            if type(module).__name__.endswith("RotaryEmbedding"):
                init = (module.compute_default_rope_parameters if module.rope_type == "default"
                        else ROPE_INIT_FUNCTIONS[module.rope_type])
                inv_freq, module.attention_scaling = init(module.config)
                module.inv_freq = inv_freq.to(torch.float64)
        logits = model(input_ids=tokens).logits
        assert logits.dtype == torch.float64
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)),
                                                 tokens[:, 1:].reshape(-1))
        loss.backward()
    gradients = os.path.join(out, "step_gradients")
    os.makedirs(gradients, exist_ok=True)
    shutil.copy(os.path.join(out, "config.json"), gradients)
    save_file({name: p.grad.contiguous() for name, p in model.named_parameters()},
              os.path.join(gradients, "model.safetensors"))
    return loss.detach()


def make(out, variant):
    model = build(variant)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(VOCAB, (BATCH, SEQ), generator=generator)
    prompt = tokens[:1, :PROMPT].clone()  # its own storage: safetensors refuses shared ones
    with torch.no_grad():  # greedy; no end-of-text token may stop it early
        generated = model.generate(prompt, max_new_tokens=GENERATED, min_new_tokens=GENERATED,
                                   do_sample=False, pad_token_id=0)[:, PROMPT:]
    logits = logits_of(model, tokens).contiguous()
    save_file({"tokens": tokens, "logits": logits, "prompt": prompt,
               "generated": generated.contiguous(), "step_loss": float64_step(model, tokens, out)},
              os.path.join(out, "reference.safetensors"))


def check(exported, reference_dir):
    reference = load_file(os.path.join(reference_dir, "reference.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        exported, dtype=torch.float32, attn_implementation="eager").eval()
    got = logits_of(model, reference["tokens"])
    want = reference["logits"]
    error = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print(f"{exported}: {type(model).__name__}, largest logit error {error:.3g} of {scale:.3g}")
    return 0 if error <= 1e-5 * scale else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
