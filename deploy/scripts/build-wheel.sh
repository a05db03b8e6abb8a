#!/usr/bin/env bash
# Build stage of deploy/Dockerfile and deploy/Dockerfile.cpu (and of CI: tests/test_deploy.py).
# Builds the reflex-ipc wheel into OUT_DIR. With nvcc on PATH (the CUDA devel stage) setup.py
# compiles the kernels into the wheel's fatbin; REQUIRE_FATBIN=1 fails the build when it did
# not. WITH_PYCUDA=1 also builds a pycuda wheel there (pycuda ships as an sdist, and the
# runtime stage has no compiler to build it).
#   deploy/scripts/build-wheel.sh OUT_DIR
set -euo pipefail
out=${1:?usage: build-wheel.sh OUT_DIR}
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
mkdir -p "$out"
"$PY" -m pip wheel --no-deps --disable-pip-version-check -q -w "$out" .
wheel=$(ls -t "$out"/reflex_ipc-*.whl | head -1)
names=$("$PY" -m zipfile -l "$wheel")
if grep -q 'reflex_ipc/kernels/reflex_kernels.fatbin' <<<"$names"; then
    echo "build-wheel: $wheel (with the CUDA kernels' fatbin)"
elif [ "${REQUIRE_FATBIN:-0}" = 1 ]; then
    echo "build-wheel: $wheel has no fatbin (nvcc missing?) and REQUIRE_FATBIN=1" >&2
    exit 1
else
    echo "build-wheel: $wheel (no fatbin: CPU only)"
fi
grep -q 'reflex_client/_async.py' <<<"$names" || {
    echo "build-wheel: $wheel lacks reflex_client (reflex http needs it)" >&2; exit 1; }
if [ "${WITH_PYCUDA:-0}" = 1 ]; then
    "$PY" -m pip wheel --disable-pip-version-check -q -w "$out" "pycuda>=2024.1"
fi
