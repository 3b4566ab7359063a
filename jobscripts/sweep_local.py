"""The local launcher: runs the GEMM searches of the pending points (gemm_search = on), then
the pending points one after another under mpirun, each in a session of its own, and the
report after them. A SIGINT or SIGTERM, raised in the sweep as Stopped, stops the running
point's ranks before their launcher (ranks whose mpirun ended first stay this process's
descendants: it is their subreaper)."""
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time

from sweep_plan import (gemm_search_arguments, gemm_searches, pending_points, point_arguments, rank_command,
                        report_command, result_files, start_failed, start_retry_line, status_text)


def local_command(sweep, point, binary, mpirun):
    """The mpirun command of one point; [env] reaches every rank through -x."""
    # Unbound: a rank's host threads (the comm thread, NCCL's proxy) must not share one core.
    command = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(point.ranks)]
    for name, value in sweep.env:
        command += ["-x", f"{name}={value}"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    return command + rank_command(sweep, binary) + point_arguments(sweep, point)


class Stopped(BaseException):
    """SIGINT or SIGTERM reached the sweep. Not an Exception, so that no handler of errors
    (an HDF5 read's, for one) takes it for one."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stopped(signum, frame):
    # A second signal while the first is handled must not cut the handling short.
    for handled in (signal.SIGINT, signal.SIGTERM):
        signal.signal(handled, signal.SIG_IGN)
    raise Stopped(signum)


def become_subreaper():
    """Ranks whose mpirun ends before them are handed to this process, not to init, so
    that they stay among its descendants and a stop reaches them (Linux only)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def descendants(root_pid):
    """Every live process below root_pid, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                fields = stat_file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], [root_pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def send(pid, signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def reap_orphans():
    """Collects the exit status of ranks handed to this process (become_subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# A stopped rank ends its step, marks its file failed and exits; this long is given it,
# and then the launcher as long again to end on its own before it is signalled, and
# everything left is killed a second later (the ranks are gone well within 10 s).
RANKS_STOP_S = 6.0
LAUNCHER_STOP_S = 1.0


def wait_while(condition, seconds):
    deadline = time.monotonic() + seconds
    while condition() and time.monotonic() < deadline:
        reap_orphans()
        time.sleep(0.05)


def stop_descendants(signum, launcher_pid):
    """Forwards signum to every process below this one but the launcher, also to ranks
    started while this runs, and waits for them. mpirun is signalled only if it has not
    ended once its ranks have: signalled, it kills its ranks at once (before they could
    mark their file failed), and signalled again while it aborts, it can crash. Whatever
    is left then is killed."""
    me = os.getpid()
    signalled = set()

    def ranks_left():
        ranks = [pid for pid in descendants(me) if pid != launcher_pid]
        for pid in ranks:
            if pid not in signalled:
                send(pid, signum)
                signalled.add(pid)
        return ranks

    wait_while(ranks_left, RANKS_STOP_S)
    if launcher_pid:
        launcher_alive = lambda: launcher_pid in descendants(me)  # noqa: E731
        wait_while(launcher_alive, LAUNCHER_STOP_S)
        if launcher_alive():
            try:
                os.killpg(launcher_pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
            wait_while(lambda: descendants(me), LAUNCHER_STOP_S)
    for pid in descendants(me):
        send(pid, signal.SIGKILL)
    reap_orphans()


def run_point(command, log, env=None, mode="w"):
    """Runs one point's launcher, or a GEMM search, in a session of its own (so that a
    Ctrl-C at the terminal reaches the sweep alone, which then stops the point's ranks
    before the launcher), in `env` (default: this process's environment), its output
    written to `log` (opened with `mode`: "a" adds to it); returns its exit status."""
    with open(log, mode) as out:
        out.write(shlex.join(command) + "\n")
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env=env)
        try:
            return process.wait()
        except Stopped as stop:
            stop_descendants(stop.signum, process.pid)
            process.wait()
            raise


def report_after_points(sweep):
    """Writes the report and says where it is, once: the report's own stdout, which is
    that path, is left out."""
    print(f"writing the report: {shlex.join(report_command(sweep))}")
    code = run_report(sweep)
    if code == 0:
        print(f"report: {sweep.output_dir / 'report' / 'report.md'}")
    else:
        print(f"the report did not complete (exit {code}); its messages are above", file=sys.stderr)
    return code


def run_report(sweep):
    """Writes the report, in a session of its own: a Ctrl-C at the terminal reaches the
    sweep alone, which ends the report with SIGTERM (quietly, where SIGINT would print
    Python's traceback)."""
    process = subprocess.Popen(report_command(sweep), start_new_session=True,
                               stdout=subprocess.DEVNULL)
    try:
        return process.wait()
    except Stopped:
        send(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=LAUNCHER_STOP_S)
        except subprocess.TimeoutExpired:
            send(process.pid, signal.SIGKILL)
        raise


class SearchFailed(Exception):
    """A GEMM search ended non-zero: no training point runs."""


def search_environment(sweep, env):
    """A search's environment: the points' (`env`, default this process's) with [env],
    which mpirun gives each rank."""
    return {**(os.environ if env is None else env), **dict(sweep.env)}


def run_gemm_searches(sweep, pending, binary, env=None):
    """Runs the GEMM searches of the pending points one after another, each a process of
    the binary in a session of its own, its output in logs/<label>.log; one that fails
    raises SearchFailed."""
    searches = gemm_searches(sweep, pending)
    for index, search in enumerate(searches, 1):
        log = sweep.output_dir / "logs" / f"{search.label()}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        command = rank_command(sweep, binary) + gemm_search_arguments(sweep, search)
        print(f"[search {index}/{len(searches)}] {search.label()} reserve={search.reserve} ... ", end="", flush=True)
        started = time.monotonic()
        try:
            code = run_point(command, log, search_environment(sweep, env))
        except Stopped as stop:
            print(flush=True)
            stop.point = search
            raise
        outcome = "done" if code == 0 else f"failed (exit {code})"
        print(f"{outcome} in {time.monotonic() - started:.1f} s (log {log})")
        if code != 0:
            raise SearchFailed(f"{search.label()} failed (exit {code}), so no training point ran; its log: {log}")


def run_local(sweep, points, binary, mpirun, env=None):
    """Runs the GEMM searches of the pending points, then those points one after another,
    each launcher in `env` (default: this process's environment); returns the points that
    did not complete. A search that fails raises SearchFailed before any point runs."""
    become_subreaper()
    pending = pending_points(points)
    print(f"sweep {sweep.name}: {len(points) - len(pending)} of {len(points)} point(s) already complete")
    run_gemm_searches(sweep, pending, binary, env)
    failures = []
    for index, point in enumerate(pending, 1):
        point.result.parent.mkdir(parents=True, exist_ok=True)
        log = point.result.with_suffix(".log")
        command = local_command(sweep, point, binary, mpirun)
        print(f"[{index}/{len(pending)}] {point.label()} ... ", end="", flush=True)
        started = time.monotonic()
        try:
            before = result_files(point.result)
            code = run_point(command, log, env)
            if start_failed(code, before, result_files(point.result)):
                with open(log, "a") as out:
                    out.write(start_retry_line(point, code) + "\n")
                print("started once more (the launch ended before the run created its result file) ... ",
                      end="", flush=True)
                code = run_point(command, log, env, mode="a")
        except Stopped as stop:
            print(flush=True)
            stop.point = point
            raise
        seconds = time.monotonic() - started
        status = status_text(point.result)
        print(f"{status} in {seconds:.1f} s (log {log})")
        if code != 0 or status != "complete":
            failures.append(point)
    return failures
