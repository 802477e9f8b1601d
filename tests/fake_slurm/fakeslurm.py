"""Stand-ins for SLURM's `sbatch`, `srun` and `scontrol` that run a job on this one machine.

Used by tests/test_launch.py to run the real launch/slurm_job.sh. The "cluster" is a list of node
names in FAKE_SLURM_NODES (comma-separated, in order); tests use loopback addresses
(127.0.0.1, 127.0.0.2, ...) as names, so a process bound to "its node's" address is reachable
by that name and processes of different nodes never share an address. Job state (ids, the
spooled script, running steps) lives under FAKE_SLURM_STATE. Each task of a step runs as its own
process group (session): a "node" of a one-task-per-node step is one process group.

What is emulated, from the SLURM man pages (srun(1), sbatch(1), scontrol(1)):
  * sbatch: `#SBATCH` directives up to the first command line, overridden by command-line options;
    the script runs from a copy in a spool directory (as slurmd runs it), in the submit directory,
    with SLURM_JOB_ID, SLURM_JOB_NODELIST (compressed hostlist), SLURM_JOB_NUM_NODES / SLURM_NNODES,
    SLURM_SUBMIT_DIR, SLURMD_NODENAME (the first node), SLURM_NTASKS / SLURM_NTASKS_PER_NODE,
    SLURM_GPUS_PER_NODE; output to --output (%x = job name, %j = job id; default slurm-%j.out).
    When the batch script exits, the job ends: tasks of steps still running are killed (SIGTERM,
    then SIGKILL after FAKE_SLURM_KILL_WAIT s), as SLURM kills everything left in a job. The steps
    that were still running are listed in FAKE_SLURM_STATE/job_<id>/leftover_steps.txt.
  * srun (inside a job only): --nodes/-N, --ntasks/-n, --ntasks-per-node, --relative/-r,
    --kill-on-bad-exit/-K[=0|1], --cpus-per-task/-c (accepted, not enforced), --export=ALL; the
    defaults come from SLURM_NNODES / SLURM_NTASKS / SLURM_NTASKS_PER_NODE / SLURM_KILL_BAD_EXIT
    as srun's input environment variables do. Tasks are placed in blocks on nodes
    [relative, relative + nodes) of the allocation and get SLURM_PROCID, SLURM_LOCALID,
    SLURM_NODEID (node index within the step), SLURM_NTASKS, SLURM_NNODES, SLURM_STEP_ID,
    SLURM_STEP_NODELIST, SLURMD_NODENAME and, when the job asked for GPUs,
    CUDA_VISIBLE_DEVICES=0..G-1 (a step gets all the job's GRES by default). Signals sent to
    srun (TERM, INT, HUP, QUIT, USR1, USR2) are forwarded to every task's process group.
    With kill-on-bad-exit, a task exiting non-zero gets the other tasks SIGTERM, then SIGKILL.
    The exit code is the highest task exit code, 128 + signal for a task killed by a signal.
  * scontrol show hostnames [HOSTLIST] (default SLURM_JOB_NODELIST).
Deliberately stricter than SLURM, so that a launch script's mistakes fail here: unknown options
are errors; a step that does not fit (relative + nodes beyond the allocation, more tasks than
nodes x ntasks-per-node, fewer tasks than nodes) is an error where SLURM may warn and adjust;
sbatch supports only --wait (run the job and return its exit code).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def _err(prog: str, msg: str) -> int:
    print(f"{prog}: error: {msg} (fake SLURM, tests/fake_slurm)", file=sys.stderr)
    return 1


# ---------------------------------------------------------------------------------------------
# Hostlists
# ---------------------------------------------------------------------------------------------

def expand_hostlist(spec: str) -> list[str]:
    """`a[1-3,07],b` -> a1 a2 a3 a07 b (SLURM hostlist syntax, one bracket group per name)."""
    out, depth, cur = [], 0, ""
    items = []
    for ch in spec:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    items.append(cur)
    for item in filter(None, (i.strip() for i in items)):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\]([^\[\]]*)", item)
        if not m:
            if "[" in item or "]" in item:
                raise ValueError(f"bad hostlist {spec!r}")
            out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            hi = hi or lo
            if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
                raise ValueError(f"bad range {r!r} in hostlist {spec!r}")
            width = len(lo) if lo.startswith("0") else 0
            out.extend(f"{prefix}{str(i).zfill(width)}{suffix}" for i in range(int(lo), int(hi) + 1))
    return out


def compress_hostlist(names: list[str]) -> str:
    """The inverse of `expand_hostlist` for names that end in a number: 127.0.0.1,127.0.0.2 -> 127.0.0.[1-2]."""
    groups: list[tuple[str, list[str]]] = []
    for n in names:
        m = re.fullmatch(r"(.*?)(\d+)", n)
        prefix, num = (m.group(1), m.group(2)) if m else (n, "")
        if groups and groups[-1][0] == prefix and num and groups[-1][1]:
            groups[-1][1].append(num)
        else:
            groups.append((prefix, [num] if num else []))
    parts = []
    for prefix, nums in groups:
        if not nums:
            parts.append(prefix)
            continue
        if len(nums) == 1:
            parts.append(prefix + nums[0])
            continue
        runs, start, prev = [], nums[0], nums[0]
        for x in nums[1:] + [None]:
            if x is not None and int(x) == int(prev) + 1 and len(x) == len(prev):
                prev = x
                continue
            runs.append(start if start == prev else f"{start}-{prev}")
            start = prev = x
        parts.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(parts)


# ---------------------------------------------------------------------------------------------
# Option parsing (GNU style: --name=value, --name value, -x value, -xvalue)
# ---------------------------------------------------------------------------------------------

def parse_options(prog: str, argv: list[str], spec: dict[str, tuple[str, str]]) -> tuple[dict, list[str]]:
    """spec: option string -> (key, kind) with kind "value", "flag" or "optional" (value only as
    --name=value / -Xvalue). Parsing stops at the first non-option. Raises ValueError."""
    opts, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        name, eq, val = a.partition("=") if a.startswith("--") else (a[:2], "", a[2:])
        if a.startswith("-") and not a.startswith("--") and val:
            eq = "="
        if name not in spec:
            raise ValueError(f"unrecognized option {name!r}")
        key, kind = spec[name]
        if kind == "flag":
            if eq:
                raise ValueError(f"option {name} takes no value")
            opts[key] = True
        elif kind == "optional":
            opts[key] = val if eq else "1"
        else:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise ValueError(f"option {name} needs a value")
                val = argv[i]
            opts[key] = val
        i += 1
    return opts, argv[i:]


def _int(opts: dict, key: str, env: str | None = None, default: int | None = None) -> int | None:
    v = opts.get(key, os.environ.get(env) if env else None)
    if v is None or v == "":
        return default
    try:
        return int(str(v).split("(")[0])
    except ValueError:
        raise ValueError(f"{key}={v!r} is not an integer") from None


# ---------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------

def _state_dir() -> str:
    d = os.environ.get("FAKE_SLURM_STATE")
    if not d:
        raise ValueError("FAKE_SLURM_STATE is not set")
    os.makedirs(d, exist_ok=True)
    return d


def _next_id(path: str, start: int) -> int:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        n = int(text) + 1 if text else start
        f.seek(0)
        f.truncate()
        f.write(str(n))
        return n


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_groups(pgids: list[int], wait_s: float) -> None:
    """SIGCONT + SIGTERM to each process group, SIGKILL to those left after `wait_s` seconds."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        for g in pgids:
            try:
                os.killpg(g, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_group_alive(g) for g in pgids):
        time.sleep(0.1)
    for g in pgids:
        try:
            os.killpg(g, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _kill_wait() -> float:
    return float(os.environ.get("FAKE_SLURM_KILL_WAIT", "5"))


# ---------------------------------------------------------------------------------------------
# sbatch
# ---------------------------------------------------------------------------------------------

SBATCH_OPTS = {
    "--nodes": ("nodes", "value"), "-N": ("nodes", "value"),
    "--job-name": ("job_name", "value"), "-J": ("job_name", "value"),
    "--output": ("output", "value"), "-o": ("output", "value"),
    "--error": ("error", "value"), "-e": ("error", "value"),
    "--wait": ("wait", "flag"), "-W": ("wait", "flag"),
    "--gpus-per-node": ("gpus_per_node", "value"),
    "--ntasks-per-node": ("ntasks_per_node", "value"),
    "--cpus-per-task": ("cpus_per_task", "value"), "-c": ("cpus_per_task", "value"),
    "--exclusive": ("exclusive", "flag"),
    "--time": ("time", "value"), "-t": ("time", "value"),
    "--partition": ("partition", "value"), "-p": ("partition", "value"),
    "--account": ("account", "value"), "-A": ("account", "value"),
}


def _directives(script: str) -> list[str]:
    """`#SBATCH` options of a script: those before its first command line (sbatch(1))."""
    args = []
    with open(script) as f:
        for n, line in enumerate(f):
            s = line.strip()
            if n == 0 and s.startswith("#!"):
                continue
            if not s or (s.startswith("#") and not s.startswith("#SBATCH")):
                continue
            if not s.startswith("#SBATCH"):
                break
            args.extend(s[len("#SBATCH"):].split("#")[0].split())
    return args


def sbatch(argv: list[str]) -> int:
    prog = "sbatch"
    try:
        cli, rest = parse_options(prog, argv, SBATCH_OPTS)
        if not rest:
            return _err(prog, "no batch script given")
        script, script_args = rest[0], rest[1:]
        if not os.path.isfile(script):
            return _err(prog, f"unable to open file {script}")
        directives, leftover = parse_options(prog, _directives(script), SBATCH_OPTS)
        if leftover:
            return _err(prog, f"bad #SBATCH line in {script}: {' '.join(leftover)}")
        opts = {**directives, **cli}
        cluster = [n for n in os.environ.get("FAKE_SLURM_NODES", "").split(",") if n]
        if not cluster:
            return _err(prog, "FAKE_SLURM_NODES is empty")
        nnodes = _int(opts, "nodes", default=1)
        if not 1 <= nnodes <= len(cluster):
            return _err(prog, f"Batch job submission failed: Requested node configuration is not available "
                              f"({nnodes} nodes; the cluster has {len(cluster)})")
        if not opts.get("wait"):
            return _err(prog, "only `sbatch --wait` is emulated")
        state = _state_dir()
    except ValueError as e:
        return _err(prog, str(e))

    job_id = _next_id(os.path.join(state, "last_job_id"), 1001)
    job_dir = os.path.join(state, f"job_{job_id}")
    os.makedirs(os.path.join(job_dir, "steps"))
    spool = os.path.join(job_dir, "slurm_script")
    shutil.copyfile(script, spool)
    os.chmod(spool, 0o755)
    nodes = cluster[:nnodes]
    name = opts.get("job_name") or os.path.basename(script)
    submit_dir = os.getcwd()

    def out_path(pattern: str) -> str:
        p = pattern.replace("%x", name).replace("%j", str(job_id))
        return p if os.path.isabs(p) else os.path.join(submit_dir, p)

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    nodelist = compress_hostlist(nodes)
    env.update(SLURM_JOB_ID=str(job_id), SLURM_JOBID=str(job_id), SLURM_JOB_NAME=name,
               SLURM_JOB_NODELIST=nodelist, SLURM_NODELIST=nodelist, SLURM_JOB_NUM_NODES=str(nnodes),
               SLURM_NNODES=str(nnodes), SLURM_SUBMIT_DIR=submit_dir, SLURM_SUBMIT_HOST=socket.gethostname(),
               SLURMD_NODENAME=nodes[0], SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0",
               SLURM_CLUSTER_NAME="fakecluster", SLURM_JOB_PARTITION=opts.get("partition", "fake"))
    if "ntasks_per_node" in opts:
        tpn = _int(opts, "ntasks_per_node")
        env.update(SLURM_NTASKS_PER_NODE=str(tpn), SLURM_NTASKS=str(tpn * nnodes), SLURM_NPROCS=str(tpn * nnodes))
    if "gpus_per_node" in opts:
        env["SLURM_GPUS_PER_NODE"] = opts["gpus_per_node"]
    if "cpus_per_task" in opts:
        env["SLURM_CPUS_PER_TASK"] = opts["cpus_per_task"]
    print(f"Submitted batch job {job_id}", flush=True)
    out = open(out_path(opts.get("output", "slurm-%j.out")), "ab")
    err = open(out_path(opts["error"]), "ab") if "error" in opts else out
    proc = subprocess.Popen([spool, *script_args], cwd=submit_dir, env=env, stdout=out, stderr=err,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    _write_json(os.path.join(job_dir, "batch.json"), {"pid": proc.pid, "nodes": nodes})

    def step_groups() -> dict[str, list[int]]:
        groups = {}
        steps = os.path.join(job_dir, "steps")
        for f in sorted(os.listdir(steps)):
            if f.endswith(".json"):
                try:
                    with open(os.path.join(steps, f)) as fh:
                        groups[f[:-5]] = json.load(fh)["pgids"]
                except (OSError, ValueError, KeyError):
                    pass
        return groups

    def cancel(signum, frame):  # scancel-like: the whole job
        _kill_groups([proc.pid] + [g for gs in step_groups().values() for g in gs], _kill_wait())

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, cancel)
    rc = proc.wait()
    # The job ends with its batch script: whatever still runs in it is killed.
    left = {sid: gs for sid, gs in step_groups().items() if any(_group_alive(g) for g in gs)}
    if _group_alive(proc.pid):
        left["batch"] = [proc.pid]
    if left:
        with open(os.path.join(job_dir, "leftover_steps.txt"), "w") as f:
            f.write("\n".join(sorted(left)) + "\n")
        _kill_groups([g for gs in left.values() for g in gs], _kill_wait())
    out.close()
    if err is not out:
        err.close()
    return rc if rc >= 0 else 1  # sbatch --wait: 1 when the job ended by a signal


# ---------------------------------------------------------------------------------------------
# srun
# ---------------------------------------------------------------------------------------------

SRUN_OPTS = {
    "--nodes": ("nodes", "value"), "-N": ("nodes", "value"),
    "--ntasks": ("ntasks", "value"), "-n": ("ntasks", "value"),
    "--ntasks-per-node": ("ntasks_per_node", "value"),
    "--relative": ("relative", "value"), "-r": ("relative", "value"),
    "--kill-on-bad-exit": ("kill_on_bad_exit", "optional"), "-K": ("kill_on_bad_exit", "optional"),
    "--cpus-per-task": ("cpus_per_task", "value"), "-c": ("cpus_per_task", "value"),
    "--export": ("export", "value"),
}


def srun(argv: list[str]) -> int:
    prog = "srun"
    job_id = os.environ.get("SLURM_JOB_ID")
    try:
        state = _state_dir()
        job_dir = os.path.join(state, f"job_{job_id}")
        if not job_id or not os.path.isdir(job_dir):
            return _err(prog, "the fake srun runs only inside a job started by the fake sbatch")
        opts, cmd = parse_options(prog, argv, SRUN_OPTS)
        if not cmd:
            return _err(prog, "no command given")
        if opts.get("export", "ALL") != "ALL":
            return _err(prog, "only --export=ALL is emulated")
        alloc = expand_hostlist(os.environ["SLURM_JOB_NODELIST"])
        rel = _int(opts, "relative", default=0)
        nnodes = _int(opts, "nodes", "SLURM_NNODES", default=len(alloc) - rel)
        tpn = _int(opts, "ntasks_per_node", "SLURM_NTASKS_PER_NODE")
        ntasks = _int(opts, "ntasks", "SLURM_NTASKS", default=nnodes * (tpn or 1))
        kill_bad = str(opts.get("kill_on_bad_exit", os.environ.get("SLURM_KILL_BAD_EXIT", "0"))) not in ("0", "")
    except (ValueError, KeyError) as e:
        return _err(prog, str(e))
    if rel < 0 or nnodes < 1 or rel + nnodes > len(alloc):
        return _err(prog, f"--relative={rel} --nodes={nnodes} does not fit the job's {len(alloc)} nodes")
    if ntasks < nnodes:
        return _err(prog, f"--ntasks={ntasks} is fewer than --nodes={nnodes}")
    if tpn is not None and ntasks > nnodes * tpn:
        return _err(prog, f"--ntasks={ntasks} does not fit --nodes={nnodes} x --ntasks-per-node={tpn} "
                          "(SLURM_NTASKS / SLURM_NTASKS_PER_NODE of the job count when the options are not given)")
    nodes = alloc[rel:rel + nnodes]
    per_node = [ntasks // nnodes + (1 if i < ntasks % nnodes else 0) for i in range(nnodes)]
    step_id = _next_id(os.path.join(job_dir, "last_step_id"), 0)
    gpus = os.environ.get("SLURM_GPUS_PER_NODE", "")
    g = int(gpus.rsplit(":", 1)[-1]) if gpus else 0
    procs = []
    pgids: list[int] = []
    record = os.path.join(job_dir, "steps", f"{step_id}.json")
    forwarded = {"sig": None}

    def forward(signum, frame):
        forwarded["sig"] = signum
        for p in pgids:
            try:
                os.killpg(p, signum)
            except ProcessLookupError:
                pass

    for s in FORWARDED:
        signal.signal(s, forward)
    rank = 0
    for node_index, (node, k) in enumerate(zip(nodes, per_node)):
        for local in range(k):
            env = dict(os.environ)
            env.update(SLURM_STEP_ID=str(step_id), SLURM_STEPID=str(step_id), SLURM_PROCID=str(rank),
                       SLURM_LOCALID=str(local), SLURM_NODEID=str(node_index), SLURM_NTASKS=str(ntasks),
                       SLURM_NPROCS=str(ntasks), SLURM_NNODES=str(nnodes), SLURM_STEP_NUM_NODES=str(nnodes),
                       SLURM_STEP_NUM_TASKS=str(ntasks), SLURM_STEP_NODELIST=compress_hostlist(nodes),
                       SLURMD_NODENAME=node)
            if g:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(g))
            p = subprocess.Popen(cmd, env=env, start_new_session=True)
            procs.append(p)
            pgids.append(p.pid)
            rank += 1
    _write_json(record, {"pgids": pgids, "nodes": nodes, "cmd": cmd})
    codes: dict[int, int] = {}
    killed = False
    while len(codes) < len(procs):
        for i, p in enumerate(procs):
            if i not in codes and p.poll() is not None:
                codes[i] = p.returncode
                if kill_bad and p.returncode != 0 and not killed:
                    killed = True
                    print(f"srun: error: task {i} on {nodes[min(i, len(nodes) - 1)]}: exited with code "
                          f"{p.returncode}; terminating the step (--kill-on-bad-exit)", file=sys.stderr)
                    others = [pgids[j] for j in range(len(procs)) if j not in codes]
                    _kill_groups(others, _kill_wait())
        time.sleep(0.05)
    # Like slurmstepd, end whatever the tasks left behind in their process groups.
    _kill_groups([g for g in pgids if _group_alive(g)], _kill_wait())
    try:
        os.remove(record)
    except OSError:
        pass
    return max(c if c >= 0 else 128 - c for c in codes.values())


# ---------------------------------------------------------------------------------------------
# scontrol
# ---------------------------------------------------------------------------------------------

def scontrol(argv: list[str]) -> int:
    prog = "scontrol"
    if len(argv) < 2 or argv[0] != "show" or argv[1] not in ("hostnames", "hostname"):
        return _err(prog, "only `scontrol show hostnames [HOSTLIST]` is emulated")
    spec = argv[2] if len(argv) > 2 else os.environ.get("SLURM_JOB_NODELIST", "")
    if not spec:
        return _err(prog, "no hostlist given and SLURM_JOB_NODELIST is not set")
    try:
        sys.stdout.write("".join(f"{h}\n" for h in expand_hostlist(spec)))  # one write, as a C program's buffer
    except ValueError as e:
        return _err(prog, str(e))
    return 0
