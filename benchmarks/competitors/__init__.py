"""Each competitor in its own small setup file: setup(model, calibration, inputs) -> run(inputs).

run(inputs) returns the model's main output (last hidden state) as a float32 tensor. A
competitor whose package is missing raises ImportError from setup; the driver reports it as
skipped. Nothing here is imported by squant itself.
"""
