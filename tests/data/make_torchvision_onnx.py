#!/usr/bin/env python3
"""Writes a torchvision ResNet as ONNX the way a PyTorch user exports one,
for vtrain's model.onnx import tests (tests/onnx_test.cpp).

  make_torchvision_onnx.py resnet18 OUT.onnx   torchvision.models.resnet18,
                                               10 classes (~45 MB: made at test time)
  make_torchvision_onnx.py tiny OUT.onnx       torchvision's ResNet class with its
                                               BasicBlock, one block per stage and
                                               narrow stages (the committed
                                               tests/data/tiny_resnet_32x32.onnx)

Both take 3 x 32 x 32 inputs: eval mode, torch.onnx.export at opset 17 with
do_constant_folding and a free batch dimension. Run with Debian's
python3-torch and python3-torchvision.
"""
import sys

import torch
import torchvision
from torchvision.models.resnet import BasicBlock, ResNet


class TinyResNet(ResNet):
    """torchvision's ResNet with one BasicBlock per stage and 8..64 channels."""

    def __init__(self, num_classes=10):
        super().__init__(BasicBlock, [1, 1, 1, 1], num_classes=num_classes)
        widths = [8, 16, 32, 64]
        self.inplanes = 8
        self.conv1 = torch.nn.Conv2d(3, 8, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.layer1 = self._make_layer(BasicBlock, widths[0], 1)
        self.layer2 = self._make_layer(BasicBlock, widths[1], 1, stride=2)
        self.layer3 = self._make_layer(BasicBlock, widths[2], 1, stride=2)
        self.layer4 = self._make_layer(BasicBlock, widths[3], 1, stride=2)
        self.fc = torch.nn.Linear(widths[3], num_classes)


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("resnet18", "tiny"):
        sys.exit(__doc__)
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10) if sys.argv[1] == "resnet18" else TinyResNet()
    # Running statistics other than 0 / 1, so that the import's batch norm is tested.
    with torch.no_grad():
        model.train()
        model(torch.randn(16, 3, 32, 32))
    model.eval()
    torch.onnx.export(model, torch.randn(1, 3, 32, 32), sys.argv[2], opset_version=17,
                      do_constant_folding=True, input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


if __name__ == "__main__":
    main()
