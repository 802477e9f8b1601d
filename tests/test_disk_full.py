"""A full disk ends a run with one line and leaves nothing half-written (issue 25 §4).

The run directory is a real tmpfs of a few MiB, mounted in a private mount namespace
(`unshare -rm`: no root needed where user namespaces are allowed), so every writer meets the
kernel's own ENOSPC. Two cases: a disk too small for the run's first writes, and a disk that fills
(a filler file takes all the space) right after the checkpoint of step 2 committed, which must
resume exactly once the filler is gone."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from test_trainer import ENV, ROOT, RUN, SMALL, _metrics, uninterrupted, uninterrupted_run  # noqa: F401 (fixtures)

PARTIAL = re.compile(r"(^\.tmp-\d+$|orbax-checkpoint-tmp|^best\.tmp$|^\.tmp_)")


def _namespace_ok():
    if not shutil.which("unshare"):
        return False
    out = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt && echo ok"],
                         capture_output=True, text=True)
    return out.stdout.strip() == "ok"


pytestmark = pytest.mark.skipif(not _namespace_ok(), reason="needs `unshare -rm` and a tmpfs mount (user namespaces)")


def _in_tmpfs(tmp_path, size, script):
    """Runs bash `script` with $D a fresh tmpfs of `size` (e.g. "3m") and $OUT = tmp_path/out (outside it)."""
    out = tmp_path / "out"
    out.mkdir()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    body = f"set -u; mount -t tmpfs -o size={size} tmpfs {mnt}; D={mnt}; OUT={out}; cd {ROOT}; {script}"
    subprocess.run(["unshare", "-rm", "bash", "-c", body], env=ENV, timeout=1500, check=True)
    return out


def _main_cmd(workdir, *overrides):
    return " ".join([sys.executable, "-m", "jaxrl.main", "--config=configs/rloo.py", f"--workdir={workdir}",
                     *overrides])


def _partials(listing):
    return [p for p in listing.splitlines() if PARTIAL.search(os.path.basename(p))]


def test_disk_too_small_for_the_first_write_is_one_line(tmp_path):
    """The acceptance input: the workdir on a 3 MB tmpfs. One line naming the full disk and the fix,
    exit 1, no traceback, no partial folder (main: a ~400-line traceback after minutes and a
    partial sync/.tmp-1)."""
    out = _in_tmpfs(tmp_path, "3m", f"""
        {_main_cmd("$D/run", *SMALL)} > $OUT/stdout 2> $OUT/stderr; echo $? > $OUT/rc
        find $D > $OUT/files""")
    err = (out / "stderr").read_text()
    assert (out / "rc").read_text().strip() == "1", err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: no space left on device: could not write "), err[-3000:]
    assert "run" in lines[0] and "Fix: free space" in lines[0] and "rerun the same command" in lines[0]
    assert not _partials((out / "files").read_text()), (out / "files").read_text()


def test_disk_that_fills_after_a_checkpoint_resumes_exactly(tmp_path, uninterrupted):
    """A 64 MiB tmpfs (the 3-step run needs ~22 MiB) that a filler file fills as soon as step 2's
    checkpoint is committed: step 3's first write fails. One `error:` line, exit 1, no traceback, no
    partial folder, checkpoint 2 intact; with the filler removed the same command resumes from step
    2 and ends with the metrics of the uninterrupted run."""
    run = " ".join(RUN)
    out = _in_tmpfs(tmp_path, "64m", f"""
        {_main_cmd("$D/run", run)} > $OUT/stdout 2> $OUT/stderr &
        pid=$!
        while kill -0 $pid 2>/dev/null && [ ! -d $D/run/checkpoints/2 ]; do sleep 0.1; done
        dd if=/dev/zero of=$D/filler bs=1M 2>/dev/null || true
        wait $pid; echo $? > $OUT/rc
        find $D > $OUT/files; ls $D/run/checkpoints > $OUT/ckpts
        rm -f $D/filler
        {_main_cmd("$D/run", run)} > $OUT/stdout2 2> $OUT/stderr2; echo $? > $OUT/rc2
        cp $D/run/metrics.csv $OUT/""")
    err = (out / "stderr").read_text()
    assert (out / "rc").read_text().strip() == "1", err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: no space left on device: could not write "), err[-3000:]
    assert "resumes from the last checkpoint" in lines[0], lines[0]
    assert not _partials((out / "files").read_text()), (out / "files").read_text()
    assert "2" in (out / "ckpts").read_text().split(), (out / "ckpts").read_text()
    err2 = (out / "stderr2").read_text()
    assert (out / "rc2").read_text().strip() == "0", err2[-3000:]
    assert "resuming" in err2 and " from step 2" in err2, err2[-2000:]
    assert _metrics(str(out)) == uninterrupted
