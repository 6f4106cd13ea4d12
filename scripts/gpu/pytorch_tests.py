#!/usr/bin/env python3
"""PyTorch's own CUDA memory tests, natively and with cachalot plugged in.

Runs the memory tests of test_cuda.py from a PyTorch source tree's test folder
(the installed torch's version: PyTorch's file stays in the user's checkout)
under each configuration, each in processes of its own: `native` (PyTorch's
allocator), `pytorch` and `cachalot` (cachalot_torch.use() with that policy,
installed by pttests_plugin.py before the test file touches CUDA). A process
that dies records the test it was running as a crash and the run goes on with
the tests left. Prints a table of every test with its result per configuration
(pass, fail, skip, xfail, crash, hang) and writes it as JSON and markdown.

Usage: pytorch_tests.py TEST_DIR [--configs native,pytorch,cachalot]
       [--only REGEX] [--budget SECONDS] [--reuse JSON] [--json FILE] [--markdown FILE]
       [--gpus N]

--gpus N runs the configurations side by side, each on one of N GPUs of its
own (CUDA_VISIBLE_DEVICES) with an extension build folder of its own; tests
that need two GPUs then skip, as on a one-GPU machine.

--reuse takes the results of the configurations not run now from an earlier
run's JSON (the same machine and torch: native's results do not change with
cachalot's code).

The tests: TestCuda's memory, out-of-memory, fraction, stream, pinned,
caching-allocator and CUDA graph tests (by name), and every test of
TestCudaMallocAsync, TestBlockStateAbsorption, TestMemPool,
TestFXMemoryProfiler and TestCachingHostAllocatorCudaGraph. A test run as a
child process by the test itself runs on PyTorch's allocator there.
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHOLE_CLASSES = (
    "TestCudaMallocAsync",
    "TestBlockStateAbsorption",
    "TestMemPool",
    "TestFXMemoryProfiler",
    "TestCachingHostAllocatorCudaGraph",
)
TESTCUDA_NAMES = re.compile(r"memory|oom|fraction|stream|pinned|alloc|cach|graph|cublas_multiple")
CONFIGS = {"native": None, "pytorch": "policy:pytorch", "cachalot": "policy:cachalot"}
PASSING = ("pass", "xfail")


def selected(nodeid):
    """Whether a collected test (`test_cuda.py::Class::test`) is a memory test."""
    parts = nodeid.split("::")
    if len(parts) != 3:
        return False
    cls, name = parts[1], parts[2]
    return cls in WHOLE_CLASSES or (cls == "TestCuda" and bool(TESTCUDA_NAMES.search(name)))


def pytest_command(python, extra):
    return [python, "-m", "pytest", "-p", "pttests_plugin", "-p", "no:cacheprovider", "-q", "--tb=short", *extra]


def environment(conf, log, extra=None):
    env = dict(os.environ)
    env.update(extra or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PTTESTS_CACHALOT", None)
    env.pop("CACHALOT_ALLOC_CONF", None)
    if conf is not None:
        env["PTTESTS_CACHALOT"] = "1"
        env["CACHALOT_ALLOC_CONF"] = conf
    if log is not None:
        env["PTTESTS_LOG"] = str(log)
    return env


def collect(python, test_dir):
    """Every test id of test_cuda.py, as pytest names them."""
    out = subprocess.run(
        pytest_command(python, ["--collect-only", "test_cuda.py"]),
        cwd=test_dir, env=environment(None, None), capture_output=True, text=True, check=False,
    )
    ids = [line.strip() for line in out.stdout.splitlines() if line.startswith("test_cuda.py::")]
    if not ids:
        sys.exit(f"pytorch_tests.py: no tests collected from {test_dir}/test_cuda.py:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return ids


def read_log(log):
    started, ended = [], {}
    if log.exists():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if record["event"] == "start":
                started.append(record["test"])
            else:
                ended[record["test"]] = {"outcome": record["outcome"], "message": record["message"]}
    return started, ended


def crash_text(output):
    """What a dead process said last: from Python's fatal error report on, if any."""
    at = output.rfind("Fatal Python error")
    return output[at:at + 1200] if at >= 0 else output[-800:]


