"""Models in and out of squant: loading Hugging Face checkpoints and tokenizers, saving and
loading quantized directories, sentence-transformers models, and the public quantize."""
