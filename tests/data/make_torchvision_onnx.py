#!/usr/bin/env python3
"""Writes torchvision-style models as ONNX the way a PyTorch user exports
them, for vtrain's model.onnx import tests (tests/onnx_test.cpp).

  make_torchvision_onnx.py resnet18 OUT.onnx     torchvision.models.resnet18,
                                                 10 classes (~45 MB: made at test time)
  make_torchvision_onnx.py tiny OUT.onnx         torchvision's ResNet class with its
                                                 BasicBlock, one block per stage and
                                                 narrow stages (the committed
                                                 tests/data/tiny_resnet_32x32.onnx)
  make_torchvision_onnx.py activations OUT.onnx  a small net with nn.SiLU, nn.GELU,
                                                 nn.ReLU6 and nn.Sigmoid
  make_torchvision_onnx.py mobile OUT.onnx       a small net with a depthwise and a
                                                 grouped nn.Conv2d, torchvision's
                                                 SqueezeExcitation and nn.Dropout
  make_torchvision_onnx.py mobile_eval OUT.onnx  the same net with the same weights,
                                                 exported in eval mode

All take 3 x 32 x 32 inputs: eval mode, torch.onnx.export at opset 17 with
do_constant_folding and a free batch dimension. `mobile` keeps its dropout in
training mode (TrainingMode.PRESERVE), so that the file has the Dropout node
a model exported for training carries; with training_mode true that node
drops at random wherever a runtime does not optimise it away, so
`mobile_eval` (no Dropout node, batch norms folded) is what ONNX Runtime runs
as the reference. Run with Debian's python3-torch and python3-torchvision.
"""
import sys

import torch
import torchvision
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet
from torchvision.ops import SqueezeExcitation


class TinyResNet(ResNet):
    """torchvision's ResNet with one BasicBlock per stage and 8..64 channels."""

    def __init__(self, num_classes=10):
        super().__init__(BasicBlock, [1, 1, 1, 1], num_classes=num_classes)
        widths = [8, 16, 32, 64]
        self.inplanes = 8
        self.conv1 = nn.Conv2d(3, 8, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.layer1 = self._make_layer(BasicBlock, widths[0], 1)
        self.layer2 = self._make_layer(BasicBlock, widths[1], 1, stride=2)
        self.layer3 = self._make_layer(BasicBlock, widths[2], 1, stride=2)
        self.layer4 = self._make_layer(BasicBlock, widths[3], 1, stride=2)
        self.fc = nn.Linear(widths[3], num_classes)


def activations_net(num_classes=10):
    """Conv + batch norm before each of SiLU, GELU, ReLU6 and Sigmoid."""
    def stage(cin, cout, stride, act):
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(cout), act]
    return nn.Sequential(*stage(3, 8, 1, nn.SiLU()), *stage(8, 8, 2, nn.GELU()),
                         *stage(8, 16, 2, nn.ReLU6()), *stage(16, 16, 2, nn.Sigmoid()),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))


def mobile_net(num_classes=10):
    """A MobileNet/EfficientNet-style block: a depthwise 3x3, squeeze-excitation
    (SiLU inside, `scale * input` out), a grouped 1x1, dropout before the logits."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.SiLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6(),
        SqueezeExcitation(16, 4, activation=nn.SiLU),
        nn.Conv2d(16, 32, 1, groups=4, bias=False), nn.BatchNorm2d(32),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.25), nn.Linear(32, num_classes))


def main():
    models = {"resnet18": lambda: torchvision.models.resnet18(num_classes=10),
              "tiny": TinyResNet, "activations": activations_net, "mobile": mobile_net,
              "mobile_eval": mobile_net}
    if len(sys.argv) != 3 or sys.argv[1] not in models:
        sys.exit(__doc__)
    torch.manual_seed(0)  # the same weights in every file of one kind
    model = models[sys.argv[1]]()
    # Running statistics other than 0 / 1, so that the import's batch norm is tested.
    with torch.no_grad():
        model.train()
        model(torch.randn(16, 3, 32, 32))
    model.eval()
    mode = torch.onnx.TrainingMode.EVAL
    if sys.argv[1] == "mobile":
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.train()
        mode = torch.onnx.TrainingMode.PRESERVE
    torch.onnx.export(model, torch.randn(1, 3, 32, 32), sys.argv[2], opset_version=17,
                      training=mode, do_constant_folding=True, input_names=["input"],
                      output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


if __name__ == "__main__":
    main()
