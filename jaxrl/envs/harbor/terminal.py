"""A persistent shell per trial: an interactive bash on a pty inside the trial's sandbox.

Terminus-2 drives a tmux pane (`tmux send-keys`, then reads the new scrollback). Here the same
framing comes from a pty-backed bash (no tmux server, nothing to connect to from outside):

* `send_keys(keystrokes, duration)` writes the keystrokes verbatim (a string that is exactly a tmux
  key name such as `C-c`, `C-d`, `Enter`, `Escape`, `Tab`, `Up` is translated to its bytes), then
  waits up to `min(duration, max_duration)` seconds. It returns early when the keystrokes ended with
  a newline (or were C-c / C-d / C-z) and the shell is back at its prompt with no new output for
  `settle_sec` (the prompt
  carries an invisible marker, stripped from the output), which Terminus does not do but which only
  removes idle waiting.
* `read_new_output()` returns what the terminal printed since the last call — echoed keystrokes,
  command output and prompts, with ANSI escape sequences removed, carriage-return overwrites
  applied and `\\r\\n` normalised — capped at `limit_bytes` keeping head and tail with Terminus's
  "output limited to N bytes; M interior bytes omitted" marker. The agent loop frames it as
  "New Terminal Output:".
* `screen()` is the last `rows` lines of the processed transcript (Terminus's "Current Terminal
  Screen" for the initial observation).

The shell is `bash --noediting -i` (no readline: the tty echoes keystrokes as soon as they are
written, so a multi-line paste shows all its lines first and then bash's `> ` continuation prompts,
where tmux + readline would interleave them; Ctrl-C reaches the foreground job through the pty) with `TERM=dumb`, `PS1='agent@sandbox:\\w$ '`, a 160x40 window. Full
screen programs (vim, less, top) are not rendered as tmux would; their escape sequences are stripped.
"""
from __future__ import annotations

import fcntl
import os
import queue
import re
import struct
import subprocess
import termios
import threading
import time
from typing import Optional

from jaxrl.envs.harbor.errors import SandboxError
from jaxrl.envs.harbor.profile_dir import PROMPT_MARK
from jaxrl.envs.harbor.sandbox import Sandbox

MAX_OUTPUT_BYTES = 10_000  # Terminus-2's cap on one observation
TRANSCRIPT_BYTES = 1 << 20  # the terminal history kept (raw bytes)
_MARK = PROMPT_MARK.encode()
_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[PX^_][^\x1b]*\x1b\\|\x1b[@-Z\\-_]")
_CTRL_RE = re.compile(r"[\x00-\x07\x0b\x0c\x0e-\x1f\x7f]")

TMUX_KEYS = {
    "Enter": b"\r", "C-m": b"\r", "KPEnter": b"\r", "Escape": b"\x1b", "Tab": b"\t", "BTab": b"\x1b[Z",
    "BSpace": b"\x7f", "Space": b" ", "Up": b"\x1b[A", "Down": b"\x1b[B", "Right": b"\x1b[C", "Left": b"\x1b[D",
    "Home": b"\x1b[H", "End": b"\x1b[F", "PageUp": b"\x1b[5~", "PgUp": b"\x1b[5~", "PageDown": b"\x1b[6~",
    "PgDn": b"\x1b[6~", "DC": b"\x1b[3~", "Delete": b"\x1b[3~", "IC": b"\x1b[2~", "Insert": b"\x1b[2~",
}


def keys_to_bytes(keystrokes: str) -> bytes:
    """Terminus keystrokes to the bytes a terminal receives: a tmux key name (`C-c`, `M-x`, `Enter`,
    `Up`, ...) when the whole string is one, otherwise the string itself (UTF-8)."""
    k = keystrokes
    if k in TMUX_KEYS:
        return TMUX_KEYS[k]
    m = re.fullmatch(r"(?:C-|\^)([A-Za-z@\[\\\]^_?])", k)
    if m:
        c = m.group(1)
        return b"\x7f" if c == "?" else bytes([ord(c.upper()) & 0x1F])
    m = re.fullmatch(r"M-(.)", k)
    if m:
        return b"\x1b" + m.group(1).encode()
    return k.encode()


