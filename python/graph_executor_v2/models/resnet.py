"""ResNet-18 (He et al., 2016) with ``ge2.nn``: the layout and state-dict names of torchvision's ``resnet18``
(``conv1``, ``bn1``, ``layer1.0.conv1``, ``layer2.0.downsample.0``, ``fc``, ...), so its weights load directly.

``ResNet.forward(g, x)`` gives the logits of ``x`` [batch, 3, H, W] (NCHW; H and W concrete, 224 for ImageNet);
``forward(g, x, labels)`` also the mean cross-entropy as ``loss``, for ``ge2.train.Trainer``. Training mode: batch
norms on batch statistics with their running-statistic updates as outputs; eval mode: on the running statistics.
"""
from __future__ import annotations

from .. import nn
from .._optional import require
from ..nn.losses import cross_entropy


class BasicBlock(nn.Module):
    """conv3x3-bn-relu, conv3x3-bn, plus the input (through a 1x1 conv-bn ``downsample`` when the stride or the
    width changes), relu."""

    expansion = 1

    def __init__(self, inputs: int, outputs: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(outputs)
        self.downsample = None
        if stride != 1 or inputs != outputs:
            self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(outputs))

    def forward(self, g, x):
        out = g.relu(self.bn1(g, self.conv1(g, x)))
        out = self.bn2(g, self.conv2(g, out))
        identity = x if self.downsample is None else self.downsample(g, x)
        return g.relu(g.add(out, identity))


class ResNet(nn.Module):
    """conv7x7/2-bn-relu, maxpool 3/2, four stages of ``blocks[i]`` BasicBlocks (64, 128, 256, 512 wide, the last
    three starting with stride 2), global average pooling, a linear classifier."""

    def __init__(self, blocks=(2, 2, 2, 2), num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        inputs = 64
        for stage, (width, count) in enumerate(zip((64, 128, 256, 512), blocks), start=1):
            layers = []
            for index in range(count):
                layers.append(BasicBlock(inputs, width, stride=2 if stage > 1 and index == 0 else 1))
                inputs = width
            setattr(self, f"layer{stage}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(512, num_classes)

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


def torch_resnet18(num_classes: int = 1000):
    """The same ResNet-18 in plain PyTorch (``torch.nn``; torchvision's layout and state-dict names, so GE2's and
    torchvision's weights load into it, and torchvision need not be installed): the reference of the GPU tests and
    the ONNX benchmark. Needs PyTorch."""
    torch = require("torch", "ge2.models.torch_resnet18")
    nn = torch.nn

    class TorchBasicBlock(nn.Module):
        def __init__(self, inputs, outputs, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(outputs)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(outputs)
            self.downsample = None
            if stride != 1 or inputs != outputs:
                self.downsample = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                                nn.BatchNorm2d(outputs))

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            out += x if self.downsample is None else self.downsample(x)
            return self.relu(out)

    class TorchResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inputs = 64
            for stage, width in enumerate((64, 128, 256, 512), start=1):
                stride = 1 if stage == 1 else 2
                setattr(self, f"layer{stage}", nn.Sequential(TorchBasicBlock(inputs, width, stride),
                                                             TorchBasicBlock(width, width, 1)))
                inputs = width
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return TorchResNet18()


__all__ = ["BasicBlock", "ResNet", "resnet18", "torch_resnet18"]
