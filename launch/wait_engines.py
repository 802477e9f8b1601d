"""Waits until every rollout engine answers ``GET /health`` with HTTP 200 (used by slurm_job.sh).

    python3 launch/wait_engines.py [--timeout=SECONDS] [--token-file=FILE] URL [URL ...]

Exits 0 once all engines are healthy; 1 after --timeout seconds (default 1800: vLLM loads and
compiles an 8B model in minutes) naming the engines that never answered; 2 on a usage error.
Progress is printed every 30 s. Standard library only (it runs before any environment is set up).
"""
from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request


def healthy(url: str, token: str | None, timeout_s: float = 5.0) -> bool:
    """True if ``GET url/health`` answers 200 within `timeout_s` seconds."""
    req = urllib.request.Request(url.rstrip("/") + "/health")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("urls", nargs="+", help="engine base URLs, e.g. http://node7:8100")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait in all")
    p.add_argument("--token-file", default=None, help="shared token (sent as a bearer token)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    args = p.parse_args(argv)
    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    pending = list(dict.fromkeys(args.urls))
    start = last_report = time.monotonic()
    while pending:
        pending = [u for u in pending if not healthy(u, token)]
        if not pending:
            break
        now = time.monotonic()
        if now - start > args.timeout:
            print(f"wait_engines: {len(pending)} of {len(args.urls)} engines did not answer /health within "
                  f"{args.timeout:.0f} s: {' '.join(pending)}", file=sys.stderr)
            return 1
        if now - last_report >= 30:
            print(f"wait_engines: {len(args.urls) - len(pending)} of {len(args.urls)} engines healthy after "
                  f"{now - start:.0f} s; waiting for {' '.join(pending[:4])}{' ...' if len(pending) > 4 else ''}",
                  file=sys.stderr)
            last_report = now
        time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