def clean_terminal_text(raw: bytes) -> str:
    """Raw pty bytes to text: prompt markers and ANSI sequences removed, `\\r\\n` -> `\\n`, a bare `\\r`
    overwrites its line (progress bars), backspaces applied, other control characters dropped."""
    text = raw.replace(_MARK, b"").decode("utf-8", errors="replace")
    text = _ANSI_RE.sub("", text)
    text = text.replace("\r\n", "\n")
    lines = []
    for line in text.split("\n"):
        if "\r" in line:
            segs = [s for s in line.split("\r")]
            out = ""
            for s in segs:
                out = s + out[len(s):]
            line = out
        if "\x08" in line:
            buf = []
            for ch in line:
                if ch == "\x08":
                    if buf:
                        buf.pop()
                else:
                    buf.append(ch)
            line = "".join(buf)
        lines.append(_CTRL_RE.sub("", line))
    return "\n".join(lines)


def limit_output(text: str, limit_bytes: int = MAX_OUTPUT_BYTES) -> str:
    """Terminus-2's output cap: at most `limit_bytes` UTF-8 bytes, keeping the first and last halves
    and a marker "[... output limited to N bytes; M interior bytes omitted ...]" between them."""
    data = text.encode("utf-8")
    if len(data) <= limit_bytes:
        return text
    half = limit_bytes // 2
    head = data[:half].decode("utf-8", errors="ignore")
    tail = data[-half:].decode("utf-8", errors="ignore")
    omitted = len(data) - len(head.encode()) - len(tail.encode())
    return f"{head}\n[... output limited to {limit_bytes} bytes; {omitted} interior bytes omitted ...]\n{tail}"


def _alive(term) -> bool:
    """Whether a terminal's sandboxed process (`term._proc`) runs and the terminal is open."""
    return term._proc is not None and term._proc.poll() is None and not term._closed


def _stop(term) -> bool:
    """Closes a terminal once: kills its sandboxed process tree and waits up to 10 s for it.
    False when it was already closed."""
    if term._closed:
        return False
    term._closed = True
    if term._proc is not None:
        term.sandbox.kill(term._proc)
        try:
            term._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        term.sandbox._forget(term._proc)
    return True


