"""Mounts a test left beneath a directory, found in ``/proc/self/mountinfo`` and unmounted.

A rolled-back or committed kernel-overlay sandbox keeps its mount until it is cleaned up (it is
still usable); a test that stops there leaves the mount in pytest's temporary directory, and a
later pytest run cannot delete that directory (EBUSY) when it prunes old ones.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def mounts_beneath(directory: Path) -> list[str]:
    """Mount points strictly beneath ``directory``, deepest first."""
    root = str(directory.resolve()).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            # Field 5 is the mount point, with spaces and the like escaped as octal.
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(root):
                found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def unmount_beneath(directory: Path) -> list[str]:
    """Lazily unmount every mount beneath ``directory``; returns what was unmounted."""
    points = mounts_beneath(directory)
    for point in points:
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    return points
