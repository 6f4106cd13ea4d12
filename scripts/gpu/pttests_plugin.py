"""pytest plugin of pytorch_tests.py (loaded with `-p pttests_plugin`).

With PTTESTS_CACHALOT set, it makes cachalot PyTorch's CUDA allocator as
pytest starts, before the test file is imported (PyTorch's test_cuda.py
touches CUDA at import). With PTTESTS_LOG set, it appends one JSON line when a
test starts and one when it ends, so that a process that dies loses only the
test it was running: the runner records that one as a crash and carries on.

The test file may come from a PyTorch newer than the one installed: a name it
imports that this torch's test helpers lack is given the meaning it has there
(TEST_CUDAMALLOCASYNC, which later PyTorch moved into common_utils)."""

import json
import os

if os.environ.get("PTTESTS_CACHALOT"):
    import cachalot_torch

    cachalot_torch.use()


def _newer_test_helpers():
    import torch
    from torch.testing._internal import common_utils

    if not hasattr(common_utils, "TEST_CUDAMALLOCASYNC"):
        backend = torch.cuda.get_allocator_backend() if torch.cuda.is_available() else ""
        common_utils.TEST_CUDAMALLOCASYNC = backend == "cudaMallocAsync"


_newer_test_helpers()

_LOG = os.environ.get("PTTESTS_LOG")
_phases = {}


def _write(record):
    if not _LOG:
        return
    with open(_LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message[:400]
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])[:400]
    return str(report.longrepr or "")[-400:]


def _outcome(phases):
    """One outcome from the reports of setup, call and teardown."""
    for report in phases:
        if report.failed:
            return "fail", _message(report)
    for report in phases:
        if hasattr(report, "wasxfail"):
            return ("xfail" if report.skipped else "fail"), report.wasxfail
        if report.skipped:
            return "skip", _message(report)
    return "pass", ""


def pytest_runtest_logstart(nodeid, location):
    _phases[nodeid] = []
    _write({"event": "start", "test": nodeid})


def pytest_runtest_logreport(report):
    _phases.setdefault(report.nodeid, []).append(report)
    if report.when == "teardown":
        outcome, message = _outcome(_phases.pop(report.nodeid))
        _write({"event": "end", "test": report.nodeid, "outcome": outcome, "message": message})
