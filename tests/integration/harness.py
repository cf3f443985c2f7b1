"""harness.py: what every integration script shares: programs that report
readiness on a NOTIFY_SOCKET the script binds, and the `main` that runs one
named case in a temporary directory and kills whatever the case left running.

test-daemon.py, test-hostile.py and test-http.py build on it; tkvwire.py is the
wire format, this is only process plumbing (Python standard library only).
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# Every Notified program started by this process, killed by run_cases at the end.
RUNNING = []


class Notified:
    """A program started with NOTIFY_SOCKET bound to tmp/NOTIFY_NAME.

    stderr=None: its stderr is kept in .stderr (a list of lines) and echoed to the
    test's log prefixed with [NAME]; otherwise it is passed to Popen as is (a file
    descriptor the case reads itself). .messages holds the notifications seen.
    """

    def __init__(self, name, cmd, tmp, env=None, notify_name=None, stderr=None):
        RUNNING.append(self)
        self.name = name
        self.notify_path = os.path.join(tmp, notify_name or "notify-" + name)
        try:
            os.unlink(self.notify_path)  # a restart on the same directory
        except FileNotFoundError:
            pass
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.notify.settimeout(1)
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path, **(env or {}))
        env = {k: v for k, v in env.items() if v is not None}  # None: remove from the environment
        self.stderr, self.messages = [], []
        if stderr is None:
            self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
            self.reader = threading.Thread(target=self._drain, daemon=True)
        else:
            self.proc = subprocess.Popen(cmd, env=env, stderr=stderr)
            self.reader = threading.Thread(target=lambda: None)
        self.reader.start()

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr.append(line)
            sys.stderr.write("[%s] %s" % (self.name, line))

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("%s exited with %d before READY=1" % (self.name, self.proc.returncode))
            try:
                msg = self.notify.recv(4096).decode()
            except socket.timeout:
                continue
            self.messages.append(msg)
            if "READY=1" in msg.split("\n"):
                return self
        raise AssertionError("%s: no READY=1 within %d s" % (self.name, timeout))

    def stop(self, timeout=60):
        """SIGTERM, then require exit status 0 (under ASan that also means no leak)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        assert rc == 0, "%s exited with %d" % (self.name, rc)
        return rc


def run_cases(cases, flags, prefix, setup=None):
    """The script's main: FLAGS (required --options) and a case name from CASES
    (name -> fn(args, tmp)); runs it in a fresh temporary directory PREFIX*,
    then kills what is still running and removes the directory. Returns the exit
    status: the case's return value, 0 for None."""
    ap = argparse.ArgumentParser()
    for flag in flags:
        ap.add_argument("--" + flag, required=True)
    ap.add_argument("case", choices=sorted(cases))
    args = ap.parse_args()
    if setup:
        setup(args)
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        rc = cases[args.case](args, tmp)
    finally:
        for p in RUNNING:
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return rc or 0


def cases_of(namespace):
    """The case_NAME functions of a module's globals(), by NAME."""
    return {k[5:]: v for k, v in namespace.items() if k.startswith("case_")}
