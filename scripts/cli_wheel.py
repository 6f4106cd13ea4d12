#!/usr/bin/env python3
"""Packs the cachalot command into a wheel, cachalot-cli, that pip installs
into an environment's bin/ (the binary itself, no Python in between).

Usage: cli_wheel.py BINARY OUTDIR   (the version is the binary's own, from --version)

The wheel is tagged for this platform (linux_x86_64); scripts/build-wheels.sh
repairs it to a manylinux tag."""

import base64
import hashlib
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

SUMMARY = "cachalot, the command: replay, compare, summarize, view and tune PyTorch memory snapshots"


def metadata(version):
    return (f"Metadata-Version: 2.1\nName: cachalot-cli\nVersion: {version}\nSummary: {SUMMARY}\n"
            "License: MIT OR Apache-2.0\nRequires-Python: >=3.9\n"
            "Description-Content-Type: text/markdown\n\n"
            "`cachalot replay|compare|summary|view|tune SNAPSHOT`: what a recorded PyTorch workload "
            "needs under each allocator setting, on any machine (no GPU, no Rust). "
            "`cachalot --help` lists every command.\n")


def wheel_file(tag):
    return f"Wheel-Version: 1.0\nGenerator: cachalot cli_wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def main():
    binary, outdir = Path(sys.argv[1]), Path(sys.argv[2])
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    tag = f"py3-none-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"
    name = f"cachalot_cli-{version}"
    files = {
        f"{name}.data/scripts/cachalot": (binary.read_bytes(), 0o755),
        f"{name}.dist-info/METADATA": (metadata(version).encode(), 0o644),
        f"{name}.dist-info/WHEEL": (wheel_file(tag).encode(), 0o644),
    }
    record = f"{name}.dist-info/RECORD"
    lines = "".join(record_line(path, data) for path, (data, _) in files.items()) + f"{record},,\n"
    files[record] = (lines.encode(), 0o644)
    outdir.mkdir(parents=True, exist_ok=True)
    wheel = outdir / f"{name}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path, (data, mode) in files.items():
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    print(wheel)


if __name__ == "__main__":
    main()
