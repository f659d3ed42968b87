"""Small example models: the demo, the tests, the benchmarks and ``tools/`` all build them from here."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """A pre-LN transformer block; ``attention="sdpa"`` uses scaled_dot_product_attention, ``"softmax"`` spells
    attention out with an explicit softmax."""

    def __init__(self, dim: int = 64, heads: int = 4, attention: str = "sdpa", dropout: float = 0.0) -> None:
        super().__init__()
        if attention not in ("sdpa", "softmax"):
            raise ValueError(f"attention={attention!r}; use 'sdpa' or 'softmax'")
        self.heads, self.attention = heads, attention
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def _attend(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.drop(self._attend(self.ln1(x)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class Stack(nn.Module):
    def __init__(self, depth: int = 2, dim: int = 64, heads: int = 4, attention: str = "sdpa") -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block(dim, heads, attention) for _ in range(depth)])

    def forward(self, x):
        return self.blocks(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of rotary position embedding, (seq, head_dim): the halves rotate together."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class LlamaBlock(nn.Module):
    """RMSNorm, rotary embeddings, grouped-query attention (``kv_heads`` < ``heads``) and a SwiGLU MLP: written
    here, independently of transformers, so that no tuning to one library's model goes unnoticed."""

    def __init__(self, dim: int = 64, heads: int = 4, kv_heads: int = 2, hidden: int | None = None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        hidden = hidden or 8 * dim // 3
        self.n1, self.n2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def _attend(self, x, cos, sin):
        b, t, d = x.shape
        q = self.q(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = _rotate(q, cos[:t], sin[:t]), _rotate(k, cos[:t], sin[:t])
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x, cos, sin):
        x = x + self._attend(self.n1(x), cos, sin)
        gate, up = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class LlamaStack(nn.Module):
    """``depth`` LlamaBlocks sharing one pair of rotary tables (buffers), then a final RMSNorm."""

    def __init__(self, depth: int = 2, dim: int = 64, heads: int = 4, kv_heads: int = 2, max_seq: int = 512) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(LlamaBlock(dim, heads, kv_heads) for _ in range(depth))
        self.norm = RMSNorm(dim)
        cos, sin = rope_tables(max_seq, dim // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.norm(x)


class ConvNet(nn.Module):
    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)  # BatchNorm follows
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


class GroupNormResBlock(nn.Module):
    """GroupNorm -> SiLU -> conv, twice, plus the residual: the diffusion-model block (docs/DESIGN.md §7)."""

    def __init__(self, cin: int, cout: int, groups: int = 8) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(groups, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.n2, self.c2 = nn.GroupNorm(groups, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.sc = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        return self.sc(x) + self.c2(F.silu(self.n2(h)))


def groupnorm_convnet() -> nn.Module:
    """Issue #20's 20-line net: its budget plans went wrong under Inductor's layout optimisation."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        GroupNormResBlock(32, 32),
        GroupNormResBlock(32, 64),
        nn.SiLU(),
        nn.Conv2d(64, 3, 3, padding=1),
    )


class DropoutMLP(nn.Module):
    """``y = dropout(x * w)``: the gradient implied by the compiled forward's own mask is ``sum(y / w)``."""

    def __init__(self, dim: int = 64, p: float = 0.5) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.rand(dim) + 0.5)
        self.p = p

    def forward(self, x):
        return F.dropout(x * self.w, self.p, training=self.training)


def example(name: str, batch: int = 4, seq: int = 32, dim: int = 64):
    """(model, example inputs) for a named example."""
    if name == "mlp":
        return MLP(dim, 4 * dim), (torch.randn(batch * seq, dim),)
    if name == "block_sdpa":
        return Block(dim, attention="sdpa"), (torch.randn(batch, seq, dim),)
    if name == "block_softmax":
        return Block(dim, attention="softmax"), (torch.randn(batch, seq, dim),)
    if name == "stack":
        return Stack(2, dim), (torch.randn(batch, seq, dim),)
    if name == "llama_stack":
        return LlamaStack(2, dim, heads=4, kv_heads=2, max_seq=max(seq, 16)), (torch.randn(batch, seq, dim),)
    if name == "convnet":
        return ConvNet(), (torch.randn(batch, 3, 16, 16),)
    if name == "groupnorm_convnet":
        return groupnorm_convnet(), (torch.randn(2, 3, 32, 32),)
    if name == "dropout":
        return DropoutMLP(dim), (torch.randn(batch * seq, dim),)
    raise ValueError(f"unknown example {name!r}; one of {EXAMPLES}")


EXAMPLES = ("mlp", "block_sdpa", "block_softmax", "stack", "llama_stack", "convnet", "groupnorm_convnet", "dropout")
