"""The container launcher of the process kubelet (`kubelet.py`): the last step before a
container's command runs, inside the container's own namespaces.

The kubelet starts it as

    setpriv --pdeathsig KILL -- unshare --mount --propagation private --pid --fork
        --kill-child --mount-proc --uts -- python -I -S podexec.py SPEC.json

so it runs as PID 1 of a fresh PID namespace (when it or anything it starts dies, the
kernel kills the whole tree; when the kubelet's thread dies, `setpriv`'s death signal
kills `unshare`, whose `--kill-child` kills this PID 1), in a private mount namespace (the
mounts below are invisible to the host and to other containers) with its own hostname.
It then:

1. opens every mount source first (`O_PATH`), so a later mount over a parent directory
   (an emptyDir at /tmp) cannot hide a source that lives under it;
2. creates missing mount points (appending each directory or file it had to create on the
   host to the SPEC's `created` record, with its device and inode, for the kubelet to
   remove on exit) and bind-mounts each source, read-only where asked;
3. sets the hostname, changes to the working directory and `execve`s the container's
   command with exactly the environment the kubelet computed. If that fails the reason
   goes to the termination-message file and stderr, with exit code 127 (as a runtime's
   "executable file not found").

Standard library only, and no `tests` package import: it starts with `python -I -S`.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
from typing import Any

MS_RDONLY = 0x1
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000


def _libc_mount(source: str, target: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, flags, None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _create(path: str, is_dir: bool, record: Any) -> None:
    """Create a missing mount point and its missing parents, recording what was made."""
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = os.path.dirname(probe)
    for index, item in enumerate(reversed(missing)):
        last = index == len(missing) - 1
        try:
            if last and not is_dir:
                os.close(os.open(item, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            else:
                os.mkdir(item, 0o755)
        except FileExistsError:  # another container made it at the same time: not ours
            continue
        info = os.stat(item)
        record.write(json.dumps({"path": item, "dev": info.st_dev, "ino": info.st_ino}) + "\n")
        record.flush()


def _mount_all(mounts: list[dict[str, Any]], record: Any) -> None:
    sources = [os.open(m["source"], os.O_PATH | os.O_CLOEXEC) for m in mounts]
    for mount, fd in zip(mounts, sources, strict=True):
        target = mount["target"]
        is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
        if not os.path.lexists(target):
            _create(target, is_dir, record)
        _libc_mount(f"/proc/self/fd/{fd}", target, MS_BIND | MS_REC)
        if mount.get("readOnly"):
            _libc_mount("none", target, MS_REMOUNT | MS_BIND | MS_RDONLY)
        os.close(fd)


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    env: dict[str, str] = spec["env"]
    argv: list[str] = spec["argv"]
    # Opened before the mounts, which may hide the host path it lives under.
    message_fd = os.open(spec["terminationMessageFile"], os.O_WRONLY | os.O_CLOEXEC)
    try:
        with open(spec["created"], "a") as record:
            _mount_all(spec["mounts"], record)
        if spec.get("hostname"):
            socket.sethostname(spec["hostname"])
        os.makedirs(spec["cwd"], exist_ok=True)
        os.chdir(spec["cwd"])
        os.environ.clear()
        os.environ.update(env)
        os.execvpe(argv[0], argv, env)  # noqa: S606 - exec is the point: the container's PID 1
    except OSError as exc:
        reason = f"the container could not start: {exc}"
        print(reason, file=sys.stderr, flush=True)
        os.write(message_fd, reason.encode()[:4096])
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv[1])
