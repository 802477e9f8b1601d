"""The sandbox's /opt/jaxrl and /etc, made once per process for each (sandbox Python, sandbox uid)
(`_profile_dir`): the wrappers on the sandbox PATH (python3, python, pytest, pip running the
`python` profile's Python), the bashrc whose prompt carries `PROMPT_MARK`, synthetic passwd, group,
hosts and hostname, and a curated copy of the host's /etc (`_ETC_FILES`, world-readable files only:
no secrets). The directories are removed at exit (`sandbox._cleanup_at_exit`).
"""
from __future__ import annotations

import logging
import os
import shlex
import shutil
import stat
import tempfile
import threading
from typing import Optional

from jaxrl.envs.harbor.python_runtime import PythonRuntime
from jaxrl.envs.harbor.sandbox_config import SANDBOX_HOME

log = logging.getLogger(__name__)


_ETC_FILES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
              "os-release", "debian_version", "lsb-release", "issue", "timezone", "ssl/certs", "ssl/openssl.cnf",
              "ca-certificates", "ca-certificates.conf", "mime.types", "inputrc", "terminfo", "bash.bashrc",
              "profile", "profile.d", "magic", "magic.mime", "protocols", "services", "environment",
              "login.defs", "python3", "shells", "gai.conf", "host.conf")


_PROFILE_DIRS: dict = {}
_PROFILE_LOCK = threading.Lock()
PROMPT_MARK = "\x1b]7770;jaxrl-prompt\x07"  # invisible OSC sequence: the shell is at its prompt


def _profile_dir(python: Optional[PythonRuntime], sandbox_uid: int) -> str:
    key = (python.executable if python else None, sandbox_uid)
    with _PROFILE_LOCK:
        if key in _PROFILE_DIRS:
            return _PROFILE_DIRS[key]
        d = tempfile.mkdtemp(prefix="jaxrl-sandbox-profile-")
        os.chmod(d, 0o755)
        os.makedirs(os.path.join(d, "bin"), mode=0o755)
        os.makedirs(os.path.join(d, "etc"), mode=0o755)
        if python:
            exe = shlex.quote(python.executable)
            for name, body in (("python3", f"exec {exe} \"$@\""), ("python", f"exec {exe} \"$@\""),
                               ("pytest", f"exec {exe} -m pytest \"$@\""), ("pip", f"exec {exe} -m pip \"$@\""),
                               ("pip3", f"exec {exe} -m pip \"$@\"")):
                p = os.path.join(d, "bin", name)
                with open(p, "w") as f:
                    f.write(f"#!/bin/sh\n{body}\n")
                os.chmod(p, 0o755)
        u = sandbox_uid
        files = {
            "etc/passwd": f"root:x:0:0:root:/root:/bin/bash\nagent:x:{u}:{u}:agent:{SANDBOX_HOME}:/bin/bash\n"
                          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "etc/group": f"root:x:0:\nagent:x:{u}:\nnogroup:x:65534:\n",
            "etc/hostname": "sandbox\n",
            "etc/hosts": "127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n",
            "bashrc": ("PS1='\\[" + PROMPT_MARK.replace("\x1b", "\\e").replace("\x07", "\\a") + "\\]agent@sandbox:\\w$ '\n"
                       "PS2='> '\nunset PROMPT_COMMAND HISTFILE\nexport HISTFILE=\n"),
        }
        _copy_etc(os.path.join(d, "etc"))
        for rel, text in files.items():
            p = os.path.join(d, rel)
            with open(p, "w") as f:
                f.write(text)
            os.chmod(p, 0o644)
        _PROFILE_DIRS[key] = d
        return d


def _copy_etc(dst: str) -> None:
    """Copies the curated `_ETC_FILES` of the host's /etc into `dst` (bound as the sandbox's /etc in one
    mount): symlinks as symlinks, and only files every user may read (no secrets)."""
    def readable(st):
        return st.st_mode & stat.S_IROTH

    for name in _ETC_FILES:
        src = os.path.join("/etc", name)
        if not os.path.lexists(src):
            continue
        target = os.path.join(dst, name)
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        try:
            if os.path.islink(src):
                os.symlink(os.readlink(src), target)
            elif os.path.isdir(src):
                for dirpath, dirnames, filenames in os.walk(src):
                    rel = os.path.relpath(dirpath, src)
                    out = os.path.normpath(os.path.join(target, rel))
                    st = os.stat(dirpath)
                    if not (readable(st) and st.st_mode & stat.S_IXOTH):
                        dirnames[:] = []
                        continue
                    os.makedirs(out, mode=0o755, exist_ok=True)
                    for n in dirnames + filenames:
                        sp, tp = os.path.join(dirpath, n), os.path.join(out, n)
                        if os.path.islink(sp):
                            os.symlink(os.readlink(sp), tp)
                            if n in dirnames:
                                dirnames.remove(n)
                        elif os.path.isfile(sp) and readable(os.stat(sp)):
                            shutil.copyfile(sp, tp)
                            os.chmod(tp, 0o644)
            elif os.path.isfile(src) and readable(os.stat(src)):
                shutil.copyfile(src, target)
                os.chmod(target, 0o644)
        except OSError as e:
            log.debug("not copying %s into the sandbox /etc: %s", src, e)
