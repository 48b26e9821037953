"""Quantization core: SmoothQuant on a Hugging Face encoder, module by module.

Architecture layouts (mappings), the config, calibration, smoothing, the INT8 linear and
attention, the record of what was done, and the range monitor. Depends only on squant's
shared low layer (errors, files, hardware, data) and on kernels."""
