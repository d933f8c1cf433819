#!/usr/bin/env python3
"""test_chat.py: `spectree chat` driven through a pseudo-terminal as a person types:
- two turns, the first on two lines ('\\' at a line's end): each answer is what `spectree
  generate` prints for the conversation rendered with ChatML (stories260K has no template:
  ChatML is the default, with a warning);
- /stats (tokens/s, tau, speculative steps of the last turn; the KV cache kept across turns:
  only the new turn's own tokens are prefilled), /regen (the same greedy answer),
  /clear (a new conversation answers as the first did), an unknown command;
- Ctrl-C mid-answer stops it and returns to the prompt; Ctrl-D leaves with status 0; Ctrl-C at
  the prompt leaves too;
- a seeded conversation (sampling at temperature 0.8, NGRAM speculating): both answers equal the
  server's /v1/chat/completions answers for the same messages, seed and sampling;
- bad flags: one line naming the flag, exit 2.
Usage: test_chat.py BUILD_DIR SOURCE_DIR"""
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "serve"))
from serve_util import Fail, Server, check, curl, generate, run_tests  # noqa: E402
import json  # noqa: E402

BUILD, SRC = sys.argv[1:3]
MODEL = os.path.join(SRC, "models", "stories260K.gguf")
SPECTREE = os.path.join(BUILD, "spectree")


def chatml(msgs):
    return "".join("<|im_start|>%s\n%s<|im_end|>\n" % m for m in msgs) + \
        "<|im_start|>assistant\n"


