#!/usr/bin/env bash
# The one prepared command a lent GPU machine runs (issue #57; benchmarks/README.md), from the repository root:
# install fxremat without its dependencies (torch and transformers are there; no network), run gpu_check.py (every
# model and configuration, recorded), and pack what it wrote with its log into one file under $OUT (the device tool
# returns at most 8 files).  Extra arguments go to gpu_check.py.  Unpacked here:
#   tar xzf gpu_check.tar.gz -C /tmp/gpu && cp -r /tmp/gpu/gpu_recordings benchmarks/results/ \
#     && cp -r /tmp/gpu/gpu_check benchmarks/results/
set -uo pipefail
out="${OUT:-$(mktemp -d)}"
work="$(mktemp -d)"
python -m pip install --quiet --no-deps --no-build-isolation . || exit 1
python benchmarks/gpu_check.py --out "$work/gpu_check" --record "$work/gpu_recordings" "$@" 2>&1 | tee "$work/gpu_check.log"
status=${PIPESTATUS[0]}
nvidia-smi >"$work/nvidia-smi.txt" 2>&1 || true
tar czf "$out/gpu_check.tar.gz" -C "$work" .
echo "packed: $out/gpu_check.tar.gz ($(du -h "$out/gpu_check.tar.gz" | cut -f1)), gpu_check.py exit $status"
exit "$status"
