"""test_page.py: the chat page of `spectree serve` (GET /, tools/serve/page.html compiled in):
how it is served, then the page itself in Debian's headless chromium (page_test.mjs through
playwright-core, both installed by scripts/deps.sh): a message typed and sent, the streamed answer
equal to the API's for the same seeded request, the statistics, Stop, New chat, a screenshot, the
API key field.
Usage: test_page.py BUILD_DIR SOURCE_DIR"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Fail, Server, check, curl, run_tests  # noqa: E402

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
# a fixed chain of 4 drafts: the auto tree finds that speculation does not pay on stories260K,
# and the page's tau and histogram need speculative steps
EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path",
         os.path.join(SRC, "models", "eagle-stories260K"), "--speculative-eagle-topk", "1",
         "--speculative-num-steps", "4", "--speculative-num-draft-tokens", "5"]
SHOT = os.path.join(BUILD, "chat-page.png")


def page_bytes():
    with open(os.path.join(SRC, "tools", "serve", "page.html"), "rb") as f:
        return f.read()


def test_served():
    """GET / and /index.html answer the page byte for byte as text/html; HEAD too; other methods
    405; the API routes as before; the page needs no key when /v1/ does."""
    want = page_bytes().decode("utf-8")
    with Server(BUILD, MODEL, api_key="k3y") as s:
        for path in ("/", "/index.html", "/?seed=1"):
            code, text = curl(s.url + path)
            check(code == 200 and text == want, "GET %s: %d, %d bytes" % (path, code, len(text)))
        r = subprocess.run(["curl", "-sS", "-I", "--max-time", "30", s.url + "/"],
                           capture_output=True, timeout=40)
        head = r.stdout.decode().lower()
        check(" 200" in head.split("\n")[0], "HEAD /: " + head[:80])
        check("content-type: text/html; charset=utf-8" in head, "HEAD /: " + head)
        check("content-length: %d" % len(want.encode()) in head, "HEAD /: " + head)
        code, _ = curl(s.url + "/", body={}, method="POST")
        check(code == 405, "POST /: %d" % code)
        code, _ = curl(s.url + "/v1/models")
        check(code == 401, "/v1/models without the key: %d" % code)
        code, _ = curl(s.url + "/v1/models", key="k3y")
        check(code == 200, "/v1/models with the key: %d" % code)
        code, _ = curl(s.url + "/index.htm")
        check(code == 404, "GET /index.htm: %d" % code)


def test_self_contained():
    """No external resource: no URL with a scheme or a protocol-relative one, no src= or
    stylesheet link, nothing fetched but the server's own paths."""
    text = page_bytes().decode("utf-8")
    check(not re.search(r"https?:|//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I), "an absolute URL")
    check(not re.search(r"<(script|img|iframe)[^>]*\bsrc=", text, re.I),
          "an external script or image")
    links = re.findall(r"<link\b[^>]*>", text, re.I)
    check(links == ['<link rel="icon" href="data:,">'], "links: %r" % links)
    for path in re.findall(r"fetch\(\"([^\"]+)\"", text):
        check(path.startswith("/v1/"), "fetch of " + path)


def test_browser():
    chromium = shutil.which("chromium")
    if not chromium:
        raise Fail("Debian's chromium is not installed: run scripts/deps.sh")
    node_dir = os.path.join(SRC, "tests", "serve")
    if not os.path.isdir(os.path.join(node_dir, "node_modules", "playwright-core")):
        raise Fail("playwright-core is not installed in tests/serve/node_modules: run "
                   "scripts/deps.sh")
    if os.path.exists(SHOT):
        os.unlink(SHOT)
    with Server(BUILD, MODEL, *EAGLE) as s, Server(BUILD, MODEL, api_key="k3y",
                                                   name="keyed") as ks:
        env = dict(os.environ, SPECTREE_URL=s.url, SPECTREE_CHROMIUM=chromium,
                   SPECTREE_SHOT=SHOT, SPECTREE_KEY_URL=ks.url, SPECTREE_KEY="k3y")
        try:
            r = subprocess.run(["node", os.path.join(node_dir, "page_test.mjs")], env=env,
                               capture_output=True, timeout=200)
        except subprocess.TimeoutExpired:
            raise Fail("page_test.mjs did not finish in 200 s")
        out = (r.stdout + r.stderr).decode("utf-8", "replace")
        sys.stdout.write(out)
        check(r.returncode == 0, "page_test.mjs failed (exit %d)" % r.returncode)
        check(s.proc.poll() is None, "the server died: " + s.log_text())
        code, _ = curl(s.url + "/health")
        check(code == 200, "/health after the page: %d" % code)
    with open(SHOT, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", SHOT + ": not a PNG")


if __name__ == "__main__":
    run_tests([("served", test_served), ("self-contained", test_self_contained),
               ("browser", test_browser)])
