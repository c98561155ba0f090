#!/usr/bin/env python3
"""Checks an ONNX model with the onnx package's full checker (strict shape
inference included), for tests/onnx_test.cpp: a second opinion beside the C++
checker vtrain's exporter runs.

  onnx_check.py MODEL

Prints `ok` and exits 0, or prints the checker's complaint and exits 1.
Needs onnx.
"""
import sys

import onnx


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        print(e)
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