class Chat:
    """`spectree chat ARGS` on a pseudo-terminal; out: what the terminal showed (echo included,
    "\\r\\n" as "\\n")."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(SPECTREE, [SPECTREE, "chat", "-m", MODEL] + list(args))
        self.out = ""
        self.status = None

    def read_until(self, pattern, seconds=60, start=0):
        deadline = time.time() + seconds
        while time.time() < deadline:
            m = re.compile(pattern, re.S).search(self.out, start)
            if m:
                return m
            r, _, _ = select.select([self.fd], [], [], 0.1)
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    data = b""
                if not data:
                    break
                self.out += data.decode("utf-8", "replace").replace("\r\n", "\n")
        raise Fail("no %r in %d s; the terminal showed:\n%s" % (pattern, seconds,
                                                                 self.out[-3000:]))

    def type(self, text):
        """Types text (one line at a time, as a person would) and returns where its echo ends."""
        start = len(self.out)
        for line in text.splitlines(keepends=True):
            os.write(self.fd, line.encode())
            time.sleep(0.05)
        return start

    def turn(self, text):
        """Types a message and returns the answer printed before the next prompt."""
        start = self.type(text)
        echo = text.splitlines()[-1]
        m = self.read_until(re.escape(echo) + r"\n(.*?)\n> ", start=start)
        return m.group(1)

    def wait(self, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = st
                return os.waitstatus_to_exitcode(st)
            try:
                r, _, _ = select.select([self.fd], [], [], 0.1)
                if r:
                    self.out += os.read(self.fd, 65536).decode("utf-8", "replace")
            except OSError:
                time.sleep(0.1)
        os.kill(self.pid, signal.SIGKILL)
        raise Fail("chat did not exit in %d s:\n%s" % (seconds, self.out[-3000:]))


def test_turns_and_commands():
    c = Chat("--temp", "0", "-n", "30", "--system", "Be kind", "--speculative-algorithm",
             "NGRAM")
    c.read_until(r"> ")
    check("warning: %s has no chat template" % MODEL in c.out and "using ChatML" in c.out,
          "no warning about the default template:\n" + c.out)
    a1 = c.turn("Hello\\\nthere\n")
    msgs = [("system", "Be kind"), ("user", "Hello\nthere")]
    want = generate(BUILD, MODEL, chatml(msgs), 30)
    check(a1 == want, "turn 1: %r != generate %r" % (a1, want))
    a2 = c.turn("Tell me more\n")
    msgs += [("assistant", a1), ("user", "Tell me more")]
    want = generate(BUILD, MODEL, chatml(msgs), 30)
    check(a2 == want, "turn 2: %r != generate %r" % (a2, want))
    stats = c.turn("/stats\n")
    m = re.search(r"^last turn: prompt (\d+) tokens \((\d+) prefilled, the rest kept from the "
                  r"last turn\), first token after [0-9.]+ ms; 30 tokens at [0-9.]+ tok/s, "
                  r"stopped: length; NGRAM: \d+ speculative steps \(\+\d+ plain\), tau "
                  r"[0-9.]+$", stats)
    check(m, "/stats: %r" % stats)
    # the KV cache kept across turns: the new turn is prefilled, not the conversation: the
    # tokens of the turn's own text (the end of the answer, the user's message, the assistant's
    # header), plus the answer's last token, sampled but not yet evaluated
    check(int(m.group(2)) < int(m.group(1)) // 2, "/stats: the whole conversation prefilled: %r"
          % stats)
    own = subprocess.run([SPECTREE, "tokenize", "-m", MODEL,
                          "<|im_end|>\n<|im_start|>user\nTell me more<|im_end|>\n"
                          "<|im_start|>assistant\n"], capture_output=True, text=True, timeout=60)
    n_own = len(own.stdout.split())
    check(own.returncode == 0 and 0 < int(m.group(2)) <= n_own + 2,
          "/stats: %s tokens prefilled for a turn of %d: %r" % (m.group(2), n_own, stats))
    check(c.turn("/regen\n") == a2, "/regen gave another greedy answer")
    check(c.turn("/clear\n") == "(a new conversation)", "/clear")
    want = generate(BUILD, MODEL, chatml([("system", "Be kind"), ("user", "Hello")]), 30)
    check(c.turn("Hello\n") == want, "after /clear: not a new conversation")
    check("unknown command /frob" in c.turn("/frob\n"), "an unknown command")
    os.write(c.fd, b"\x04")  # Ctrl-D at the prompt
    rc = c.wait()
    check(rc == 0, "exit status %d after Ctrl-D" % rc)


def test_seeded_like_server():
    sampling = ["--temp", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"]
    c = Chat(*sampling, "--seed", "7", "-n", "24", "--system", "Be kind",
             "--speculative-algorithm", "NGRAM")
    c.read_until(r"> ")
    a1 = c.turn("Tell me a story\n")
    a2 = c.turn("And then?\n")
    os.write(c.fd, b"\x04")
    check(c.wait() == 0, "chat did not leave on Ctrl-D")
    with Server(BUILD, MODEL, "--speculative-algorithm", "NGRAM") as srv:
        msgs = [{"role": "system", "content": "Be kind"},
                {"role": "user", "content": "Tell me a story"}]
        for turn, answer in ((1, a1), (2, a2)):
            code, body = curl(srv.url + "/v1/chat/completions",
                              {"messages": msgs, "max_tokens": 24, "seed": 7, "temperature": 0.8,
                               "top_k": 40, "top_p": 0.95, "min_p": 0.05})
            check(code == 200, "server: %d %s" % (code, body))
            want = json.loads(body)["choices"][0]["message"]["content"]
            check(answer == want, "turn %d: chat %r != server %r" % (turn, answer, want))
            msgs += [{"role": "assistant", "content": want},
                     {"role": "user", "content": "And then?"}]


def test_ctrl_c():
    # an answer that would run for minutes (greedy stories260K finds no end of text)
    c = Chat("--temp", "0", "-n", "-1", "-c", "30000")
    c.read_until(r"> ")
    start = c.type("Tell me a long story\n")
    c.read_until(r"Tell me a long story\n.{200}", start=start)
    os.write(c.fd, b"\x03")  # Ctrl-C mid-answer: back to the prompt
    c.read_until(r"\n> ", seconds=30, start=start)
    stats = c.turn("/stats\n")
    m = re.search(r"prompt \d+ tokens \(.*\), first token after [0-9.]+ ms; (\d+) tokens at "
                  r"[0-9.]+ tok/s, stopped: stop", stats)
    check(m and 50 < int(m.group(1)) < 29000, "/stats after Ctrl-C: %r" % stats)
    os.write(c.fd, b"\x03")  # Ctrl-C at the prompt: leave
    rc = c.wait()
    check(rc == 0, "exit status %d after Ctrl-C at the prompt" % rc)


def test_bad_flags():
    for args, want in [(["-m", MODEL, "--chat-template", "vicuna"], "--chat-template expects"),
                       (["-m", MODEL, "-n", "x"], "-n expects"),
                       (["-m", MODEL, "-ngl", "x"], "--n-gpu-layers expects"),
                       (["-m", MODEL, "-xyz"], "unknown option '-xyz'"),
                       (["--system", "x"], "-m MODEL is required")]:
        r = subprocess.run([SPECTREE, "chat"] + args, capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        err = r.stderr.decode()
        check(r.returncode == 2 and want in err and err.count("\n") == 1,
              "%s: %d %r" % (args, r.returncode, err))
    r = subprocess.run([SPECTREE, "chat", "--help"], capture_output=True, timeout=60)
    check(r.returncode == 0 and b"/regen" in r.stdout, "chat --help")
    # input from a pipe: each line a turn, the end of input leaves
    r = subprocess.run([SPECTREE, "chat", "-m", MODEL, "--temp", "0", "-n", "8", "-sys", "Hi"],
                       input=b"Hello\n/stats\n", capture_output=True, timeout=60)
    check(r.returncode == 0 and b"last turn: prompt" in r.stdout, r.stdout.decode())


def main():
    run_tests([("two turns and the commands", test_turns_and_commands),
               ("a seeded conversation equals the server's", test_seeded_like_server),
               ("Ctrl-C", test_ctrl_c), ("bad flags", test_bad_flags)])
    print("all chat tests passed")


if __name__ == "__main__":
    main()
