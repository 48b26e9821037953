"""Writing output directories safely: checked before any work, replaced atomically after it.

    check_output_dir(out, marker="squant.json", protect=[checkpoint], overwrite=False)
    with atomic_directory(out, marker="squant.json", protect=[checkpoint]) as tmp:
        ...write every file into tmp...

A directory is written into a temporary sibling and renamed into place only once every file
is there: a crash (kill -9, disk full, an exception) leaves the previous directory as it was,
or nothing. Replacing an existing directory takes two renames (old aside, new in); a crash in
between - microseconds - leaves the previous one intact under `.NAME.old-*` beside it.

Refused without `overwrite`: a target that holds anything squant did not write. Ownership is
proven by content, not by a file name: every directory squant writes carries `OWNED_FILE`,
a JSON record of squant's listing the names it wrote, and a directory counts as squant's
only if that record parses and every entry in the directory is one it lists (a user's
`squant.json` beside `important.txt`, or a note added to a squant output, makes it not
squant's). Always refused: a target that is, contains or lies inside a protected path (the
source checkpoint), and a target that exists but is not a directory. Paths are resolved when
checked, so a later `chdir` cannot redirect a write.

Leftovers of killed runs (`.NAME.tmp-PID-*` of a process that no longer runs, `.NAME.old-*`)
are removed beside the target by the next successful write.

Single output files (`--json`, `--png`) go through `check_output_file` before any work
(not a directory, not inside an input, a writable parent) and `write_output_file` after it
(written beside and renamed into place).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import SquantError

OWNED_FILE = ".squant-owned.json"
_OWNED_FORMAT = "squant-output"


def _overlaps(target: Path, protected: Path) -> bool:
    return target == protected or protected in target.parents or target in protected.parents


def written_by_squant(directory: Path) -> bool:
    """True when `directory` holds only what squant wrote there (its OWNED_FILE lists every
    entry); False for anything else, a missing or unreadable record included."""
    record_path = directory / OWNED_FILE
    try:
        if not record_path.is_file() or record_path.stat().st_size > 1 << 20:
            return False
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(record, dict) or record.get("format") != _OWNED_FORMAT:
        return False
    listed = record.get("files")
    if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
        return False
    present = {entry.name for entry in directory.iterdir()} - {OWNED_FILE}
    return present <= set(listed)


def _write_owned_record(directory: Path) -> None:
    names = sorted(entry.name for entry in directory.iterdir() if entry.name != OWNED_FILE)
    record = {"format": _OWNED_FORMAT, "format_version": 1, "files": names}
    (directory / OWNED_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_siblings(final: Path) -> list[Path]:
    """Remove what killed writes of `final` left beside it: `.NAME.old-*` (a finished replace's
    previous copy) and `.NAME.tmp-PID-*` whose process is gone. Returns what was removed."""
    removed = []
    for entry in final.parent.glob(f".{final.name}.*-*"):
        rest = entry.name[len(final.name) + 2 :]
        stale = rest.startswith("old-")
        if rest.startswith("tmp-"):
            pid = rest[4:].split("-", 1)[0]
            stale = pid.isdigit() and not _pid_alive(int(pid))
        if stale and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def check_output_dir(
    target: str | Path,
    marker: str,
    protect: Iterable[str | Path] = (),
    overwrite: bool = False,
) -> Path:
    """Refuse an output directory now, before any slow work, for every reason a write into
    it would be refused later; create its parent. Returns the resolved path."""
    path = Path(target).expanduser()
    resolved = path.resolve()
    for p in protect:
        if _overlaps(resolved, Path(p).expanduser().resolve()):
            raise SquantError(
                f"output {path} overlaps the input {p}: writing there could destroy the input; "
                "choose another directory"
            )
    if resolved.exists():
        if not resolved.is_dir():
            raise SquantError(f"output {path} exists and is not a directory")
        entries = list(resolved.iterdir())
        if entries and not written_by_squant(resolved) and not overwrite:
            raise SquantError(
                f"output {path} is not empty and was not written by squant (it holds files squant "
                "did not write); "
                "pass --overwrite (overwrite=True) to replace it, or choose an empty directory"
            )
    _writable_parent(resolved, str(path), "")
    return resolved


def _writable_parent(resolved: Path, shown: str, what: str) -> None:
    """Create `resolved`'s parent, or refuse: a file on its way, or no permission to write."""
    label = f"{what} {shown}" if what else shown
    parent = resolved.parent
    blocker = next((a for a in (parent, *parent.parents) if a.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise SquantError(f"cannot write {label}: {blocker} is a file, not a directory")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SquantError(f"cannot create {parent}: {e.strerror or e}") from None
    if not parent.is_dir():
        raise SquantError(f"cannot write into {parent}: not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        into = f"{what} into" if what else "into"
        raise SquantError(f"cannot write {into} {parent}: permission denied")


@contextlib.contextmanager
def atomic_directory(
    target: str | Path,
    marker: str,
    protect: Iterable[str | Path] = (),
    overwrite: bool = False,
) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it replaces `target` whole."""
    final = check_output_dir(target, marker, protect, overwrite)
    try:
        prefix = f".{final.name}.tmp-{os.getpid()}-"
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    except OSError as e:
        raise SquantError(f"cannot write into {final.parent}: {e.strerror or e}") from None
    try:
        yield tmp
        _write_owned_record(tmp)
        # the directory follows the user's umask (mkdtemp makes it 0700: unreadable to a
        # server running as another user)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        _fsync_tree(tmp)
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
            os.rename(final, old / "previous")
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        clean_stale_siblings(final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SquantError(f"cannot write {final}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_output_file(
    target: str | Path, protect: Iterable[str | Path] = (), what: str = "output"
) -> Path:
    """Refuse an output file now, before any slow work: a directory, a path that is or lies
    inside an input (a checkpoint's config.json), or a parent that cannot be written.
    Returns the resolved path (a later chdir does not move it)."""
    path = Path(target).expanduser()
    resolved = path.resolve()
    for p in protect:
        source = Path(p).expanduser().resolve() if p else None
        if source is not None and (resolved == source or source in resolved.parents):
            raise SquantError(f"{what} {path} is inside the input {p}; choose another path")
    if resolved.is_dir():
        raise SquantError(f"{what} {path} is a directory; give a file name")
    _writable_parent(resolved, str(path), what)
    if resolved.exists() and not os.access(resolved, os.W_OK):
        raise SquantError(f"cannot write {what} {path}: permission denied")
    return resolved


def write_output_file(path: Path, data: str | bytes) -> None:
    """Write beside `path` and rename into place (a crash leaves the old file or none)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SquantError(f"cannot write {path}: {e.strerror or e}") from None


def _fsync_tree(root: Path) -> None:
    """Flush file contents to disk before the rename publishes them."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def parse_json(text: str, where: str) -> Any:
    """json.loads with every way the parser can refuse a text as one SquantError naming
    `where`: not JSON, nested too deeply, or a number beyond Python's integer-digit limit."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SquantError(f"{where}: not valid JSON ({e.msg}, line {e.lineno})") from None
    except RecursionError:
        raise SquantError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        raise SquantError(f"{where}: a number too long to read ({str(e).split(';')[0]})") from None


def read_json(path: Path, what: str) -> Any:
    """A JSON file from a user (any value), its read and parse errors as one SquantError."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SquantError(f"{path} is not UTF-8 text, so not {what}") from None
    except OSError as e:
        raise SquantError(f"cannot read {path}: {e.strerror or e}") from None
    return parse_json(text, str(path))


def read_json_record(
    path: Path,
    fmt: str,
    version: int | tuple[int, ...],
    what: str,
    fix: str = "",
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """A JSON object squant wrote (`{"format": fmt, "format_version": version, ...}`), read
    without trusting it: size (when bounded), encoding, nesting depth, type, format and
    version each give one SquantError naming `what` the file should be."""
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise SquantError(f"{path} is {path.stat().st_size} bytes: too large for {what}")
    try:
        record = parse_json(path.read_text(encoding="utf-8"), str(path))
    except UnicodeDecodeError as e:
        raise SquantError(f"{path} is not valid JSON ({e}); the file is corrupt") from None
    except SquantError as e:
        raise SquantError(f"{e}; the file is corrupt, or not {what}") from None
    if not isinstance(record, dict) or record.get("format") != fmt:
        raise SquantError(f"{path} is not {what}")
    versions = version if isinstance(version, tuple) else (version,)
    found = record.get("format_version")
    if isinstance(found, bool) or found not in versions:
        raise SquantError(
            f"{path} has format version {found!r}; this squant reads "
            f"{' or '.join(map(str, versions))}{fix}"
        )
    return record


def iter_jsonl(path: Path, objects_only: bool = True) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line of a JSONL file. A line that is not JSON,
    nests too deeply, or (objects_only) is not an object is a SquantError naming it; the
    caller turns UnicodeDecodeError into its own message (it knows what the file was for)."""
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            value = parse_json(line, f"{path}:{n}")
            if objects_only and not isinstance(value, dict):
                raise SquantError(f"{path}:{n}: expected a JSON object, got {type(value).__name__}")
            yield n, value


# what defines a model directory's behaviour: weights, configs, tokenizer files, packages
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".pt2", ".so", ".json", ".txt", ".model")


def model_sha256(path: str | Path) -> str | None:
    """SHA-256 over the relative names and bytes of a model directory's defining files
    (MODEL_FILE_SUFFIXES; any other file, a README say, does not count); None when path is
    not a directory (a hub id). Two directories with the same weights, configs and tokenizer
    agree, wherever they are."""
    root = Path(path)
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES)
    for file in files:
        digest.update(str(file.relative_to(root)).encode("utf-8", "surrogateescape") + b"\0")
        hash_file(file, digest)
        digest.update(b"\0")
    return digest.hexdigest()


def hash_file(path: Path, digest: Any) -> Any:
    """digest updated with the file's bytes, read in 1 MiB blocks (a model need not fit in
    memory twice); returns digest."""
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest
