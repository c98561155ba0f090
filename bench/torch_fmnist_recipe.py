#!/usr/bin/python3
"""PyTorch with the recipe of configs/fmnist-recipe.yaml, for its accuracy
figure (bench/results/, issue 43): the same model, augmentation, loss,
optimizer and schedule, trained on Fashion-MNIST and evaluated on its test
set after every epoch. Prints one line per epoch:
`epoch E test_accuracy A seconds S`.

The recipe, as vtrain runs it (docs/optimizers.md, docs/config.md):
- inputs in [0, 1] padded by 2 zero pixels, a random 28x28 crop, mirrored
  half the time, then standardised by the training set's mean and std;
- batch 128, the last partial batch dropped (468 steps an epoch);
- cross-entropy with label smoothing 0.1;
- torch.optim.SGD lr 0.1, momentum 0.9, Nesterov, weight decay 5e-4 on the
  conv and fc weights only (not batch norm, not biases);
- lr * (step + 1) / 200 for the first 200 steps, times the cosine
  0.5 * (1 + cos(pi * step / total_steps)) over the whole run.
Initialisation and shuffling are PyTorch's own (seeded), not vtrain's.

Run with Debian's Python (/usr/bin/python3, where python3-torch installs):
    /usr/bin/python3 bench/torch_fmnist_recipe.py --epochs 20 --threads 2
"""
import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn

from torch_train import load_idx


def model(classes=10):
    def block(c_in, c_out):
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

    return nn.Sequential(
        *block(1, 32), *block(32, 32), nn.MaxPool2d(2),
        *block(32, 64), *block(64, 64), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 256), nn.ReLU(), nn.Linear(256, classes))


def images(path):
    return torch.from_numpy(load_idx(path).astype(np.float32) / 255.0)


def labels(path):
    return torch.from_numpy(load_idx(path).copy())


def augment(batch, pad, generator):
    """A random crop of each image padded by `pad` zeros, mirrored half the time."""
    n, c, h, w = batch.shape
    padded = nn.functional.pad(batch, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator)
    flips = torch.rand(n, generator=generator) < 0.5
    out = torch.empty_like(batch)
    for i in range(n):
        y, x = offsets[i].tolist()
        crop = padded[i, :, y:y + h, x:x + w]
        out[i] = crop.flip(-1) if flips[i] else crop
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)

    x_train = images(f"{args.data}/train-images-idx3-ubyte.gz")
    y_train = labels(f"{args.data}/train-labels-idx1-ubyte.gz")
    x_test = images(f"{args.data}/t10k-images-idx3-ubyte.gz")
    y_test = labels(f"{args.data}/t10k-labels-idx1-ubyte.gz")
    mean, std = x_train.mean().item(), x_train.std().item()

    net = model()
    decay = [p for p in net.parameters() if p.dim() > 1]  # conv and fc weights
    no_decay = [p for p in net.parameters() if p.dim() <= 1]  # batch norm, biases
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9, nesterov=True)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    batch, warmup, base_lr = 128, 200, 0.1
    steps_per_epoch = x_train.shape[0] // batch
    total = steps_per_epoch * args.epochs
    step = 0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        net.train()
        order = torch.randperm(x_train.shape[0], generator=generator)
        for s in range(steps_per_epoch):
            idx = order[s * batch:(s + 1) * batch]
            xb = (augment(x_train[idx], 2, generator) - mean) / std
            lr = base_lr * 0.5 * (1 + math.cos(math.pi * min(step / total, 1.0)))
            if step < warmup:
                lr *= (step + 1) / warmup
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss_fn(net(xb), y_train[idx]).backward()
            opt.step()
            step += 1
        seconds = time.perf_counter() - start
        net.eval()
        correct = 0
        with torch.no_grad():
            for s in range(0, x_test.shape[0], 1000):
                out = net((x_test[s:s + 1000] - mean) / std)
                correct += (out.argmax(1) == y_test[s:s + 1000]).sum().item()
        print(f"epoch {epoch} test_accuracy {correct / x_test.shape[0]:.4f} seconds {seconds:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