def drop_build_locks(python, extra):
    """Removes the lock files a killed process left in torch's extension build
    folders (tests build extensions with load_inline): the next process would
    wait on them for ever. Nothing else builds there meanwhile."""
    root = extra.get("TORCH_EXTENSIONS_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR") or subprocess.run(
        [python, "-c", "from torch.utils import cpp_extension; print(cpp_extension.get_default_build_root())"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()
    for pattern in ("*/lock", "*/*/lock") if root else ():
        for lock in Path(root).glob(pattern):
            lock.unlink(missing_ok=True)


def run_once(python, test_dir, conf, tests, seconds, logs, extra):
    """One pytest process over `tests`; the results it got to, and the exit code."""
    log = Path(tempfile.mkstemp(prefix="pttests-", suffix=".jsonl", dir=logs)[1])
    cmd = pytest_command(python, [*tests])
    try:
        proc = subprocess.run(cmd, cwd=test_dir, env=environment(conf, log, extra), capture_output=True,
                              text=True, timeout=max(seconds, 1), check=False)
        code, tail = proc.returncode, crash_text(proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired as e:
        code, tail = "timeout", crash_text(str(e.stdout or ""))
        drop_build_locks(python, extra)
    started, ended = read_log(log)
    for test in started:
        if test not in ended:
            why = "hang: the run passed its time budget" if code == "timeout" else f"process died (exit {code})"
            ended[test] = {"outcome": "hang" if code == "timeout" else "crash", "message": f"{why}\n{tail}"}
            break
    return ended, code


def run_config(python, test_dir, name, conf, tests, budget, logs, extra=None):
    """Every test under one configuration, restarting after a crash."""
    results, left, deadline = {}, list(tests), time.monotonic() + budget
    while left:
        seconds = deadline - time.monotonic()
        if seconds <= 0:
            break
        got, code = run_once(python, test_dir, conf, left, seconds, logs, extra or {})
        results.update(got)
        progressed = any(t in got for t in left)
        left = [t for t in left if t not in results]
        print(f"  {name}: {len(results)}/{len(tests)} done (exit {code})", flush=True)
        if not progressed or code == "timeout":
            break
    for test in left:
        results[test] = {"outcome": "not run", "message": "the configuration's time budget ran out"}
    return results


def summary(table, configs):
    counts = {c: {} for c in configs}
    for row in table.values():
        for c in configs:
            outcome = row[c]["outcome"]
            counts[c][outcome] = counts[c].get(outcome, 0) + 1
    regressions = {
        c: sorted(t for t, row in table.items() if row["native"]["outcome"] in PASSING and row[c]["outcome"] not in PASSING)
        for c in configs if c != "native" and "native" in configs
    }
    return counts, regressions


def short(nodeid):
    return nodeid.split("::", 1)[1].replace("::", ".")


def markdown(table, configs, counts, regressions):
    lines = ["| test | " + " | ".join(configs) + " |", "|---|" + "---|" * len(configs)]
    for test, row in sorted(table.items(), key=lambda kv: short(kv[0])):
        lines.append(f"| {short(test)} | " + " | ".join(row[c]["outcome"] for c in configs) + " |")
    lines.append("")
    for c in configs:
        figures = ", ".join(f"{n} {o}" for o, n in sorted(counts[c].items()))
        lines.append(f"- {c}: {figures}")
    for c, tests in regressions.items():
        names = ", ".join(short(t) for t in tests) or "none"
        lines.append(f"- passing natively, not under {c} ({len(tests)}): {names}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test_dir", type=Path, help="a PyTorch source tree's test folder (holding test_cuda.py)")
    ap.add_argument("--configs", default="native,pytorch,cachalot")
    ap.add_argument("--only", help="a regex: run only the selected tests whose id it matches")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds per configuration")
    ap.add_argument("--reuse", type=Path, help="an earlier run's JSON: its results for configurations not run now")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--gpus", type=int, default=1, help="run configurations side by side, one GPU each")
    args = ap.parse_args()
    run = [c for c in args.configs.split(",") if c]
    earlier = json.loads(args.reuse.read_text())["tests"] if args.reuse else {}
    reused = sorted({c for row in earlier.values() for c in row} - set(run), key=list(CONFIGS).index)
    configs = [c for c in CONFIGS if c in run or c in reused]
    unknown = [c for c in run if c not in CONFIGS]
    if unknown:
        sys.exit(f"pytorch_tests.py: unknown configuration {unknown}; known: {', '.join(CONFIGS)}")
    test_dir = args.test_dir.resolve()
    tests = [t for t in collect(args.python, test_dir) if selected(t)]
    if args.only:
        tests = [t for t in tests if re.search(args.only, t)]
    print(f"{len(tests)} tests of {test_dir / 'test_cuda.py'}, configurations: {', '.join(configs)}", flush=True)
    missing = {"outcome": "not run", "message": "not in the reused results"}
    table = {t: {c: earlier.get(t, {}).get(c, missing) for c in reused} for t in tests}
    with tempfile.TemporaryDirectory(prefix="pttests-") as logs:
        def one(slot, name):
            extra = {}
            if args.gpus > 1:
                extra = {"CUDA_VISIBLE_DEVICES": str(slot % args.gpus),
                         "TORCH_EXTENSIONS_DIR": str(Path(logs) / f"extensions-{name}")}
            started = time.monotonic()
            results = run_config(args.python, test_dir, name, CONFIGS[name], tests, args.budget, logs, extra)
            print(f"  {name}: {time.monotonic() - started:.0f} s", flush=True)
            return name, results

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.gpus, 1)) as pool:
            for name, results in pool.map(one, range(len(run)), run):
                for test in tests:
                    table[test][name] = results[test]
    counts, regressions = summary(table, configs)
    text = markdown(table, configs, counts, regressions)
    print(text)
    for test, row in sorted(table.items()):
        for c in configs:
            if row[c]["outcome"] not in PASSING + ("skip",):
                print(f"--- {short(test)} [{c}] {row[c]['outcome']}: {row[c]['message']}")
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"test_file": str(test_dir / "test_cuda.py"), "configs": configs,
                                         "counts": counts, "regressions": regressions, "tests": table}, indent=1))
    return 1 if any(regressions.values()) or any(
        row[c]["outcome"] in ("crash", "hang") for row in table.values() for c in configs) else 0


if __name__ == "__main__":
    sys.exit(main())
