"""The engine that runs an encoder for serving and bulk embedding, with no HTTP in it.

From the bottom up: config (ServeConfig), batching (admission and the length-bucketed
queue, pure Python), executor (what runs a padded batch: here, or in a model process of its
own, model_process), engine (tokenization and the pinned workers), runtime (eager, compiled
or packaged execution), package_cache (AOTInductor packages built once per model directory),
loading (any model directory to an engine: local_engine here, or through a model process)."""
