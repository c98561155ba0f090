#!/usr/bin/python3
"""Image folders from Fashion-MNIST (no downloads): the IDX files Debian's
setup puts in /usr/share/datasets/fashion-mnist (configs/fmnist-lenet.yaml).

    /usr/bin/python3 bench/make_fmnist_images.py OUT [--large N] [--small]

--large N: OUT/large/{train,test}/<class>/<i>.jpg, the first N training and
N/5 test images upscaled (bicubic) to ImageNet-like sizes, each side drawn
in 300..500 px (aspect 0.75..1.33), RGB, JPEG quality 90 (Pillow/libjpeg
4:2:0): the input-pipeline benchmark's files.
--small: OUT/small/{train,test}/<class>/<i>.png, every image at 28x28 grey,
lossless, and OUT/small/{train,test}.txt listing them ("path label") in the
IDX files' order: the accuracy-parity run against the IDX files (the list
gives the same sample order; the folders alone give ImageFolder's).
The sizes are drawn from a fixed seed, so OUT is the same every time."""
import argparse
import gzip
import os
import random

from PIL import Image

FMNIST = "/usr/share/datasets/fashion-mnist"


def read_idx(images, labels):
    with gzip.open(os.path.join(FMNIST, images)) as f:
        raw = f.read()
    count, rows, cols = (int.from_bytes(raw[4 * k:4 * k + 4], "big") for k in (1, 2, 3))
    pixels = raw[16:]
    with gzip.open(os.path.join(FMNIST, labels)) as f:
        lab = f.read()[8:]
    return [(Image.frombytes("L", (cols, rows), pixels[i * rows * cols:(i + 1) * rows * cols]), lab[i])
            for i in range(count)]


def write(samples, root, large, rng):
    lines = []
    for i, (image, label) in enumerate(samples):
        folder = os.path.join(root, str(label))
        os.makedirs(folder, exist_ok=True)
        if large:
            side = rng.randint(300, 500)
            aspect = rng.uniform(0.75, 4 / 3)
            size = (int(side * aspect ** 0.5), int(side / aspect ** 0.5))
            image.resize(size, Image.BICUBIC).convert("RGB").save(os.path.join(folder, f"{i:06d}.jpg"), quality=90)
        else:
            image.save(os.path.join(folder, f"{i:06d}.png"))
            lines.append(f"{label}/{i:06d}.png {label}\n")
    if lines:
        with open(root + ".txt", "w") as f:
            f.writelines(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--large", type=int, default=0)
    p.add_argument("--small", action="store_true")
    a = p.parse_args()
    train = read_idx("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
    test = read_idx("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
    rng = random.Random(42)
    if a.large:
        write(train[:a.large], os.path.join(a.out, "large", "train"), True, rng)
        write(test[:a.large // 5], os.path.join(a.out, "large", "test"), True, rng)
    if a.small:
        write(train, os.path.join(a.out, "small", "train"), False, rng)
        write(test, os.path.join(a.out, "small", "test"), False, rng)


if __name__ == "__main__":
    main()
