#!/usr/bin/env bash
# The one prepared command a lent GPU machine runs (issue #57; benchmarks/README.md), from the repository root:
# fxremat from this checkout (torch and transformers are on the machine; no network), gpu_check.py (every model and
# configuration, recorded), and what it wrote packed with its log into one file under $OUT (the device tool returns
# at most 8 files).  Extra arguments go to gpu_check.py.  Unpacked here:
#   tar xzf gpu_check.tar.gz -C /tmp/gpu && cp -r /tmp/gpu/gpu_recordings benchmarks/results/ \
#     && cp -r /tmp/gpu/gpu_check benchmarks/results/
set -uo pipefail
out="${OUT:-$(mktemp -d)}"
work="$(mktemp -d)"
# fxremat from this checkout without installing (pip's build needs `wheel`, which a bare machine may lack):
# fxremat_passes is the folder passes/, put on the path under its package name through a link
mkdir -p "$work/path"
ln -sfn "$PWD/passes" "$work/path/fxremat_passes"
export PYTHONPATH="$work/path:$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -c "import fxremat, fxremat_passes, torch; print('fxremat', fxremat.__file__, '| torch', torch.__version__)" || exit 1
python benchmarks/gpu_check.py --out "$work/gpu_check" --record "$work/gpu_recordings" "$@" 2>&1 | tee "$work/gpu_check.log"
status=${PIPESTATUS[0]}
nvidia-smi >"$work/nvidia-smi.txt" 2>&1 || true
rm -f "$work/path/fxremat_passes"
tar czf "$out/gpu_check.tar.gz" -C "$work" .
echo "packed: $out/gpu_check.tar.gz ($(du -h "$out/gpu_check.tar.gz" | cut -f1)), gpu_check.py exit $status"
exit "$status"
