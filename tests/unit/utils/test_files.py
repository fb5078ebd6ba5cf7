"""Content digests: same size is not same content, and a remembered digest follows the file."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from lightning_kd.utils.files import file_digest, remembered_digest

HOUR_AGO_NS = time.time_ns() - 3600 * 10**9


def settled(path: Path, data: bytes, mtime_ns: int = HOUR_AGO_NS) -> Path:
    """``path`` holding ``data``, last modified at ``mtime_ns`` (long enough ago to remember)."""
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def test_a_remembered_digest_is_reused_only_while_the_file_is_unchanged(tmp_path) -> None:
    memo = tmp_path / "memo"
    first = settled(tmp_path / "a.bin", b"x" * 1000)
    second = settled(tmp_path / "b.bin", b"y" * 1000)
    digests = [remembered_digest(first, memo), remembered_digest(second, memo)]
    assert digests == [file_digest(first), file_digest(second)] and digests[0] != digests[1]

    # Unchanged: the record is read, not the file (a doctored record shows which).
    (record,) = [p for p in memo.iterdir() if json.loads(p.read_text())["path"] == str(first)]
    record.write_text(json.dumps(json.loads(record.read_text()) | {"sha256": "remembered"}))
    assert remembered_digest(first, memo) == "remembered"

    # Rewritten in place with as many bytes: another mtime, hashed again.
    settled(first, b"z" * 1000, HOUR_AGO_NS + 10**9)
    assert remembered_digest(first, memo) == file_digest(first) != digests[0]
    # Rewritten in place with as many bytes, the mtime put back (cp -p, touch -d): the ctime
    # tells it (probe 37: the old digest was kept, and a run trained on the old text).
    before = remembered_digest(first, memo)
    settled(first, b"v" * 1000, HOUR_AGO_NS + 10**9)
    assert remembered_digest(first, memo) == file_digest(first) != before
    # Replaced by a rename, the mtime kept: another inode, hashed again.
    settled(tmp_path / "new.bin", b"w" * 1000, HOUR_AGO_NS + 10**9).replace(first)
    assert remembered_digest(first, memo) == file_digest(first)


def test_a_file_changed_a_moment_ago_is_hashed_but_not_remembered(tmp_path) -> None:
    """Within the file system's clock tick a same-size rewrite could keep the mtime."""
    fresh = tmp_path / "fresh.bin"
    fresh.write_bytes(b"x" * 100)
    assert remembered_digest(fresh, tmp_path / "memo") == file_digest(fresh)
    assert not (tmp_path / "memo").exists()


def test_written_files_get_the_permissions_the_umask_allows(tmp_path) -> None:
    """transformers writes model.safetensors 0600: a team's shared run directory held a
    student the rest of the team could not read (probe 47)."""
    import os

    from lightning_kd.utils.files import as_umask_allows

    weights = tmp_path / "student" / "model.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"w")
    weights.chmod(0o600)
    old = os.umask(0o022)
    try:
        as_umask_allows(tmp_path / "student")
    finally:
        os.umask(old)
    assert weights.stat().st_mode & 0o777 == 0o644
