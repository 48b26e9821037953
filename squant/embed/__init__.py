"""Bulk embedding (`squant embed`): a file of texts to Parquet shards, resumable, locally
(embed.local) or on Ray Data actors (embed.ray_data)."""

from .local import (
    EmbedReport,
    check_before_loading,
    embed_file,
    embed_texts,
    offline_config,
    read_rows,
    write_shards,
)

__all__ = [
    "EmbedReport",
    "check_before_loading",
    "embed_file",
    "embed_texts",
    "offline_config",
    "read_rows",
    "write_shards",
]
