"""Run every client example of README.md (its Clients section) and clients/README.md as
the READMEs say to.

    python scripts/check_readme_snippets.py        (run by clients/run-tests.sh)

Each ```python, ```js and ```go block there is a complete program. It is
written to a fresh folder outside the repository and run the way the README tells a user
to, against a real `reflex stdio` (the `reflex` on PATH, its default model):
  python  the file run by this interpreter, in a folder outside the checkout, so
          reflex_client must be installed (pip install ./clients/python; `make test`
          installs it)
  js      `npm pack clients/node`, the tarball installed with `npm install` into a new
          project (the tarball must not ship the tests), then `node example.mjs`
  go      a new module (`go mod init example`) with the client required through the
          `replace` directive the README gives, then `go run .`
Every example prints a generation and ends with the system1 pick on its own line, so
the last line of its output must be that pick ("Paris", or the sky's colour "blue").
"""
import os
import re
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (file, section): the client examples are those of README's "## Clients" section and of
# all of clients/README.md (README's other sections have examples of other things, e.g.
# the OpenAI client against `reflex http`)
READMES = [(os.path.join(ROOT, "README.md"), "## Clients"),
           (os.path.join(ROOT, "clients", "README.md"), None)]
GO_MODULE = "reflex-ipc/clients/go"
TIMEOUT = 300


def snippets():
    """{(lang, code): [where, ...]} for every python/js/go block of the READMEs."""
    found = {}
    for path, section in READMES:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lo, hi = 0, len(text)
        if section:
            lo = text.index("\n" + section + "\n")
            nxt = text.find("\n## ", lo + 1)
            hi = nxt if nxt >= 0 else hi
        for m in re.finditer(r"^```(python|js|go)\n(.*?)^```", text[lo:hi], re.S | re.M):
            line = text.count("\n", 0, lo + m.start()) + 1
            found.setdefault((m.group(1), m.group(2)), []).append(
                f"{os.path.relpath(path, ROOT)}:{line}")
    return found


def run(cmd, cwd, env=None):
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout


def run_python(code, tmp):
    with open(os.path.join(tmp, "example.py"), "w") as f:
        f.write(code)
    return run([sys.executable, "example.py"], cwd=tmp)


def run_js(code, tmp):
    run(["npm", "pack", "--silent", "--pack-destination", tmp, os.path.join(ROOT, "clients", "node")],
        cwd=tmp)
    tgz = [f for f in os.listdir(tmp) if f.endswith(".tgz")]
    assert len(tgz) == 1, tgz
    with tarfile.open(os.path.join(tmp, tgz[0])) as t:
        shipped = sorted(n for n in t.getnames())
    if any("/test" in n for n in shipped):
        raise RuntimeError(f"npm pack ships the tests: {shipped}")
    app = os.path.join(tmp, "app")
    os.mkdir(app)
    with open(os.path.join(app, "package.json"), "w") as f:
        f.write('{"name": "example", "private": true}\n')
    run(["npm", "install", "--silent", "--no-audit", "--no-fund", os.path.join(tmp, tgz[0])],
        cwd=app)
    with open(os.path.join(app, "example.mjs"), "w") as f:
        f.write(code)
    return run(["node", "example.mjs"], cwd=app)


def run_go(code, tmp):
    env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off", GOWORK="off")
    run(["go", "mod", "init", "example"], cwd=tmp, env=env)
    run(["go", "mod", "edit", f"-require={GO_MODULE}@v0.0.0",
         f"-replace={GO_MODULE}={os.path.join(ROOT, 'clients', 'go')}"], cwd=tmp, env=env)
    with open(os.path.join(tmp, "main.go"), "w") as f:
        f.write(code)
    return run(["go", "run", "."], cwd=tmp, env=env)


RUNNERS = {"python": run_python, "js": run_js, "go": run_go}


def main():
    found = snippets()
    langs = {lang for lang, _ in found}
    if langs != set(RUNNERS):
        print(f"snippets: expected python, js and go examples, found {sorted(langs)}")
        return 1
    failed = 0
    for (lang, code), where in sorted(found.items()):
        with tempfile.TemporaryDirectory(prefix=f"reflex-snippet-{lang}-") as tmp:
            try:
                out = RUNNERS[lang](code, tmp)
                last = out.strip().splitlines()[-1].strip() if out.strip() else ""
                # each example ends with a system1 pick: a city, or the sky's colour
                if last not in ("Paris", "blue") or len(out.strip().splitlines()) < 3:
                    raise RuntimeError(f"unexpected output:\n{out}")
                print(f"ok      {lang:6} {', '.join(where)}")
            except Exception as e:  # report every snippet, then fail
                failed += 1
                if "No module named 'reflex_client'" in str(e):
                    e = f"{e}\n(the Python client is not installed: pip install -e clients/python)"
                print(f"FAILED  {lang:6} {', '.join(where)}: {e}")
    print(f"{len(found) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
