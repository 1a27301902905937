#!/usr/bin/env python3
"""`mpirun -np N trainscope run CONFIG` vs the same config run as N threads of one process.

Runs both with --json, takes the loss of every {"event":"step"} line and fails (exit 1) unless
both runs completed the same number of steps and every loss agrees to --rtol (relative), the
multi-process run file holds every rank (`trainscope analyze --json` reports the same ranks as
for the in-process run) and records its clock alignment.
Modes:
  --expect-world-error   a world size different from the process count is refused with a
                         message naming both numbers;
  --launcher slurm       each process sees Slurm's variables (SLURM_PROCID, SLURM_STEP_NUM_TASKS,
                         SLURM_LOCALID) instead of Open MPI's rank variables: there is no Slurm
                         here, so mpirun starts the processes and a wrapper substitutes the
                         variables; the run must say it was a slurm launch;
  --clock-measure        TS_CLOCK_ALIGN=measure: clocks of same-host processes are measured by
                         ping-pong; on one host the true offset is 0, so |offset| <= error bound;
  --inject-failure R:S   global rank R fails at iteration S: the run must end well before the
                         60 s communication timeout, failed, naming process R and the op;
  --kill-process P       process P is killed (SIGKILL) after the first step: the run must end
                         within a bounded time and its run file must say what stopped it;
  --checkpoint           the mpirun run saves after steps/2 steps; an mpirun run and a one-process
                         run resume from it, and an mpirun run resumes from a one-process save:
                         the resumed steps' losses must equal the uninterrupted run's.
"""
import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time


def run(cmd, env):
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def events(stdout):
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def losses_of(evs):
    return [e["loss"] for e in evs if e.get("event") == "step"]


