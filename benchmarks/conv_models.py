"""Convolutional models for the gradient check (``grad_check.py``): small nets with random weights, written here
(torchvision is not a dependency), and two diffusers UNets built from a config (nothing is downloaded).

Every builder seeds ``torch.manual_seed(0)`` first, so two processes build the same weights and inputs, and returns
a ``bench_models.Workload``.  Inputs are 2 x 3 x 32 x 32 and widths 16-64: one cold Inductor compile of a training
step stays within a minute or two on a 2-core CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from bench_models import Workload

BATCH, IMAGE, CLASSES = 2, 32, 10


def _image() -> torch.Tensor:
    return torch.randn(BATCH, 3, IMAGE, IMAGE)


def _mse_to(target: torch.Tensor, field: str | None = None) -> Callable:
    """MSE against a fixed target.  The target is cast to the output's dtype, so that the fp64 copy of the
    workload (grad_check's reference) needs no second target."""

    def loss(out):
        out = out if field is None else getattr(out, field)
        return F.mse_loss(out, target.to(out.dtype))

    return loss


def _cross_entropy_to(labels: torch.Tensor) -> Callable:
    return lambda out: F.cross_entropy(out, labels)


# ---- resnet_gn20: GroupNorm -> SiLU -> conv, twice, plus the residual (issue #20's reproducer) ------------------


class Res(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.sc = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        return self.sc(x) + self.c2(F.silu(self.n2(h)))


def resnet_gn20() -> Workload:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), Res(32, 32), Res(32, 64), nn.SiLU(),
                        nn.Conv2d(64, 3, 3, padding=1))
    x = _image()
    return Workload(net, args=(x,), loss=_mse_to(torch.randn_like(x)))


# ---- a small ResNet: BasicBlocks with BatchNorm ------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, padding=1, bias=False)  # BatchNorm follows: no bias
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.down is None else self.down(x)))


class SmallResNet(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (16, 32, 64)) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU())
        blocks, cin = [], widths[0]
        for i, width in enumerate(widths):
            blocks += [BasicBlock(cin, width, stride=1 if i == 0 else 2), BasicBlock(width, width)]
            cin = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, CLASSES)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class ResNet18(nn.Module):
    """torchvision's ResNet-18 layout (7x7 stem, max pool, BasicBlocks [2, 2, 2, 2] of widths 64-512, 1000
    classes), defined here: torchvision's wheel does not import on this CPU torch (issue #19)."""

    def __init__(self, widths: tuple[int, ...] = (64, 128, 256, 512), classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, padding=3, bias=False), nn.BatchNorm2d(widths[0]),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, padding=1))
        blocks, cin = [], widths[0]
        for i, width in enumerate(widths):
            blocks += [BasicBlock(cin, width, stride=1 if i == 0 else 2), BasicBlock(width, width)]
            cin = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def resnet18() -> Workload:
    """Issue #19's workload: 2 x 3 x 64 x 64 images (the other conv nets here take 32 x 32), 11.7 M parameters."""
    torch.manual_seed(0)
    net = ResNet18()
    x = torch.randn(BATCH, 3, 64, 64)
    return Workload(net, args=(x,), loss=_cross_entropy_to(torch.randint(0, 1000, (BATCH,))))


# ---- a MobileNetV2-style net: inverted residuals, depthwise separable convs, ReLU6 -----------------------------


def _conv_bn(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1, act: bool = True):
    layers = [nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([nn.ReLU6()] if act else []))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.body = nn.Sequential(
            *([_conv_bn(cin, hidden)] if expand != 1 else []),  # pointwise expansion
            _conv_bn(hidden, hidden, 3, stride, groups=hidden),  # depthwise
            _conv_bn(hidden, cout, act=False),  # linear bottleneck: no activation after the projection
        )

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNet(nn.Module):
    """Eager fp32 is 0.2-0.6% off fp64 on the expansions' BatchNorm weights: BatchNorm -> ReLU6 -> depthwise conv
    -> BatchNorm is invariant to the first one's per-channel scale up to BatchNorm's eps (its bias starts at 0), so
    their gradients are ~1e-5 of the model's largest, the remainder of a cancellation.  The rule's eager factor
    takes that into account; every other parameter is within 2e-6."""

    # (expansion, out channels, stride) per block
    BLOCKS = ((1, 16, 1), (4, 24, 2), (4, 24, 1), (4, 32, 2), (4, 32, 1))

    def __init__(self) -> None:
        super().__init__()
        layers, cin = [_conv_bn(3, 16, 3)], 16
        for expand, cout, stride in self.BLOCKS:
            layers.append(InvertedResidual(cin, cout, stride, expand))
            cin = cout
        self.features = nn.Sequential(*layers, _conv_bn(cin, 64))
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


