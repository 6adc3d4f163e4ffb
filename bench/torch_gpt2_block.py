"""The GPT-2 model the PyTorch benchmarks share (bench/pytorch_cpu_step.py,
bench/pytorch_gpu_step.py): pre-LN blocks with causal attention (scaled_dot_product_attention where
torch has it, else an explicit masked softmax) and a tanh GELU MLP, the tied lm_head, and the
vocabulary padded as Kiln pads it when cfg["padded_vocab"] says so."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self, C: int, H: int, Tmax: int):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        if not HAVE_SDPA:
            self.register_buffer("mask", torch.ones(Tmax, Tmax, dtype=torch.bool).tril(), persistent=False)

    def attn(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        C, Tmax = cfg["n_embd"], cfg["block_size"]
        self.V = cfg["vocab_size"]
        self.Vp = cfg.get("padded_vocab", self.V)
        self.wte = nn.Embedding(self.Vp, C)            # rows V..Vp-1: padding, as in Kiln
        self.wpe = nn.Embedding(Tmax, C)
        self.h = nn.ModuleList(Block(C, cfg["n_head"], Tmax) for _ in range(cfg["n_layer"]))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        # GPT-2's initialisation (residual projections scaled by 1/sqrt(2L)): the time does not
        # depend on it; it keeps the loss where Kiln's is.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg["n_layer"]) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)        # tied lm_head, no bias: [B, T, Vp]
        logits = logits[..., :self.V].float()                    # padded logits out; fp32 loss
        return F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))