def compare(a, b, rtol):
    """Empty list when the loss lists agree, else the reasons."""
    if len(a) != len(b):
        return ["%d steps vs %d steps" % (len(a), len(b))]
    bad = []
    for i, (x, y) in enumerate(zip(a, b)):
        if abs(x - y) > rtol * max(abs(x), abs(y), 1e-30):
            bad.append("step %d: %.9g vs %.9g (rel %.3g)" % (i + 1, x, y, abs(x - y) / max(abs(x), abs(y))))
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--trainscope", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--expect-world-error", action="store_true")
    ap.add_argument("--launcher", choices=["openmpi", "slurm"], default="openmpi")
    ap.add_argument("--clock-measure", action="store_true")
    ap.add_argument("--inject-failure", default="")
    ap.add_argument("--kill-process", type=int, default=-1)
    ap.add_argument("--checkpoint", action="store_true")
    ap.add_argument("mpiflags", nargs="*")
    a = ap.parse_args()

    # The comparison must be able to fail: a perturbation of 10x the tolerance is caught.
    if not compare([1.0, 2.0], [1.0, 2.0 * (1 + 10 * a.rtol)], a.rtol) or compare([1.0], [1.0], a.rtol):
        print("FAIL: loss comparison self-check")
        return 1

    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    tmp = tempfile.mkdtemp(prefix="ts_mpi_run_")
    mpi_db = os.path.join(tmp, "mpi.db")
    ts_cmd = [a.trainscope, "run", a.config, "--json", "--steps", str(a.steps), "--run-file", mpi_db]
    if a.launcher == "slurm":
        # What srun gives each task, in place of Open MPI's rank variables (MPI itself still
        # connects through mpirun's PMIx server).
        wrap = ('export SLURM_PROCID=$OMPI_COMM_WORLD_RANK SLURM_STEP_NUM_TASKS=$OMPI_COMM_WORLD_SIZE '
                'SLURM_LOCALID=$OMPI_COMM_WORLD_LOCAL_RANK SLURM_JOB_ID=4242; '
                'unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK '
                'OMPI_COMM_WORLD_LOCAL_SIZE OMPI_COMM_WORLD_NODE_RANK; exec "$@"')
        ts_cmd = ["sh", "-c", wrap, "sh"] + ts_cmd
    mpi_cmd = [a.mpiexec, "-n", str(a.np)] + a.mpiflags + ts_cmd
    if a.clock_measure:
        env["TS_CLOCK_ALIGN"] = "measure"
        mpi_cmd[1:1] = ["-x", "TS_CLOCK_ALIGN"]
    if a.inject_failure:
        env["TRAINSCOPE_INJECT_FAILURE"] = a.inject_failure
        mpi_cmd[1:1] = ["-x", "TRAINSCOPE_INJECT_FAILURE"]
        return check_failure(a, mpi_cmd, env, mpi_db)
    if a.kill_process >= 0:
        return check_kill(a, mpi_cmd, env, mpi_db)
    if a.checkpoint:
        return check_checkpoint(a, env, tmp)
    if a.expect_world_error:
        rc, out, err = run(mpi_cmd, env)
        text = out + err
        if rc == 0 or "mpirun -np" not in text or ("started %d processes" % a.np) not in text:
            print("FAIL: expected a world-size error naming %d processes; rc=%d\n%s" % (a.np, rc, text))
            return 1
        print("OK: refused:", [l for l in text.splitlines() if "error" in l][:1])
        return 0

    # Reference: the same layout as threads of one process (no launcher variables).
    single_env = {k: v for k, v in env.items() if not k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_"))}
    rc, out, err = run([a.trainscope, "run", a.config, "--json", "--steps", str(a.steps), "--run-file",
                        os.path.join(tmp, "single.db")], single_env)
    if rc != 0:
        print("FAIL: single-process run exited %d\n%s\n%s" % (rc, out, err))
        return 1
    single = losses_of(events(out))

    rc, out, err = run(mpi_cmd, env)
    if rc != 0:
        print("FAIL: mpirun run exited %d\n%s\n%s" % (rc, out, err))
        return 1
    evs = events(out)
    multi = losses_of(evs)
    ends = [e for e in evs if e.get("event") == "end"]
    starts = [e for e in evs if e.get("event") == "start"]
    # Only process 0 prints: one start, one end, one line per step.
    if len(starts) != 1 or len(ends) != 1 or ends[0].get("status") != "completed":
        print("FAIL: expected one start and one completed end event from process 0:\n" + out + err)
        return 1
    if len(single) != a.steps:
        print("FAIL: single-process run logged %d steps, expected %d" % (len(single), a.steps))
        return 1
    bad = compare(single, multi, a.rtol)
    print("single-process losses:", single)
    print("mpirun -np %d losses:  " % a.np, multi)
    if bad:
        print("FAIL: losses differ:\n  " + "\n  ".join(bad))
        return 1
    print("OK: %d steps agree to %g relative" % (len(single), a.rtol))
    return check_run_file(a, os.path.join(tmp, "single.db"), mpi_db, single_env)


def step_losses(evs):
    return {e["step"]: e["loss"] for e in evs if e.get("event") == "step"}


def check_checkpoint(a, env, tmp):
    single_env = {k: v for k, v in env.items() if not k.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_"))}
    half = a.steps // 2

    def ts(extra, mpi, name):
        # A constant lr: the schedule must not depend on --steps (the saving run is shorter).
        cmd = [a.trainscope, "run", a.config, "--json", "--run-file", os.path.join(tmp, name + ".db"),
               "--set", "lr_decay_style=constant"] + extra
        if mpi:
            cmd = [a.mpiexec, "-n", str(a.np)] + a.mpiflags + cmd
        rc, out, err = run(cmd, env if mpi else single_env)
        if rc != 0:
            raise RuntimeError("%s exited %d\n%s\n%s" % (name, rc, out, err))
        return step_losses(events(out))

    try:
        ref = ts(["--steps", str(a.steps)], False, "reference")
        d_mpi, d_one = os.path.join(tmp, "ckpt_mpi"), os.path.join(tmp, "ckpt_one")
        first = ts(["--steps", str(half), "--set", "save=" + d_mpi], True, "mpi_save")
        ts(["--steps", str(half), "--set", "save=" + d_one], False, "one_save")
        runs = {
            "mpirun save -> mpirun load": ts(["--steps", str(a.steps), "--set", "load=" + d_mpi], True, "mpi_load"),
            "mpirun save -> one-process load": ts(["--steps", str(a.steps), "--set", "load=" + d_mpi], False, "one_load"),
            "one-process save -> mpirun load": ts(["--steps", str(a.steps), "--set", "load=" + d_one], True, "mpi_load2"),
        }
    except RuntimeError as e:
        print("FAIL:", e)
        return 1
    if sorted(ref) != list(range(1, a.steps + 1)):
        print("FAIL: the reference logged steps", sorted(ref))
        return 1
    bad = compare([ref[k] for k in sorted(first)], [first[k] for k in sorted(first)], a.rtol)
    if sorted(first) != list(range(1, half + 1)) or bad:
        print("FAIL: the saving mpirun run logged", first, bad)
        return 1
    for what, got in runs.items():
        want_steps = list(range(half + 1, a.steps + 1))
        if sorted(got) != want_steps:
            print("FAIL: %s logged steps %s, expected %s" % (what, sorted(got), want_steps))
            return 1
        bad = compare([ref[k] for k in want_steps], [got[k] for k in want_steps], a.rtol)
        if bad:
            print("FAIL: %s: resumed losses differ from the uninterrupted run:\n  %s" % (what, "\n  ".join(bad)))
            return 1
        print("OK: %s: steps %s equal the uninterrupted run" % (what, want_steps))
    return 0


def metadata(db, key):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        row = con.execute("SELECT value FROM metadata WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None
    finally:
        con.close()


def run_status(db):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        row = con.execute("SELECT status, status_reason FROM run").fetchone()
        logs = [r[0] for r in con.execute("SELECT level || ': ' || text FROM logs ORDER BY ts")]
        return (row[0], row[1] or "") if row else (None, ""), logs
    finally:
        con.close()


def analyzed_ranks(trainscope, db, env):
    rc, out, err = run([trainscope, "analyze", db, "--json"], env)
    if rc != 0:
        return None, "analyze exited %d: %s" % (rc, err)
    doc = json.loads(out)
    return sorted(r["rank"] for r in doc.get("ranks", [])), doc


def check_run_file(a, single_db, mpi_db, env):
    want, _ = analyzed_ranks(a.trainscope, single_db, env)
    got, doc = analyzed_ranks(a.trainscope, mpi_db, env)
    if got is None or want is None:
        print("FAIL: analyze:", doc)
        return 1
    if got != want or len(got) < a.np:
        print("FAIL: analyze of the mpirun run reports ranks %s, the in-process run %s (np %d)" % (got, want, a.np))
        return 1
    print("OK: analyze reports every rank of the mpirun run:", got)
    align = metadata(mpi_db, "clock_alignment")
    if not align:
        print("FAIL: the run file has no clock_alignment metadata")
        return 1
    align = json.loads(align)
    if len(align) != a.np:
        print("FAIL: clock_alignment lists %d processes, expected %d: %s" % (len(align), a.np, align))
        return 1
    for e in align[1:]:
        if a.clock_measure:
            if e["method"] != "ping-pong" or abs(e["offset_ns"]) > e["error_ns"] or e["error_ns"] <= 0:
                print("FAIL: a same-host clock measured by ping-pong must have |offset| <= error > 0:", e)
                return 1
        elif e["method"] != "same host clock" or e["offset_ns"] != 0 or e["error_ns"] != 0:
            print("FAIL: a same-host process shares process 0's clock (offset 0, error 0):", e)
            return 1
    print("OK: clock alignment:", align)
    launcher = metadata(mpi_db, "launcher")
    if launcher != a.launcher:
        print("FAIL: the run says launcher %r, expected %r" % (launcher, a.launcher))
        return 1
    print("OK: launcher", launcher)
    return 0


def check_failure(a, mpi_cmd, env, mpi_db):
    rank, step = a.inject_failure.split(":")
    t0 = time.time()
    rc, out, err = run(mpi_cmd, env)
    took = time.time() - t0
    (status, reason), logs = run_status(mpi_db)
    print("rc %d after %.1f s; status %s: %s" % (rc, took, status, reason))
    if rc == 0 or status != "failed":
        print("FAIL: expected a failed run\n" + out + err)
        return 1
    if took > 40:
        print("FAIL: the failure took %.1f s to stop every process (the timeout is 60 s)" % took)
        return 1
    if ("process %s " % rank) not in reason or "injected_failure" not in reason:
        print("FAIL: the run's reason must name process %s and the failing op: %r" % (rank, reason))
        return 1
    print("OK: failure of rank %s stopped the run in %.1f s with the reason" % (rank, took))
    return 0


def check_kill(a, mpi_cmd, env, mpi_db):
    p = subprocess.Popen(mpi_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 200
    steps = 0
    for line in p.stdout:
        if '"event":"step"' in line.replace(" ", ""):
            steps += 1
            break
        if time.time() > deadline:
            break
    if steps == 0:
        p.kill()
        print("FAIL: no step before killing")
        return 1
    align = json.loads(metadata(mpi_db, "clock_alignment") or "[]")
    victim = [e for e in align if e["process"] == a.kill_process]
    if not victim:
        p.kill()
        print("FAIL: no pid for process %d in the run file" % a.kill_process)
        return 1
    t0 = time.time()
    os.kill(victim[0]["pid"], signal.SIGKILL)
    try:
        p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        print("FAIL: the run did not end within 60 s of killing process %d" % a.kill_process)
        return 1
    took = time.time() - t0
    (status, reason), logs = run_status(mpi_db)
    print("after the kill: rc %d in %.1f s; status %s: %s" % (p.returncode, took, status, reason))
    if took > 30:
        print("FAIL: ending the run took %.1f s" % took)
        return 1
    if status not in ("failed", "cancelled") or ("process %d " % a.kill_process) not in reason:
        print("FAIL: the run file must end the run naming process %d: %s / %r" % (a.kill_process, status, reason))
        return 1
    print("OK: killed process %d ended the run in %.1f s: %s" % (a.kill_process, took, reason))
    return 0


if __name__ == "__main__":
    sys.exit(main())
