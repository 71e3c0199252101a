"""A seccomp filter that refuses new user namespaces to a jailed command.

``bwrap --disable-userns`` stops a command from creating user namespaces by writing ``1`` to
``/proc/sys/user/max_user_namespaces`` inside the jail's user namespace. Where ``/proc/sys`` is
read-only (every container: runc mounts it so) that write fails and bwrap refuses to start, so
the jail that binds the container's ``/proc`` (:class:`~sandbox_core.actor.jail.Jail`, "bound"
``/proc``) loads this filter instead, with ``bwrap --seccomp FD``. It is the rule Flatpak's
filter has for the same purpose:

- ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` in their flags: ``EPERM``;
- ``clone3`` (its flags are in memory a filter cannot read): ``ENOSYS``, so the C library falls
  back to ``clone``, which the rule above sees;
- a system call of another ABI (i386 through ``int 0x80``, x32 on x86-64), whose numbers
  differ: ``ENOSYS``;
- everything else: allowed (the container's own seccomp profile still applies on top).

The program is classic BPF (``struct sock_filter``, native byte order), built here from the
kernel's constants (``linux/filter.h``, ``linux/seccomp.h``, ``linux/audit.h``) because the
rule is eight instructions; libseccomp's Python binding is not in Debian's default Python
nor on PyPI as a maintained package.
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["CLONE_NEWUSER", "UnsupportedArchitectureError", "program"]

CLONE_NEWUSER = 0x10000000
# Classic BPF opcodes (linux/filter.h).
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K
# linux/seccomp.h
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
OFFSET_NR = 0
OFFSET_ARCH = 4
OFFSET_ARG0_LOW = 16  # the low 32 bits of args[0] on a little-endian machine
X32_SYSCALL_BIT = 0x40000000


class UnsupportedArchitectureError(RuntimeError):
    """No filter is known for this machine's architecture."""


# machine -> (AUDIT_ARCH_*, clone, unshare, clone3, x32 bit to refuse)
ARCHITECTURES: dict[str, tuple[int, int, int, int, bool]] = {
    "x86_64": (0xC000003E, 56, 272, 435, True),
    "aarch64": (0xC00000B7, 220, 97, 435, False),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one), as ``bwrap --seccomp`` reads it.

    Returns:
        ``struct sock_filter`` instructions, 8 bytes each.

    Raises:
        UnsupportedArchitectureError: ``machine`` is not x86_64 or aarch64.
    """
    name = machine or platform.machine()
    if name not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"no user-namespace filter for {name!r} (known: {sorted(ARCHITECTURES)})"
        )
    audit_arch, clone, unshare, clone3, x32 = ARCHITECTURES[name]
    allow = _insn(RET_K, 0, 0, RET_ALLOW)
    eperm = _insn(RET_K, 0, 0, RET_ERRNO | errno.EPERM)
    enosys = _insn(RET_K, 0, 0, RET_ERRNO | errno.ENOSYS)
    # The tail every jump lands in: [check flags, allow, eperm, enosys]; offsets count from
    # the instruction after the jump.
    tail = [
        _insn(LD_W_ABS, 0, 0, OFFSET_ARG0_LOW),  # flags: clone's and unshare's first argument
        _insn(JSET_K, 1, 0, CLONE_NEWUSER),  # -> eperm
        allow,
        eperm,
        enosys,
    ]
    checks = [(JEQ_K, clone3, "enosys"), (JEQ_K, unshare, "flags"), (JEQ_K, clone, "flags")]
    if x32:
        checks.insert(0, (JGE_K, X32_SYSCALL_BIT, "enosys"))
    head = [_insn(LD_W_ABS, 0, 0, OFFSET_ARCH)]
    # arch mismatch -> enosys: jump over the nr load, the checks, and the tail up to enosys.
    head.append(_insn(JEQ_K, 0, 1 + len(checks) + 1 + 4, audit_arch))
    head.append(_insn(LD_W_ABS, 0, 0, OFFSET_NR))
    body = []
    for index, (code, value, target) in enumerate(checks):
        after = len(checks) - index - 1 + 1  # the remaining checks and the "allow" below
        where = {"flags": after, "enosys": after + 4}[target]
        body.append(_insn(code, where, 0, value))
    body.append(allow)
    return b"".join([*head, *body, *tail])
