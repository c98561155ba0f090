#!/usr/bin/python3
"""PyTorch baseline for bench/bench_train.py: the same model, batch, data and
SGD recipe as vtrain's fmnist configs, timed the same way (training steps only,
the first step excluded). Prints one line: `images_per_second <float>`.

For bench/bench_models_cpu.py, --model also takes torchvision's
mobilenet_v2 and efficientnet_b0 (without stochastic depth, as vtrain's
presets), trained on random data of --shape CxHxW; below 64x64 their stem
conv runs at stride 1, vtrain's small-input rule.

Run with Debian's Python (/usr/bin/python3, where python3-torch installs)."""
import argparse
import gzip
import struct
import time

import numpy as np
import torch
import torch.nn as nn


def lenet(classes=10):
    # Caffe's LeNet, as vtrain's `lenet` preset.
    return nn.Sequential(
        nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2),
        nn.Conv2d(20, 50, 5), nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, classes))


def vgg_small(classes=10):
    # vtrain's `vgg-small` preset for 28x28 inputs.
    return nn.Sequential(
        nn.Conv2d(1, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2, 2),
        nn.Flatten(), nn.Linear(128 * 7 * 7, 256), nn.ReLU(), nn.Linear(256, classes))


class BasicBlock(nn.Module):
    # torchvision's ResNet basic block, as vtrain's basic_block: conv3x3 (no
    # bias) + bn + relu, conv3x3 + bn, a 1x1 strided projection + bn where the
    # shape changes, add, relu.
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


def _resnet(block, blocks, expansion, classes, in_channels, small_input):
    # vtrain's `resnet` presets (torchvision's ResNets). small_input (a side
    # below 64, e.g. 32x32 CIFAR): the CIFAR stem, conv1 3x3 stride 1 pad 1
    # and no max pool; otherwise conv1 7x7 stride 2 pad 3 and a 3x3/2 max pool.
    stem = (nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False) if small_input
            else nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False))
    layers = [stem, nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
    if not small_input:
        layers.append(nn.MaxPool2d(3, 2, 1))
    inplanes = 64
    for stage, count in enumerate(blocks):
        planes = 64 << stage
        for k in range(count):
            layers.append(block(inplanes, planes, 2 if stage > 0 and k == 0 else 1))
            inplanes = planes * expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inplanes, classes)]
    return nn.Sequential(*layers)


def resnet18(classes=10, in_channels=3, small_input=True):
    # vtrain's `resnet18` preset (torchvision's ResNet-18).
    return _resnet(BasicBlock, [2, 2, 2, 2], 1, classes, in_channels, small_input)


class Bottleneck(nn.Module):
    # torchvision's (v1.5) bottleneck, as vtrain's bottleneck_block: 1x1,
    # 3x3 (the stride here), 1x1 to 4x the planes, each conv without bias and
    # with a bn, relus after the first two; a 1x1 strided projection + bn
    # where the shape changes; add, relu.
    expansion = 4

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


def resnet50(classes=10, in_channels=3, small_input=False):
    # vtrain's `resnet50` preset (torchvision's ResNet-50).
    return _resnet(Bottleneck, [3, 4, 6, 3], Bottleneck.expansion, classes, in_channels,
                   small_input)


def vgg16(classes=10, in_channels=3, side=224):
    # vtrain's `vgg16` preset: VGG configuration D without dropout, 3x3 pad-1
    # convs with relus, a 2x2 max pool after each of the five groups, then
    # fc 4096, relu, fc 4096, relu, fc classes.
    layers, c = [], in_channels
    for channels, convs in [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]:
        for _ in range(convs):
            layers += [nn.Conv2d(c, channels, 3, 1, 1), nn.ReLU(inplace=True)]
            c = channels
        layers.append(nn.MaxPool2d(2, 2))
        side //= 2
    layers += [nn.Flatten(), nn.Linear(c * side * side, 4096), nn.ReLU(inplace=True),
               nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, classes)]
    return nn.Sequential(*layers)


# torchvision's models that vtrain has as presets of the same name.
TORCHVISION_MODELS = ["mobilenet_v2", "efficientnet_b0"]


def torchvision_model(name, classes, side):
    import torchvision
    kwargs = {"stochastic_depth_prob": 0.0} if name == "efficientnet_b0" else {}
    model = getattr(torchvision.models, name)(num_classes=classes, **kwargs)
    if side < 64:  # vtrain's small-input rule (worker/engine/presets.cpp)
        model.features[0][0].stride = (1, 1)
    return model


def synthetic_data(shape, classes, samples):
    """Random normal images of `shape` (C, H, W) with random labels."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn((samples,) + shape, generator=generator)
    return x, torch.randint(0, classes, (samples,), generator=generator)


def fmnist_data(folder):
    images = load_idx(f"{folder}/train-images-idx3-ubyte.gz")
    labels = torch.from_numpy(load_idx(f"{folder}/train-labels-idx1-ubyte.gz").copy())
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    return (x - x.mean()) / x.std(), labels


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if magic == 0x803:
        rows, cols = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, 1, rows, cols)
    return np.frombuffer(data, np.uint8, offset=8).astype(np.int64)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["lenet", "vgg-small"] + TORCHVISION_MODELS, required=True)
    p.add_argument("--shape", default="3x32x32",
                   help="CxHxW of the random data of a torchvision model")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: torch.autocast on the CPU (AMP), fp32 master weights")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    if a.model in TORCHVISION_MODELS:
        shape = tuple(int(d) for d in a.shape.split("x"))
        x, labels = synthetic_data(shape, a.classes, a.steps * a.batch)
        model = torchvision_model(a.model, a.classes, min(shape[1:]))
    else:
        x, labels = fmnist_data(a.data)
        model = lenet() if a.model == "lenet" else vgg_small()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    perm = torch.randperm(x.shape[0])
    timed = 0.0
    for step in range(a.steps):
        start = time.perf_counter()
        idx = perm[step * a.batch:(step + 1) * a.batch]
        xb, yb = x[idx], labels[idx]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        if step > 0:
            timed += time.perf_counter() - start
    print(f"images_per_second {(a.steps - 1) * a.batch / timed:.1f}")


if __name__ == "__main__":
    main()
