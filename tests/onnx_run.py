#!/usr/bin/env python3
"""Runs an ONNX model on a batch with ONNX Runtime, for tests/onnx_test.cpp.

  onnx_run.py MODEL INPUT N OUTPUT

INPUT holds N samples as raw little-endian float32, NCHW, of the model's
input shape; OUTPUT gets the model's first output as raw float32. Prints the
model's metadata_props as KEY=VALUE lines. Needs onnxruntime and onnx.
"""
import sys

import numpy as np
import onnx
import onnxruntime


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    model_path, input_path, n, output_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    model = onnx.load(model_path)
    onnx.checker.check_model(model)
    for prop in model.metadata_props:
        print(f"{prop.key}={prop.value}")
    session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0]
    x = np.fromfile(input_path, dtype="<f4").reshape([n] + list(feed.shape[1:]))
    y = session.run(None, {feed.name: x})[0]
    y.astype("<f4").tofile(output_path)


if __name__ == "__main__":
    main()
