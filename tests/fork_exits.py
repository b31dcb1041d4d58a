"""Run Python code many times, each run in a fresh process that exits the normal way, without
paying the interpreter's and the imports' start-up each time: a parent imports what the runs need
(no thread started yet), then forks one child per run. A child runs ``BODY`` with stdout and stderr
to files, then ends like any script: ``SystemExit`` (or falling off the end) through interpreter
finalisation and the C runtime's ``exit()``, where static destructors run (where pyarrow's abort
struck, apache/arrow#34314). Prints one JSON line: [[exit status or -signal, stdout, stderr], ...].

    python fork_exits.py RUNS PRELUDE BODY [ARG ...]     (sys.argv[1:] of both: the ARGs)
"""
import json
import os
import sys
import tempfile

runs, prelude, body = int(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.argv = [sys.argv[0], *sys.argv[4:]]
scope = {"__name__": "__main__"}
exec(prelude, scope)
results = []
for _ in range(runs):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: one run, then the interpreter's own exit
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            exec(body, scope)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)  # -N for a signal (SIGABRT: -6)
        out.seek(0)
        err.seek(0)
        results.append([code, out.read().decode(errors="replace"), err.read().decode(errors="replace")])
print(json.dumps(results))
