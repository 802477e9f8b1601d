"""The seccomp filter of every sandbox (bwrap `--seccomp FD`): a small deny list on top of the
namespaces (`SECCOMP_DENY`, `SECCOMP_DENY_IOCTLS`), compiled to classic BPF (`seccomp_program`) and
written once per process to a temporary file (`_seccomp_file`; removed at exit by
`sandbox._cleanup_at_exit`).
"""
from __future__ import annotations

import errno
import logging
import os
import platform
import tempfile
import threading
from typing import Optional

log = logging.getLogger(__name__)


# name: (x86_64, aarch64) syscall numbers. None of these is needed by shell, Python or pytest work;
# several are the usual first steps of a kernel or container escape.
SECCOMP_DENY = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "unshare": (272, 97),
    "setns": (308, 268), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "acct": (163, 89), "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
}
SECCOMP_DENY_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}
_ARCH = {"x86_64": (0xC000003E, 0, 16), "aarch64": (0xC00000B7, 1, 29)}  # audit arch, column, ioctl nr


def seccomp_program(machine: Optional[str] = None) -> Optional[bytes]:
    """The classic-BPF seccomp filter bwrap installs (`--seccomp FD`): the syscalls in `SECCOMP_DENY`
    and the ioctls `TIOCSTI` / `TIOCLINUX` (terminal input injection) fail with EPERM; syscalls of
    another architecture (and x32 on x86_64) fail with ENOSYS; everything else is allowed.
    None on architectures other than x86_64 and aarch64."""
    import struct

    machine = machine or platform.machine()
    if machine not in _ARCH:
        return None
    audit_arch, col, ioctl_nr = _ARCH[machine]
    LD, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
    ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    nrs = sorted({v[col] for v in SECCOMP_DENY.values()})
    prog: list = [(LD, 0, 0, 4), (JEQ, 1, 0, audit_arch), (RET, 0, 0, ENOSYS), (LD, 0, 0, 0)]
    checks = []  # (opcode, k) instructions that jump to DENY when true
    if machine == "x86_64":
        checks.append((JGE, 0x40000000))
    checks += [(JEQ, nr) for nr in nrs]
    n_checks = len(checks)
    # layout after the checks: [jeq ioctl -> (next) else ALLOW], ld arg1, jeq TIOCSTI, jeq TIOCLINUX, ALLOW, DENY
    tail = 1 + 1 + len(SECCOMP_DENY_IOCTLS) + 1  # ioctl jeq, ld, ioctl checks, ALLOW
    for i, (op, k) in enumerate(checks):
        prog.append((op, n_checks - i - 1 + tail, 0, k))
    prog.append((JEQ, 0, 1 + len(SECCOMP_DENY_IOCTLS), ioctl_nr))
    prog.append((LD, 0, 0, 24))  # seccomp_data.args[1], low 32 bits (little endian)
    for i, k in enumerate(SECCOMP_DENY_IOCTLS.values()):
        prog.append((JEQ, len(SECCOMP_DENY_IOCTLS) - i, 0, k))
    prog.append((RET, 0, 0, ALLOW))
    prog.append((RET, 0, 0, EPERM))
    assert all(jt < 256 and jf < 256 for _, jt, jf, _ in prog)
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


_SECCOMP_FILE: list = []
_SECCOMP_LOCK = threading.Lock()


def _seccomp_file() -> Optional[str]:
    with _SECCOMP_LOCK:
        if not _SECCOMP_FILE:
            prog = seccomp_program()
            if prog is None:
                log.warning("no seccomp filter for %s: sandboxes rely on namespaces only", platform.machine())
                _SECCOMP_FILE.append(None)
            else:
                fd, path = tempfile.mkstemp(prefix="jaxrl-seccomp-", suffix=".bpf")
                with os.fdopen(fd, "wb") as f:
                    f.write(prog)
                os.chmod(path, 0o644)
                _SECCOMP_FILE.append(path)
        return _SECCOMP_FILE[0]
