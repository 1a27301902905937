#!/usr/bin/env python3
"""`mpirun -np N trainscope run CONFIG` vs the same config run as N threads of one process.

Runs both with --json, takes the loss of every {"event":"step"} line and fails (exit 1) unless
both runs completed the same number of steps and every loss agrees to --rtol (relative).
With --expect-world-error it instead checks that a world size different from the process
count is refused with a message naming both numbers.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


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
    mpi_cmd = [a.mpiexec, "-n", str(a.np)] + a.mpiflags + [a.trainscope, "run", a.config, "--json",
                                                            "--steps", str(a.steps), "--run-file",
                                                            os.path.join(tmp, "mpi.db")]
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
