"""`squant serve`: an encoder server on squant's engine (optional extra: squant[serve]).

From the bottom up: config (ServeConfig), batching (admission and the length-bucketed
queue, pure Python), executor (what runs a padded batch: here, or in a model process),
engine (tokenization and the pinned workers), loading (any model directory to an engine),
app / front_door / server (HTTP), ray_app (the same engine as a Ray Serve deployment)."""
