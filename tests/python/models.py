"""Small test models shared by the Python tests and the benchmarks (issues 3-7
reuse them). Each is tiny enough that a training step takes milliseconds on a
CPU core, and covers a structure modelpar must capture exactly:

| name        | what it exercises |
|-------------|-------------------|
| `mlp`       | Linear / ReLU / Tanh chain |
| `cnn`       | Conv2d + BatchNorm2d (running statistics: buffers mutated in train mode), max pool, adaptive pool |
| `unet`      | encoder/decoder with long skip connections (cat across the network), transposed conv, upsampling |
| `gpt`       | decoder-only transformer: token + position embeddings, tied input/output embedding, causal attention (SDPA), LayerNorm, GELU, dropout, cross-entropy |
| `inception` | parallel branches of different depth concatenated on channels |
| `looped`    | forward loops over a ModuleList and branches on config flags (Dynamo unrolls it) |

`CASES` maps each name to a `Case`: a factory for the model, one for a batch
(inputs and target, on a given seed) and the loss. Shapes are fixed by the
factory; `batch(seed, n)` changes only the batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tolerances import Reordered

__all__ = [
    "MLP", "SmallCNN", "UNet", "GPTConfig", "GPT", "InceptionNet", "LoopedConfig", "LoopedNet",
    "Case", "CASES", "GraphBroken", "GRAPH_BREAKS",
]


class MLP(nn.Module):
    def __init__(self, d_in: int = 16, d_hidden: int = 32, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.tanh(self.fc2(torch.relu(self.fc1(x)))))


class SmallCNN(nn.Module):
    """Two conv + BatchNorm blocks and a linear classifier."""

    def __init__(self, channels: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class _ConvBlock(nn.Sequential):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(c_out, c_out, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    """A two-level U-Net: the encoder outputs skip over the bottleneck to the
    decoder (long-lived activations, cat of distant values)."""

    def __init__(self, channels: int = 3, base: int = 4, classes: int = 2) -> None:
        super().__init__()
        self.enc1 = _ConvBlock(channels, base)
        self.enc2 = _ConvBlock(base, 2 * base)
        self.bottleneck = _ConvBlock(2 * base, 4 * base)
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, 2, stride=2)
        self.dec2 = _ConvBlock(4 * base, 2 * base)
        self.up1 = nn.Upsample(scale_factor=2, mode="nearest")
        self.reduce1 = nn.Conv2d(2 * base, base, 1)
        self.dec1 = _ConvBlock(2 * base, base)
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        b = self.bottleneck(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], dim=1))
        d1 = self.dec1(torch.cat([self.reduce1(self.up1(d2)), e1], dim=1))
        return self.head(d1)


@dataclass
class GPTConfig:
    vocab: int = 64
    block: int = 16
    d_model: int = 32
    heads: int = 4
    layers: int = 2
    dropout: float = 0.0


class _Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.p = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.p if self.training else 0.0)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class _Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = _Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """A GPT-style decoder; the output projection shares the token embedding."""

    def __init__(self, cfg: GPTConfig | None = None) -> None:
        super().__init__()
        cfg = cfg or GPTConfig()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.block, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("out.weight") or name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class _Inception(nn.Module):
    def __init__(self, c_in: int, c: int) -> None:
        super().__init__()
        self.b1 = nn.Conv2d(c_in, c, 1)
        self.b2 = nn.Sequential(nn.Conv2d(c_in, c, 1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1))
        self.b3 = nn.Sequential(nn.Conv2d(c_in, c, 1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1),
                                nn.ReLU(), nn.Conv2d(c, c, 3, padding=1))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), nn.Conv2d(c_in, c, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1))


class InceptionNet(nn.Module):
    def __init__(self, channels: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(channels, 8, 3, padding=1)
        self.mix = _Inception(8, 4)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mix(F.relu(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@dataclass
class LoopedConfig:
    layers: int = 3
    width: int = 16
    residual: bool = True
    norm_every: int = 2         # a LayerNorm after every 2nd layer
    activations: tuple[str, ...] = field(default=("relu", "gelu", "silu"))


class LoopedNet(nn.Module):
    """Python control flow over config flags: a loop over layers, per-layer
    branches. Dynamo specialises all of it away; the captured graph is
    straight-line."""

    def __init__(self, cfg: LoopedConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or LoopedConfig()
        self.layers = nn.ModuleList(nn.Linear(cfg.width, cfg.width) for _ in range(cfg.layers))
        self.norms = nn.ModuleDict({str(i): nn.LayerNorm(cfg.width)
                                    for i in range(cfg.layers) if (i + 1) % cfg.norm_every == 0})
        self.out = nn.Linear(cfg.width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            act = self.cfg.activations[i % len(self.cfg.activations)]
            h = layer(x)
            h = F.relu(h) if act == "relu" else F.gelu(h) if act == "gelu" else F.silu(h)
            x = x + h if self.cfg.residual else h
            if str(i) in self.norms:
                x = self.norms[str(i)](x)
        return self.out(x).squeeze(-1)


@dataclass
class Case:
    """A model, a way to make a batch, and its loss."""
    make_model: Callable[[], nn.Module]
    batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (seed, batch size) -> (x, y)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # How far a reordered fp32 run may differ from eager (tests/python/tolerances.py): the
    # longest sum in a step (hidden width, C*k*k, or the batch*positions a weight gradient or
    # batch norm adds up) and the number of reductions in sequence (forward + backward layers).
    tol: Reordered
    batch_size: int = 4


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(c: int, hw: int, classes: int) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    def batch(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen(seed)
        return torch.randn(n, c, hw, hw, generator=g), torch.randint(0, classes, (n,), generator=g)
    return batch


def _gpt_batch(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    cfg = GPTConfig()
    idx = torch.randint(0, cfg.vocab, (n, cfg.block), generator=g)
    return idx, torch.roll(idx, -1, dims=1)


def _gpt_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def _unet_batch(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 2, (n, 16, 16), generator=g)


def _vector_batch(d_in: int, d_out: int | None) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    def batch(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _gen(seed)
        shape = (n, d_out) if d_out else (n,)
        return torch.randn(n, d_in, generator=g), torch.randn(*shape, generator=g)
    return batch


CASES: dict[str, Case] = {
    # hidden width 32, batch 8; 3 linear layers, forward and backward
    "mlp": Case(MLP, _vector_batch(16, 4), F.mse_loss, Reordered(32, depth=6), batch_size=8),
    # conv1's weight gradient and bn1 sum over batch 4 x 16 x 16 = 1024; conv, conv, linear
    "cnn": Case(SmallCNN, _images(3, 16, 10), F.cross_entropy, Reordered(1024, depth=6)),
    # batch 2 x 16 x 16 = 512 positions; 13 convolutions on the longest path
    "unet": Case(UNet, _unet_batch, F.cross_entropy, Reordered(512, depth=26), batch_size=2),
    # MLP width 4 x 32 = 128 (batch 4 x 16 tokens = 64); 2 blocks of ~8 reductions + head
    "gpt": Case(GPT, _gpt_batch, _gpt_loss, Reordered(128, depth=34)),
    # batch 4 x 8 x 8 = 256 positions; stem, three convs of the deepest branch, fc
    "inception": Case(InceptionNet, _images(3, 8, 10), F.cross_entropy, Reordered(256, depth=10)),
    # width 16, batch 8; 3 looped linears + the output layer
    "looped": Case(LoopedNet, _vector_batch(16, None), F.mse_loss, Reordered(16, depth=8),
                   batch_size=8),
}


class GraphBroken(nn.Module):
    """Graph breaks (Note [A graph the pipeline cannot cut] in
    compile_backend.py) cut it into a piece with one layer (embed), one with
    none (the tanh between two breaks), one with four (the blocks) and,
    with the loss, the head's."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU())
                                      for _ in range(4)])
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        torch._dynamo.graph_break()
        h = torch.tanh(h) * 0.5
        torch._dynamo.graph_break()
        h = self.blocks(h)
        torch._dynamo.graph_break()
        return self.head(h)


# Not in CASES: the suites parametrized over CASES compile each model as one
# graph. 16-wide dot products and 4-way micro-batch sums, 6 deep.
def _classes(seed: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


GRAPH_BREAKS = Case(GraphBroken, _classes, F.cross_entropy,
                    Reordered(16, depth=6), batch_size=8)

