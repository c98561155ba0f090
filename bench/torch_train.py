#!/usr/bin/python3
"""PyTorch baseline for bench/bench_train.py: the same model, batch, data and
SGD recipe as vtrain's fmnist configs, timed the same way (training steps only,
the first step excluded). Prints one line: `images_per_second <float>`.

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
    p.add_argument("--model", choices=["lenet", "vgg-small"], required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    images = load_idx(f"{a.data}/train-images-idx3-ubyte.gz")
    labels = torch.from_numpy(load_idx(f"{a.data}/train-labels-idx1-ubyte.gz").copy())
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    x = (x - x.mean()) / x.std()
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
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        if step > 0:
            timed += time.perf_counter() - start
    print(f"images_per_second {(a.steps - 1) * a.batch / timed:.1f}")


if __name__ == "__main__":
    main()
