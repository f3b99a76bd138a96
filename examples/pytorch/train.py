#!/usr/bin/env python3
"""Trains the runs of examples/pytorch/import.toml: a small causal transformer with two attention
implementations, at two precisions, over three seeds, saving every run's weights with torch.save and
with h5py, as a PyTorch user's own training would. Then `fastudy run examples/pytorch/import.toml`
judges the attention implementation against seed and precision.

  attention  math    PyTorch's math attention: softmax(Q K^T / sqrt(d) + causal mask) V in one piece
             flash2  FlashAttention-2's forward as a loop of PyTorch ops: query blocks outside, key/value
                     blocks inside, the online softmax (running max m and sum l, fp32 statistics and
                     accumulator, P cast to V's dtype for P V), causal blocks above the diagonal skipped;
                     its backward is autograd's through the loop
  precision  fp32    everything in fp32
             bf16    torch.autocast("cpu", bfloat16): the matmuls in bf16, fp32 master weights (so the
                     checkpoints are fp32 as for fp32 runs)
  seed       1 2 3   the initialisation; the data (counting with a stride) is the same for every run

Files: OUT/{attention}-{precision}-s{seed}/step_{step}.pt (torch.save of dict(model.state_dict()):
LibTorch 1.13 cannot read the OrderedDict that state_dict() returns, a plain dict it can) and .h5 (one
dataset per tensor, named by its state-dict key). CPU only; Debian's python3-torch is enough.

Usage: train.py [--out DIR] [--steps N] [--save-every K] [--threads T]
"""
import argparse
import math
import os

import h5py
import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTION = ["math", "flash2"]
PRECISION = ["fp32", "bf16"]
SEEDS = [1, 2, 3]
# The model and data (B batch, H heads, N sequence, D head dim).
VOCAB, D_MODEL, HEADS, LAYERS, SEQ, BATCH, BLOCK = 32, 32, 2, 2, 32, 8, 8
DATA_SEED = 1234


def attention_math(q, k, v):
    n = q.shape[-2]
    s = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
    return p.to(v.dtype) @ v


def attention_flash2(q, k, v, block=BLOCK):
    n, d = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    out = []
    for i in range(0, n, block):
        qi = q[..., i:i + block, :]
        rows = qi.shape[-2]
        m = torch.full(qi.shape[:-1] + (1,), float("-inf"))
        l = torch.zeros(qi.shape[:-1] + (1,))
        acc = torch.zeros(qi.shape[:-1] + (d,))
        for j in range(0, i + rows, block):  # causal: key blocks after the query block are all masked
            kj, vj = k[..., j:j + block, :], v[..., j:j + block, :]
            s = (qi @ kj.transpose(-1, -2)).float() * scale
            if j + kj.shape[-2] > i:  # the diagonal block: mask keys after each query
                qpos = torch.arange(i, i + rows).unsqueeze(1)
                kpos = torch.arange(j, j + kj.shape[-2]).unsqueeze(0)
                s = s.masked_fill(kpos > qpos, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = alpha * l + p.sum(dim=-1, keepdim=True)
            acc = alpha * acc + (p.to(vj.dtype) @ vj).float()
            m = m_new
        out.append(acc / l)
    return torch.cat(out, dim=-2).to(v.dtype)


class Block(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention = attention
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, 3 * D_MODEL)
        self.proj = nn.Linear(D_MODEL, D_MODEL)
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.fc = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.out = nn.Linear(4 * D_MODEL, D_MODEL)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D_MODEL, dim=-1)
        q, k, v = (t.reshape(b, n, HEADS, D_MODEL // HEADS).transpose(1, 2) for t in (q, k, v))
        y = (attention_math if self.attention == "math" else attention_flash2)(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, D_MODEL))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.blocks = nn.ModuleList(Block(attention) for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def batch(step):
    """Counting with a stride: each sequence starts at a random token and steps by 1, 2 or 3 (mod the
    vocabulary), so the next token follows from the last two (the same batches for every run)."""
    g = torch.Generator().manual_seed(DATA_SEED + step)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    stride = torch.randint(1, 4, (BATCH, 1), generator=g)
    seq = (start + stride * torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def save(model, folder, step):
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    torch.save(dict(state), os.path.join(folder, f"step_{step}.pt"))
    with h5py.File(os.path.join(folder, f"step_{step}.h5"), "w") as f:
        for name, t in state.items():
            f.create_dataset(name, data=t.numpy())


def train(attention, precision, seed, out, steps, save_every):
    torch.manual_seed(seed)
    model = Model(attention)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    folder = os.path.join(out, f"{attention}-{precision}-s{seed}")
    os.makedirs(folder, exist_ok=True)
    loss = None
    for step in range(1, steps + 1):
        x, y = batch(step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % save_every == 0 or step == steps:
            save(model, folder, step)
    return loss.item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: PyTorch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    for attention in ATTENTION:
        for precision in PRECISION:
            for seed in SEEDS:
                loss = train(attention, precision, seed, args.out, args.steps, args.save_every)
                print(f"{attention}-{precision}-s{seed}: loss {loss:.4f} after {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
