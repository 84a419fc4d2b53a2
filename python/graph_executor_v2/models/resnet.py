"""ResNet-18 and ResNet-50 (He et al., 2016) with ``ge2.nn``: the layout and state-dict names of torchvision's
``resnet18`` and ``resnet50`` (``conv1``, ``bn1``, ``layer1.0.conv1``, ``layer2.0.downsample.0``, ``fc``, ...), so
their weights load directly.

``ResNet.forward(g, x)`` gives the logits of ``x`` [batch, 3, H, W] (NCHW; H and W concrete, 224 for ImageNet);
``forward(g, x, labels)`` also the mean cross-entropy as ``loss``, for ``ge2.train.Trainer``. Training mode: batch
norms on batch statistics with their running-statistic updates as outputs; eval mode: on the running statistics.
"""
from __future__ import annotations

from .. import nn
from .._optional import require
from ..nn.losses import cross_entropy


class _ResidualBlock(nn.Module):
    """What both blocks share: the shortcut, a 1x1 conv-bn ``downsample`` where the stride or the width changes
    (registered after the block's own layers, as torchvision's state dict orders it), and the closing add + relu."""

    def _add_downsample(self, inputs: int, outputs: int, stride: int) -> None:
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(outputs))

    def _join(self, g, x, out):
        identity = x if self.downsample is None else self.downsample(g, x)
        return g.relu(g.add(out, identity))


class BasicBlock(_ResidualBlock):
    """conv3x3-bn-relu, conv3x3-bn, plus the input (through a 1x1 conv-bn ``downsample`` when the stride or the
    width changes), relu."""

    expansion = 1

    def __init__(self, inputs: int, outputs: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self._add_downsample(inputs, outputs, stride)

    def forward(self, g, x):
        out = g.relu(self.bn1(g, self.conv1(g, x)))
        return self._join(g, x, self.bn2(g, self.conv2(g, out)))


class Bottleneck(_ResidualBlock):
    """conv1x1-bn-relu, conv3x3-bn-relu (the block's stride), conv1x1-bn widening to 4 x ``width``, plus the input
    (through a 1x1 conv-bn ``downsample`` when the stride or the width changes), relu: torchvision's ResNet v1.5
    bottleneck, whose stride is on the 3x3 convolution."""

    expansion = 4

    def __init__(self, inputs: int, width: int, stride: int = 1):
        super().__init__()
        outputs = width * self.expansion
        self.conv1 = nn.Conv2d(inputs, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, outputs, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(outputs)
        self._add_downsample(inputs, outputs, stride)

    def forward(self, g, x):
        out = g.relu(self.bn1(g, self.conv1(g, x)))
        out = g.relu(self.bn2(g, self.conv2(g, out)))
        return self._join(g, x, self.bn3(g, self.conv3(g, out)))


class ResNet(nn.Module):
    """conv7x7/2-bn-relu, maxpool 3/2, four stages of ``blocks[i]`` blocks of type ``block`` (BasicBlock or
    Bottleneck; 64, 128, 256, 512 wide, times the block's expansion at its output; the last three stages start
    with stride 2), global average pooling, a linear classifier."""

    def __init__(self, blocks=(2, 2, 2, 2), num_classes: int = 1000, block=BasicBlock):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inputs = 64
        for stage, (width, count) in enumerate(zip((64, 128, 256, 512), blocks), start=1):
            layers = []
            for index in range(count):
                layers.append(block(inputs, width, stride=2 if stage > 1 and index == 0 else 1))
                inputs = width * block.expansion
            setattr(self, f"layer{stage}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def forward(self, g, x, labels=None):
        h = self.maxpool(g, g.relu(self.bn1(g, self.conv1(g, x))))
        for stage in range(1, 5):
            h = getattr(self, f"layer{stage}")(g, h)
        logits = self.fc(g, self.flatten(g, self.avgpool(g, h)))
        if labels is None:
            return {"logits": logits}
        return {"logits": logits, "loss": cross_entropy(g, logits, labels)}


def resnet18(num_classes: int = 1000) -> ResNet:
    """ResNet-18: BasicBlocks [2, 2, 2, 2], initialised as torchvision's layers are by default (PyTorch's layer
    initialisation; torchvision's resnet re-initialises convs with kaiming_normal(fan_out), which only matters for
    training from scratch: load weights to compare)."""
    return ResNet((2, 2, 2, 2), num_classes)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50: Bottlenecks [3, 4, 6, 3] (torchvision's v1.5: stride on the 3x3 convolutions), initialised as
    ``resnet18`` is."""
    return ResNet((3, 4, 6, 3), num_classes, block=Bottleneck)


def torch_resnet18(num_classes: int = 1000):
    """The same ResNet-18 in plain PyTorch (``torch.nn``; torchvision's layout and state-dict names, so GE2's and
    torchvision's weights load into it, and torchvision need not be installed): the reference of the GPU tests and
    the ONNX benchmark. Needs PyTorch."""
    return _torch_resnet((2, 2, 2, 2), num_classes, bottleneck=False, caller="ge2.models.torch_resnet18")


def torch_resnet50(num_classes: int = 1000):
    """The same ResNet-50 in plain PyTorch, as ``torch_resnet18`` (torchvision's v1.5 bottlenecks). Needs PyTorch."""
    return _torch_resnet((3, 4, 6, 3), num_classes, bottleneck=True, caller="ge2.models.torch_resnet50")


def _torch_resnet(blocks, num_classes, bottleneck: bool, caller: str):
    torch = require("torch", caller)
    nn = torch.nn

    def conv_bn(inputs, outputs, kernel, stride):
        return (nn.Conv2d(inputs, outputs, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(outputs))

    class TorchBlock(nn.Module):
        def __init__(self, inputs, width, stride):
            super().__init__()
            outputs = width * (4 if bottleneck else 1)
            if bottleneck:
                self.conv1, self.bn1 = conv_bn(inputs, width, 1, 1)
                self.conv2, self.bn2 = conv_bn(width, width, 3, stride)
                self.conv3, self.bn3 = conv_bn(width, outputs, 1, 1)
            else:
                self.conv1, self.bn1 = conv_bn(inputs, outputs, 3, stride)
                self.conv2, self.bn2 = conv_bn(outputs, outputs, 3, 1)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or inputs != outputs:
                self.downsample = nn.Sequential(*conv_bn(inputs, outputs, 1, stride))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if bottleneck:
                out = self.bn3(self.conv3(self.relu(out)))
            out += x if self.downsample is None else self.downsample(x)
            return self.relu(out)

    class TorchResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inputs = 64
            for stage, (width, count) in enumerate(zip((64, 128, 256, 512), blocks), start=1):
                layers = []
                for index in range(count):
                    layers.append(TorchBlock(inputs, width, 2 if stage > 1 and index == 0 else 1))
                    inputs = width * (4 if bottleneck else 1)
                setattr(self, f"layer{stage}", nn.Sequential(*layers))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(inputs, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return TorchResNet()


__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet50", "torch_resnet18", "torch_resnet50"]
