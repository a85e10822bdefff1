"""A checkpoint's bytes on disk: ``torch.save``'s zip, sealed with a SHA-256, and its temporary names.

Used by ``checkpoint`` (``save_checkpoint``, ``load_checkpoint``; lessons 07, 09 and 11) and by
``train`` to check ``--checkpoint`` before any training.

- The file is exactly what ``torch.save`` writes, except that the zip's comment (the last
  field of every zip file, empty in torch's) holds ``ddp_tutorial checkpoint sha256:<hex>``,
  the SHA-256 of every byte before it. torch's own loader still reads it; ``unseal`` refuses
  a file whose bytes changed (a bit flip, a truncation, another program's write).
- A file without that comment, as ``torch.save`` writes it (checkpoints written before the
  checksum existed), is passed on unverified: ``torch.load`` then judges it.
- A temporary file's name holds the writer's host and process id, so a run removes the
  leftovers of its own SIGKILLed predecessors, never the live temporary file of another run.
"""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import socket
import struct
from typing import Any

import torch

__all__ = ["CheckpointError", "seal", "unseal", "read_bytes", "temporary_name", "remove_stale",
           "fsync_directory", "make_folder", "check_writable"]

MAGIC = b"ddp_tutorial checkpoint sha256:"
TRAILER_LENGTH = len(MAGIC) + 64  # the magic, then 64 hex digits
END_OF_ZIP = b"PK\x05\x06"  # the zip's end-of-central-directory record: 22 bytes, then the comment
END_RECORD_LENGTH = 22
DAMAGED = "delete it to start afresh, or resume from a copy you trust"


class CheckpointError(ValueError):
    """An unreadable checkpoint, or one from another model: a one-line message."""


def seal(state: dict[str, Any]) -> bytes:
    """``torch.save(state)``'s bytes with their SHA-256 in the zip's comment."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    if data[-END_RECORD_LENGTH:-END_RECORD_LENGTH + 4] != END_OF_ZIP or data[-2:] != b"\0\0":
        raise RuntimeError("torch.save wrote a zip with a comment or without an end record: cannot seal it")
    body = data[:-2] + struct.pack("<H", TRAILER_LENGTH)  # the comment's length is part of what is hashed
    return body + MAGIC + hashlib.sha256(body).hexdigest().encode()


def unseal(data: bytes, path: str) -> bytes:
    """The bytes for ``torch.load``: a sealed file verified, an unsealed zip as it is, anything else refused."""
    if not data:
        raise CheckpointError(f"checkpoint {path} is empty (a save that never finished?): {DAMAGED}")
    body, trailer = data[:-TRAILER_LENGTH], data[-TRAILER_LENGTH:]
    sealed = (trailer.startswith(MAGIC) and body[-2:] == struct.pack("<H", TRAILER_LENGTH)
              and body[-END_RECORD_LENGTH:-END_RECORD_LENGTH + 4] == END_OF_ZIP)
    if sealed:
        if hashlib.sha256(body).hexdigest().encode() != trailer[len(MAGIC):]:
            raise CheckpointError(f"checkpoint {path} is damaged: its SHA-256 does not match its contents "
                                  f"(changed or corrupted since it was written); {DAMAGED}")
        return data
    if data[-END_RECORD_LENGTH:-END_RECORD_LENGTH + 4] == END_OF_ZIP and data[-2:] == b"\0\0":
        return data  # torch.save's own format: written before the checksum existed, or by torch.save itself
    raise CheckpointError(f"checkpoint {path} is damaged or not a checkpoint (cut short, changed, or not "
                          f"written by torch.save): {DAMAGED}")


def read_bytes(path: str) -> bytes:
    """The whole file in one read (verified and loaded from memory: no second read a writer could change)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}") from None
    except IsADirectoryError:
        raise CheckpointError(f"checkpoint {path} is a directory, not a file: give the checkpoint file's path") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None


def temporary_name(path: str) -> str:
    """``PATH.HOST.PID.RANDOM.tmp``: unique to this process, beside ``path`` (one file system: an atomic rename)."""
    return f"{os.path.abspath(path)}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def remove_stale(path: str) -> None:
    """Remove temporary files that writers on this host left when they were SIGKILLed mid-write.

    Only files of processes that no longer exist: another run saving to the same path, on this
    host or another one sharing the folder, keeps its temporary file.
    """
    directory, name = os.path.split(os.path.abspath(path))
    host = socket.gethostname()
    for entry in os.listdir(directory):
        if not (entry.startswith(name + ".") and entry.endswith(".tmp")):
            continue
        parts = entry[len(name) + 1:-len(".tmp")].rsplit(".", 2)  # host (may hold dots), pid, random
        if len(parts) == 3 and parts[0] == host and parts[1].isdigit() and not _alive(int(parts[1])):
            try:
                os.unlink(os.path.join(directory, entry))
            except FileNotFoundError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def fsync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable: after a power cut the name points at the new file."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # a system that cannot open folders (Windows): the rename is done, only not yet flushed
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems (network, FUSE) cannot fsync a folder; the rename still happened
    finally:
        os.close(fd)


def make_folder(path: str) -> str:
    """Create the folder ``path`` goes into (with its parents); return it. A file in the way is a ``CheckpointError``."""
    directory = ancestor = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise CheckpointError(f"cannot write checkpoint {path}: {ancestor} is not a folder; "
                              "choose a path inside a folder")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {path}: {exc.strerror or exc}; "
                              "choose a folder you can write to") from None
    return directory


def check_writable(path: str) -> None:
    """Refuse, before any training, a checkpoint path that cannot be written: a one-line ``CheckpointError``.

    Creates the missing folders (as the save would) and a temporary file, removed at once.
    """
    shown = f"cannot write checkpoint {path}"
    if os.path.isdir(path):
        raise CheckpointError(f"{shown}: it is a directory; give a file path such as "
                              f"{os.path.join(path, 'model.pt')}")
    if os.path.exists(path) and not os.path.isfile(path):
        raise CheckpointError(f"{shown}: it exists and is not a regular file; choose another path")
    make_folder(path)
    try:
        probe = temporary_name(path)
        with open(probe, "xb"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise CheckpointError(f"{shown}: {exc.strerror or exc}; choose a folder you can write to") from None
