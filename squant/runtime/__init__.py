"""Running a quantized model fast: compile (inductor), export (.pt2 packages), the shapes
they cover, reading outputs, timing and core placement. Built on the quantization core."""