# ---- a ConvNeXt-style net: 7x7 depthwise conv, LayerNorm over channels, pointwise GELU MLP, layer scale ---------


class ChannelsLayerNorm(nn.Module):
    """LayerNorm over the channels of an NCHW tensor, through a permute (as ConvNeXt's downsampling layers do)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=1e-6)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    # ConvNeXt starts its layer scale at 1e-6; at 0.1 the block's inner weights get gradients within the range a
    # relative comparison sees, rather than a millionth of the model's largest.
    LAYER_SCALE = 0.1

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), self.LAYER_SCALE))

    def forward(self, x):
        h = self.dwconv(x).permute(0, 2, 3, 1)  # NHWC: LayerNorm and the MLP act on the last dimension
        h = self.gamma * self.fc2(F.gelu(self.fc1(self.norm(h))))
        return x + h.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (32, 64), depth: int = 2) -> None:
        super().__init__()
        layers = [nn.Conv2d(3, widths[0], 4, stride=4), ChannelsLayerNorm(widths[0])]  # patchify stem
        for i, width in enumerate(widths):
            if i:
                layers += [ChannelsLayerNorm(widths[i - 1]), nn.Conv2d(widths[i - 1], width, 2, stride=2)]
            layers += [ConvNeXtBlock(width) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(widths[-1], eps=1e-6)
        self.fc = nn.Linear(widths[-1], CLASSES)

    def forward(self, x):
        return self.fc(self.norm(self.features(x).mean((2, 3))))


def _classifier(build: Callable[[], nn.Module]) -> Callable[[], Workload]:
    def workload() -> Workload:
        torch.manual_seed(0)
        net = build()
        x = _image()
        return Workload(net, args=(x,), loss=_cross_entropy_to(torch.randint(0, CLASSES, (BATCH,))))

    return workload


# ---- torchvision's layouts at full width (issue #19): MobileNetV3-Small, EfficientNet-B0, ConvNeXt-Tiny ----------
# Defined here from torchvision's configurations (its wheel does not import on this CPU torch).  Random ops are off:
# dropout p=0 and no stochastic depth, so a compiled step can be compared with eager's (Inductor draws its own
# random numbers).  2 x 3 x 64 x 64 images and 1000 classes, as ResNet-18's workload.


def _make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's channel rounding (``_make_divisible``): to a multiple of 8, never 10% below ``value``."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_norm_act(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act=nn.ReLU):
    layers = [nn.Conv2d(cin, cout, kernel, stride, padding=(kernel - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act is not None else []))


class SqueezeExcitation(nn.Module):
    """Channel attention: a global average, two 1x1 convolutions, a gate that scales the input."""

    def __init__(self, channels: int, squeeze: int, act=nn.ReLU, gate=nn.Hardsigmoid) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True)))))


class MBConv(nn.Module):
    """An inverted residual with squeeze-excitation (MobileNetV3's block; EfficientNet's MBConv)."""

    def __init__(self, cin, kernel, hidden, cout, stride, act, squeeze: int | None, gate) -> None:
        super().__init__()
        self.residual = stride == 1 and cin == cout
        layers = [] if hidden == cin else [_conv_norm_act(cin, hidden, 1, act=act)]
        layers.append(_conv_norm_act(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if squeeze:
            layers.append(SqueezeExcitation(hidden, squeeze, nn.ReLU if act is nn.ReLU else act, gate))
        layers.append(_conv_norm_act(hidden, cout, 1, act=None))
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV3Small(nn.Module):
    # torchvision's mobilenet_v3_small: (in, kernel, expanded, out, squeeze-excitation, hardswish, stride)
    BLOCKS = ((16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2), (24, 3, 88, 24, False, False, 1),
              (24, 5, 96, 40, True, True, 2), (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
              (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1), (48, 5, 288, 96, True, True, 2),
              (96, 5, 576, 96, True, True, 1), (96, 5, 576, 96, True, True, 1))

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers = [_conv_norm_act(3, 16, 3, 2, act=nn.Hardswish)]
        for cin, kernel, hidden, cout, se, hardswish, stride in self.BLOCKS:
            act = nn.Hardswish if hardswish else nn.ReLU
            squeeze = _make_divisible(hidden // 4) if se else None
            layers.append(MBConv(cin, kernel, hidden, cout, stride, act, squeeze, nn.Hardsigmoid))
        self.features = nn.Sequential(*layers, _conv_norm_act(96, 576, 1, act=nn.Hardswish))
        self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, classes))

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class EfficientNetB0(nn.Module):
    # torchvision's efficientnet_b0 stages: (expansion, kernel, stride, in, out, blocks)
    STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
              (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        layers = [_conv_norm_act(3, 32, 3, 2, act=nn.SiLU)]
        for expand, kernel, stride, cin, cout, blocks in self.STAGES:
            for i in range(blocks):
                block_in = cin if i == 0 else cout
                squeeze = max(1, block_in // 4)  # of the block's input channels, as torchvision's MBConv
                layers.append(MBConv(block_in, kernel, block_in * expand, cout, stride if i == 0 else 1, nn.SiLU,
                                     squeeze, nn.Sigmoid))
        self.features = nn.Sequential(*layers, _conv_norm_act(320, 1280, 1, act=nn.SiLU))
        self.fc = nn.Linear(1280, classes)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


class ConvNeXtTiny(ConvNeXt):
    """torchvision's convnext_tiny: widths 96-768, depths (3, 3, 9, 3); the blocks are ``ConvNeXtBlock`` (layer
    scale 0.1, not 1e-6, for the gradient check's sake), the head a LayerNorm and a 1000-class Linear."""

    def __init__(self, widths=(96, 192, 384, 768), depths=(3, 3, 9, 3), classes: int = 1000) -> None:
        nn.Module.__init__(self)
        layers = [nn.Conv2d(3, widths[0], 4, stride=4), ChannelsLayerNorm(widths[0])]
        for i, (width, depth) in enumerate(zip(widths, depths)):
            if i:
                layers += [ChannelsLayerNorm(widths[i - 1]), nn.Conv2d(widths[i - 1], width, 2, stride=2)]
            layers += [ConvNeXtBlock(width) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(widths[-1], eps=1e-6)
        self.fc = nn.Linear(widths[-1], classes)


def _imagenet_like(build: Callable[[], nn.Module]) -> Callable[[], Workload]:
    """ResNet-18's workload for another net: 2 x 3 x 64 x 64 images, 1000 classes."""

    def workload() -> Workload:
        torch.manual_seed(0)
        net = build()
        x = torch.randn(BATCH, 3, 64, 64)
        return Workload(net, args=(x,), loss=_cross_entropy_to(torch.randint(0, 1000, (BATCH,))))

    return workload


# ---- diffusers UNets ---------------------------------------------------------------------------------------------


def _unet(down: tuple[str, str], up: tuple[str, str]) -> Callable[[], Workload]:
    def workload() -> Workload:
        from diffusers import UNet2DModel

        torch.manual_seed(0)
        net = UNet2DModel(sample_size=IMAGE, in_channels=3, out_channels=3, block_out_channels=(32, 64),
                          layers_per_block=1, norm_num_groups=8, down_block_types=down, up_block_types=up,
                          dropout=0.0)
        x = _image()
        t = torch.tensor([10, 500])  # integer timesteps: they stay integer in the fp64 copy
        return Workload(net, args=(x, t), loss=_mse_to(torch.randn_like(x), field="sample"))

    return workload


BUILDERS: dict[str, Callable[[], Workload]] = {
    "resnet_gn20": resnet_gn20,
    "unet": _unet(("DownBlock2D", "AttnDownBlock2D"), ("AttnUpBlock2D", "UpBlock2D")),
    "unet_resnet": _unet(("DownBlock2D", "DownBlock2D"), ("UpBlock2D", "UpBlock2D")),
    "resnet": _classifier(SmallResNet),
    "mobilenet": _classifier(MobileNet),
    "convnext": _classifier(ConvNeXt),
    "resnet18": resnet18,
    "mobilenet_v3_small": _imagenet_like(MobileNetV3Small),
    "efficientnet_b0": _imagenet_like(EfficientNetB0),
    "convnext_tiny": _imagenet_like(ConvNeXtTiny),
}
CONV_MODELS = tuple(BUILDERS)


def build_conv_workload(name: str) -> Workload:
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; one of {list(CONV_MODELS)}")
    work = BUILDERS[name]()
    work.info.setdefault("parameters", sum(p.numel() for p in work.model.parameters()))
    work.info.setdefault("class", type(work.model).__name__)
    return work
