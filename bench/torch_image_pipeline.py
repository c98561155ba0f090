#!/usr/bin/python3
"""torchvision's input pipeline alone, the baseline of bench_image_data.py:
ImageFolder + DataLoader with RandomResizedCrop(224) + RandomHorizontalFlip
+ ToTensor + Normalize, no training.

    /usr/bin/python3 bench/torch_image_pipeline.py FOLDER --workers N [--batch 32] [--batches 20]

Prints one line: "torchvision: IMAGES images, N worker(s): X img/s". The
first batch (worker start-up) is not timed."""
import argparse
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folder")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(1)
    t = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                            transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.25] * 3)])
    loader = DataLoader(datasets.ImageFolder(a.folder, transform=t), batch_size=a.batch, shuffle=True,
                        num_workers=a.workers, prefetch_factor=2)
    it = iter(loader)
    next(it)
    start = time.perf_counter()
    for _ in range(a.batches):
        next(it)
    seconds = time.perf_counter() - start
    print(f"torchvision: {a.batches * a.batch} images, {a.workers} worker(s): {a.batches * a.batch / seconds:.1f} img/s")


if __name__ == "__main__":
    main()