class Terminal:
    """An interactive bash on a pty in a trial's sandbox (see the module docstring).

    Args:
      sandbox: the trial's sandbox (its directories and limits apply).
      env: extra environment variables.
      cols, rows: the window size (Terminus: 160 x 40).
      pending_limit_bytes: output kept between two `read_new_output` calls (head and tail).
    """

    def __init__(self, sandbox: Sandbox, *, env: Optional[dict] = None, cols: int = 160, rows: int = 40,
                 pending_limit_bytes: int = 4 << 20):
        self.sandbox = sandbox
        self.cols, self.rows = cols, rows
        self._env = env
        self._pending_limit = pending_limit_bytes
        self._pending = bytearray()
        self._pending_dropped = 0
        self._transcript = bytearray()  # the last TRANSCRIPT_BYTES, for history() and screen()
        self._lock = threading.Condition()
        self._prompts = 0
        self._last_byte = time.monotonic()
        self._after_mark = bytearray()  # bytes since the last prompt marker
        self._carry = b""
        self._writes: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self._writing = 0
        self._proc: Optional[subprocess.Popen] = None
        self._master: Optional[int] = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> "Terminal":
        """Starts the shell and waits for its first prompt.

        Raises:
          SandboxError: the shell did not show a prompt within `timeout` seconds (its output is included).
        """
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", self.rows, self.cols, 0, 0))
        try:
            self._proc = self.sandbox.popen(
                ["/usr/bin/setsid", "--wait", "--ctty", "/bin/bash", "--noprofile", "--rcfile", self._rcfile(),
                 "--noediting", "-i"],
                env=self.sandbox.env(self._env, terminal=True), stdin=slave, stdout=slave, stderr=slave)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self._master = master
        threading.Thread(target=self._reader, daemon=True, name="jaxrl-terminal-reader").start()
        threading.Thread(target=self._writer, daemon=True, name="jaxrl-terminal-writer").start()
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._prompts == 0 and self._proc.poll() is None and time.monotonic() < deadline:
                self._lock.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            ok = self._prompts > 0 and time.monotonic() <= deadline
        if not ok:
            out = clean_terminal_text(bytes(self._pending))
            self.close()
            raise SandboxError(f"the sandbox shell did not start within {timeout:g} s: {out.strip()[-2000:]!r}")
        return self

    def _rcfile(self) -> str:
        if self.sandbox.config.backend == "bwrap":
            return "/opt/jaxrl/bashrc"
        from jaxrl.envs.harbor.profile_dir import _profile_dir

        return os.path.join(_profile_dir(self.sandbox.python, self.sandbox.config.sandbox_uid), "bashrc")

    def is_alive(self) -> bool:
        return _alive(self)

    def close(self) -> None:
        """Kills the shell and every process started from it."""
        if not _stop(self):
            return
        self._writes.put(None)
        if self._master is not None:
            try:
                os.close(self._master)
            except OSError:
                pass
        with self._lock:
            self._lock.notify_all()

    # -- I/O threads ---------------------------------------------------------------------------------
    def _reader(self) -> None:
        fd = self._master
        while True:
            try:
                b = os.read(fd, 1 << 16)
            except OSError:
                b = b""
            with self._lock:
                if not b:
                    self._lock.notify_all()
                    return
                self._last_byte = time.monotonic()
                self._pending += b
                if len(self._pending) > self._pending_limit:
                    cut = len(self._pending) - self._pending_limit
                    keep = self._pending_limit // 2
                    del self._pending[keep:keep + cut]
                    self._pending_dropped += cut
                self._transcript += b
                if len(self._transcript) > TRANSCRIPT_BYTES:
                    del self._transcript[:len(self._transcript) - TRANSCRIPT_BYTES]
                scan = self._carry + b
                n = scan.count(_MARK)
                if n:
                    self._prompts += n
                    self._after_mark = bytearray(scan[scan.rfind(_MARK) + len(_MARK):])
                else:
                    self._after_mark += b
                    if len(self._after_mark) > 4096:
                        del self._after_mark[:-4096]
                self._carry = scan[-(len(_MARK) - 1):]
                self._lock.notify_all()

    def _writer(self) -> None:
        while True:
            data = self._writes.get()
            if data is None:
                return
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self._master, view)
                    view = view[n:]
            except OSError:
                pass
            finally:
                with self._lock:
                    self._writing -= 1
                    self._lock.notify_all()

    # -- the agent's view ---------------------------------------------------------------------------
    def at_prompt(self) -> bool:
        """The shell printed its prompt last (nothing but the prompt text after the last marker) and
        every keystroke was delivered."""
        with self._lock:
            return self._at_prompt_locked()

    def _at_prompt_locked(self) -> bool:
        return self._prompts > 0 and self._writing == 0 and b"\n" not in self._after_mark

    def send_keys(self, keystrokes: str, duration: float = 1.0, *, max_duration: float = 60.0,
                  wait_for_prompt: bool = True, settle_sec: float = 0.05, deadline: Optional[float] = None) -> float:
        """Sends keystrokes, then waits (see the module docstring). Returns the seconds waited.

        Args:
          keystrokes: the text or a tmux key name.
          duration: seconds to wait (Terminus's `duration`), capped at `max_duration`.
          wait_for_prompt: return as soon as a newline-terminated command is back at the prompt.
          settle_sec: how long the output must be quiet at the prompt before returning early.
          deadline: a `time.monotonic()` value not to wait past (the trial's agent deadline).

        Raises:
          SandboxError: the terminal is closed.
        """
        if self._closed or self._proc is None:
            raise SandboxError("the terminal is closed")
        data = keys_to_bytes(keystrokes)
        t0 = time.monotonic()
        with self._lock:
            prompts_before = self._prompts
            self._writing += 1
        self._writes.put(data)
        end = t0 + max(0.0, min(float(duration), max_duration))
        if deadline is not None:
            end = min(end, deadline)
        early = wait_for_prompt and (data.endswith((b"\n", b"\r")) or data in (b"\x03", b"\x04", b"\x1a"))
        with self._lock:
            while True:
                now = time.monotonic()
                if now >= end or not self.is_alive():
                    break
                if early and self._prompts > prompts_before and self._at_prompt_locked() \
                        and now - self._last_byte >= settle_sec:
                    break
                self._lock.wait(min(end - now, settle_sec if early else 0.25))
        return time.monotonic() - t0

    def run(self, command: str, timeout: float = 60.0, *, deadline: Optional[float] = None) -> tuple[str, bool]:
        """Types `command` + newline and waits for the prompt (at most `timeout` s); on timeout sends
        Ctrl-C. Returns (new output, timed out)."""
        self.send_keys(command.rstrip("\n") + "\n", duration=timeout, max_duration=timeout, deadline=deadline)
        timed_out = not self.at_prompt()
        if timed_out and self.is_alive():
            self.send_keys("C-c", duration=1.0, deadline=None)
            self.wait_for_prompt(2.0)
        return self.read_new_output(), timed_out

    def wait_for_prompt(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._lock:
            while not self._at_prompt_locked() and time.monotonic() < end and self.is_alive():
                self._lock.wait(0.05)
            return self._at_prompt_locked()

    def read_new_output(self, limit_bytes: int = MAX_OUTPUT_BYTES) -> str:
        """The processed output since the last call, capped at `limit_bytes` (head and tail kept)."""
        with self._lock:
            raw = bytes(self._pending)
            dropped = self._pending_dropped
            self._pending.clear()
            self._pending_dropped = 0
        text = clean_terminal_text(raw)
        if dropped:
            half = len(text) // 2
            text = text[:half] + f"\n[... {dropped} bytes omitted ...]\n" + text[half:]
        return limit_output(text, limit_bytes)

    def history(self) -> str:
        """The processed transcript: every line the terminal printed (the last `TRANSCRIPT_BYTES`)."""
        with self._lock:
            raw = bytes(self._transcript)
        return clean_terminal_text(raw)

    def screen(self) -> str:
        """The last `rows` lines of the processed transcript."""
        return "\n".join(self.history().split("\n")[-self.rows:])


class TmuxTerminal:
    """The persistent shell as Harbor's terminus-2 has it: a real tmux session (`tmux` of the host's
    /usr, bound read-only) inside the trial's sandbox, with Harbor's pane size (160 x 40) and history
    limit, driven with `tmux send-keys` and read with `tmux capture-pane` exactly as Harbor's
    TmuxSession does; wrapping, full-screen programs and the visible screen are tmux's own.

    The tmux server lives in one long-lived sandbox instance (it ends when the session ends, or at
    `close()`); every client command (`send-keys`, `capture-pane`, `has-session`) runs in a fresh
    instance of the same trial and reaches the server through its socket in the trial's /tmp.

    Same interface as `Terminal`: `send_keys` waits the whole `duration` (Harbor's non-blocking
    send: no early return), `history()` is `capture-pane -p -S -`, `screen()` is `capture-pane -p`.
    """

    SOCKET = "/tmp/.jaxrl-tmux"
    SESSION = "terminus-2"

    def __init__(self, sandbox: Sandbox, *, env: Optional[dict] = None, cols: int = 160, rows: int = 40,
                 history_limit: int = 10_000_000):
        self.sandbox = sandbox
        self.cols, self.rows = cols, rows
        self._env = env
        self._history_limit = history_limit
        self._proc: Optional[subprocess.Popen] = None
        self._closed = False
        self._last_history = ""

    def _tmux(self, *args: str, timeout: float = 30.0) -> str:
        res = self.sandbox.run(["/usr/bin/tmux", "-S", self.SOCKET, *args], timeout=timeout,
                               env=self.sandbox.env(self._env, terminal=True), watch_disk=False)
        if res.exit_code != 0:
            raise SandboxError(f"tmux {args[0]} failed (exit {res.exit_code}): {res.output.strip()[-500:]}")
        return res.output

    def start(self, timeout: float = 30.0) -> "TmuxTerminal":
        """Starts the tmux server and its session, and waits until a client reaches it.

        Raises:
          SandboxError: tmux is missing, or the session did not come up within `timeout` seconds.
        """
        import shutil as _shutil

        if not _shutil.which("tmux"):
            raise SandboxError("the terminus-2 terminal needs tmux on the host (apt-get install -y tmux)")
        rc = "/opt/jaxrl/bashrc" if self.sandbox.config.backend == "bwrap" else None
        shell = "bash --noprofile --rcfile " + rc + " -i" if rc else "bash -i"
        s, n = self.SOCKET, self.SESSION
        script = (f"export TERM=xterm-256color SHELL=/bin/bash; "
                  f"/usr/bin/tmux -S {s} new-session -d -x {self.cols} -y {self.rows} -s {n} '{shell}' || exit 1; "
                  f"/usr/bin/tmux -S {s} set-option -g history-limit {self._history_limit} >/dev/null; "
                  f"while /usr/bin/tmux -S {s} has-session -t {n} 2>/dev/null; do sleep 0.2; done")
        self._proc = self.sandbox.popen(["/bin/bash", "-c", script], env=self.sandbox.env(self._env, terminal=True))
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._tmux("has-session", "-t", self.SESSION, timeout=max(1.0, deadline - time.monotonic()))
                break
            except SandboxError as e:
                if self._proc.poll() is not None or time.monotonic() >= deadline:
                    out = self._proc.stdout.read().decode("utf-8", "replace") if self._proc.poll() is not None else ""
                    self.close()
                    raise SandboxError(f"the tmux session did not start within {timeout:g} s: {e} {out[-500:]}")
                time.sleep(0.05)
        # wait for the shell's first prompt (a non-empty screen)
        while time.monotonic() < deadline and not self.screen().strip():
            time.sleep(0.05)
        self._last_history = self.history()
        return self

    def is_alive(self) -> bool:
        return _alive(self)

    def close(self) -> None:
        """Kills the tmux server, the shell and every process started from it."""
        _stop(self)

    def send_keys(self, keystrokes: str, duration: float = 1.0, *, max_duration: float = 60.0,
                  wait_for_prompt: bool = True, settle_sec: float = 0.05, deadline: Optional[float] = None) -> float:
        """`tmux send-keys -t terminus-2 -- KEYS` (a whole-string tmux key name such as `C-c` is that
        key, anything else is typed), then waits `min(duration, max_duration)` seconds (NaN or
        negative: 0), never past `deadline`. Returns the seconds waited.

        Raises:
          SandboxError: the session is gone.
        """
        if not self.is_alive():
            raise SandboxError("the terminal is closed")
        t0 = time.monotonic()
        if keystrokes:
            self._tmux("send-keys", "-t", self.SESSION, "--", keystrokes)
        wait = float(duration) if duration == duration and duration > 0 else 0.0  # NaN -> 0
        end = t0 + min(wait, max_duration)
        if deadline is not None:
            end = min(end, deadline)
        while time.monotonic() < end and self.is_alive():
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        return time.monotonic() - t0

    def history(self) -> str:
        """The pane's whole history (`capture-pane -p -S -`)."""
        return self._tmux("capture-pane", "-p", "-S", "-", "-t", self.SESSION)

    def screen(self) -> str:
        """The visible pane (`capture-pane -p`)."""
        return self._tmux("capture-pane", "-p", "-t", self.SESSION)

    def read_new_output(self, limit_bytes: int = MAX_OUTPUT_BYTES) -> str:
        """What the history gained since the last call (its whole text when it does not extend the
        previous one), capped at `limit_bytes` (head and tail kept)."""
        now = self.history() if self.is_alive() else self._last_history
        prev = self._last_history.rstrip("\n")  # the pane's blank rows are not output
        self._last_history = now
        new = now[len(prev):] if now.startswith(prev) else now
        return limit_output(new, limit_bytes)
