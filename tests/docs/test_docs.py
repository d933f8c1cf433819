#!/usr/bin/env python3
"""test_docs.py: the commands of README.md, docs/*.md and the folders' READMEs, as printed.

1. Every shell block whose fence is marked `sh runnable` (README.md and docs/*.md) runs with
   bash -e in a scratch folder that holds the repository's models/, tests/, tools/, train/,
   scripts/, docs/ and the build as build/ (links), so that what it writes stays there; it must
   exit 0 within its time limit.
2. Every command line of every shell block (```sh, ```bash, ```console), and every command quoted
   in the prose (`build/spectree ...`, `python3 train/...`, `bash scripts/...`), is checked against the
   programs it names: build/spectree (its subcommand), build/spectree-bench (its benchmark),
   build/spectree-mkmodel, python3 SCRIPT and bash SCRIPT must exist, and every --long-option
   on the line must appear in that program's --help; every path into the repository
   (models/..., tools/..., train/..., tests/..., scripts/..., src/..., docs/..., include/...,
   dev/...) must exist. Placeholders in capitals (MODEL.gguf, HEAD_DIR) are not paths.

usage: test_docs.py BUILD_DIR SOURCE_DIR
"""
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

BUILD, SRC = (os.path.abspath(a) for a in sys.argv[1:3])
PY = sys.executable
passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
        print("ok   " + what)
    else:
        failed += 1
        print("FAIL " + what)


def blocks(path):
    """(info string, first line number, text) of each fenced block of a markdown file."""
    out, cur, info, start = [], None, "", 0
    for i, line in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
        m = re.match(r"^\s*```(.*)$", line)
        if m and cur is None:
            cur, info, start = [], m.group(1).strip(), i + 1
        elif m:
            out.append((info, start, "\n".join(cur)))
            cur = None
        elif cur is not None:
            cur.append(line)
    return out


def command_lines(text):
    """The block's commands, continuation lines joined, comments dropped."""
    joined, out = "", []
    for line in text.split("\n"):
        line = re.sub(r"(^|\s)#.*$", "", line) if not line.strip().startswith("-d") else line
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        joined += line
        if joined.strip():
            out.append(joined.strip())
        joined = ""
    return out


help_cache = {}


def help_text(argv):
    key = tuple(argv)
    if key not in help_cache:
        try:
            r = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=60,
                               cwd=SRC)
            help_cache[key] = (r.returncode, r.stdout + r.stderr)
        except (OSError, subprocess.TimeoutExpired) as e:
            help_cache[key] = (-1, str(e))
    return help_cache[key]


REPO_DIRS = ("models/", "tools/", "train/", "tests/", "scripts/", "src/", "docs/", "include/",
             "dev/")
WRAPPERS = {"taskset": 2, "nice": 2, "time": 0, "env": 0, "sudo": 0, "exec": 0}


def check_paths(where, toks):
    for t in toks:
        t = t.split("=", 1)[1] if t.startswith("--") and "=" in t else t
        t = t.rstrip(",;:)")
        if not t.startswith(REPO_DIRS) or re.search(r"[A-Z]{2,}|[*$<>{}|]|\.\.\.", t):
            continue
        check(os.path.exists(os.path.join(SRC, t)), "%s: path %s exists" % (where, t))


def check_command(where, line):
    for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
        try:
            toks = shlex.split(part)
        except ValueError:
            toks = part.split()
        while toks and re.match(r"^[A-Z_][A-Z0-9_]*=", toks[0]):
            toks = toks[1:]
        while toks and toks[0] in WRAPPERS:
            n = WRAPPERS[toks[0]]
            toks = toks[1:]
            while n and toks and toks[0].startswith("-"):
                toks = toks[2:] if n == 2 and len(toks) > 1 and not toks[0].startswith("--") else \
                    toks[1:]
                n = 0
        if not toks:
            continue
        prog = toks[0]
        flags = [t.split("=", 1)[0] for t in toks[1:] if re.match(r"^--[a-z0-9][a-z0-9-]*(=\S*)?$", t)]
        if prog.startswith("build/spectree"):
            exe = os.path.join(BUILD, os.path.basename(prog))
            if not check(os.path.exists(exe), "%s: %s is built" % (where, prog)) and \
                    not os.path.exists(exe):
                continue
            argv = [exe]
            if os.path.basename(prog) in ("spectree", "spectree-bench") and len(toks) > 1 and \
                    not toks[1].startswith("-"):
                argv.append(toks[1])
        elif prog in ("python3", "bash") and len(toks) > 1 and toks[1].startswith(REPO_DIRS):
            script = os.path.join(SRC, toks[1])
            check(os.path.exists(script), "%s: %s exists" % (where, toks[1]))
            argv = [PY if prog == "python3" else "bash", script] if prog == "python3" else None
        else:
            check_paths(where, toks)
            continue
        if argv and flags:
            rc, text = help_text(argv)
            for f in flags:
                check(re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", text) is not None,
                      "%s: %s takes %s" % (where, " ".join(os.path.basename(a) for a in argv), f))
        check_paths(where, toks[1:])


def run_block(where, text):
    with tempfile.TemporaryDirectory(prefix="st_docs_") as d:
        for name in ("models", "tests", "tools", "train", "scripts", "docs", "include", "dev"):
            os.symlink(os.path.join(SRC, name), os.path.join(d, name))
        os.symlink(BUILD, os.path.join(d, "build"))
        env = dict(os.environ, PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
        try:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=d, env=env,
                               capture_output=True, text=True, timeout=300)
            ok = r.returncode == 0
            detail = "" if ok else ": exit %d, stderr tail: %s" % (r.returncode, r.stderr[-600:])
        except subprocess.TimeoutExpired:
            ok, detail = False, ": timed out"
        check(ok, "%s: runs as printed%s" % (where, detail))


def main():
    docs = [os.path.join(SRC, "README.md")] + sorted(
        glob.glob(os.path.join(SRC, "docs", "*.md")) +
        glob.glob(os.path.join(SRC, "tools", "*", "README.md")) +
        glob.glob(os.path.join(SRC, "models", "*", "README.md")) +
        glob.glob(os.path.join(SRC, "tests", "data", "**", "README.md"), recursive=True))
    n_run = 0
    for path in docs:
        rel = os.path.relpath(path, SRC)
        for info, line, text in blocks(path):
            lang = info.split()[0] if info else ""
            if lang not in ("sh", "bash", "console", "shell"):
                continue
            where = "%s:%d" % (rel, line)
            if "runnable" in info.split()[1:]:
                n_run += 1
                run_block(where, text)
            for cmd in command_lines(text):
                check_command(where, cmd)
        # commands quoted in the prose: `build/spectree ...`, `python3 train/...`, `bash scripts/...`
        prose = re.sub(r"```.*?```", "", open(path, encoding="utf-8").read(), flags=re.S)
        for m in re.finditer(r"`((?:build/spectree|python3 [a-z]|bash [a-z])[^`]*)`", prose, re.S):
            line = prose[:m.start()].count("\n") + 1
            check_command("%s:%d (prose)" % (rel, line), " ".join(m.group(1).split()))
    check(n_run >= 3, "README and docs mark %d blocks runnable (at least 3)" % n_run)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
