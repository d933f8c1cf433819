"""serve_util.py: shared helpers of the `spectree serve` tests: start a server on a free
loopback port, talk to it with curl, read /metrics, run `spectree generate` for the expected
text. Python 3 standard library only (Debian's python3)."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


class Server:
    """A `spectree serve` process on a port the kernel chose (--port 0)."""

    def __init__(self, build, model, *args, api_key=None, name=None, log=None):
        self.build, self.model, self.api_key = build, model, api_key
        cmd = [os.path.join(build, "spectree"), "serve", "-m", model, "--port", "0"]
        if api_key:
            cmd += ["--api-key", api_key]
        if name:
            cmd += ["--served-model-name", name]
        cmd += list(args)
        self.log_path = log or "/tmp/spectree-serve-%d-%d.log" % (os.getpid(), time.time_ns())
        self.log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            self.log.seek(0)
            m = re.search(rb"on http://127\.0\.0\.1:(\d+) ", self.log.read())
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise Fail("the server exited at start: " + self.log_text())
            time.sleep(0.05)
        check(self.port, "the server did not start in 60 s: " + self.log_text())
        self.url = "http://127.0.0.1:%d" % self.port

    def log_text(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def rss_kb(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends sig and waits; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise Fail("the server did not exit %d s after signal %d" % (timeout, sig))
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.log.closed:
            self.log.close()
            os.unlink(self.log_path)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Nginx:
    """nginx in the foreground with tools/serve/nginx.conf as shipped, its replicas' server lines
    (in every upstream) replaced by the given ports and its listen port by a free one."""

    SHIPPED = ("        server 127.0.0.1:8080 max_fails=1 fail_timeout=30s;\n"
               "        server 127.0.0.1:8081 max_fails=1 fail_timeout=30s;\n")

    def __init__(self, src, ports):
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        check(os.path.exists(nginx), "nginx is not installed (scripts/deps.sh: nginx-light)")
        self.dir = tempfile.mkdtemp(prefix="spectree-nginx-")
        self.port = free_port()
        with open(os.path.join(src, "tools", "serve", "nginx.conf")) as f:
            conf = f.read()
        servers = "".join("        server 127.0.0.1:%d max_fails=1 fail_timeout=30s;\n" % p
                          for p in ports)
        check(conf.count(self.SHIPPED) == 2 and "listen 127.0.0.1:8000;" in conf,
              "tools/serve/nginx.conf layout changed")
        conf = conf.replace(self.SHIPPED, servers)
        conf = conf.replace("listen 127.0.0.1:8000;", "listen 127.0.0.1:%d;" % self.port)
        d = self.dir
        top = ("daemon off;\nmaster_process off;\nworker_processes 1;\npid %s/nginx.pid;\n"
               "error_log %s/error.log warn;\nevents { worker_connections 1024; }\n" % (d, d))
        paths = "".join("    %s_temp_path %s/%s;\n" % (k, d, k)
                        for k in ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"])
        conf = top + conf.replace("http {\n", "http {\n    access_log off;\n" + paths, 1)
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(conf)
        self.proc = subprocess.Popen([nginx, "-p", d, "-c", os.path.join(d, "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise Fail("nginx exited: " + self.proc.stderr.read().decode())
                time.sleep(0.05)
        raise Fail("nginx did not start")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def curl(url, body=None, key=None, method=None, headers=(), raw=None, timeout=120):
    """One request through curl: (status, body text)."""
    cmd = ["curl", "-sS", "-N", "--max-time", str(timeout), "-o", "-", "-w", "\n%{http_code}"]
    if method:
        cmd += ["-X", method]
    if key:
        cmd += ["-H", "Authorization: Bearer " + key]
    for h in headers:
        cmd += ["-H", h]
    data = None
    if body is not None or raw is not None:
        data = raw if raw is not None else json.dumps(body).encode()
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    cmd.append(url)
    r = subprocess.run(cmd, input=data, capture_output=True, timeout=timeout + 10)
    out = r.stdout.decode("utf-8", "replace")
    text, _, code = out.rpartition("\n")
    check(code.isdigit(), "curl %s: no status (%s)" % (url, r.stderr.decode()))
    return int(code), text


class Conn:
    """One raw HTTP/1.1 connection from a chosen loopback source address: send bytes, read
    whole responses (interim 1xx answers skipped, chunked bodies decoded)."""

    def __init__(self, port, source="127.0.0.1", timeout=30):
        self.sock = socket.socket()
        self.sock.settimeout(timeout)
        self.sock.bind((source, 0))
        self.sock.connect(("127.0.0.1", port))
        self.buf = b""

    def send(self, data):
        self.sock.sendall(data)

    def _more(self):
        b = self.sock.recv(65536)
        if not b:
            raise EOFError("the server closed the connection")
        self.buf += b

    def _line(self):
        while b"\r\n" not in self.buf:
            self._more()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n):
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self):
        """(status, headers with lower-case names, body bytes) of the next final response."""
        while True:
            status = int(self._line().split(b" ")[1])
            headers = {}
            while True:
                line = self._line()
                if not line:
                    break
                k, _, v = line.partition(b":")
                headers[k.strip().lower().decode()] = v.strip().decode()
            if status >= 200:
                break
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                n = int(self._line().split(b";")[0], 16)
                body += self._take(n)
                self._line()
                if n == 0:
                    break
        else:
            body = self._take(int(headers.get("content-length", "0")))
        return status, headers, body

    def closed(self, seconds):
        """True when the server closes (or resets) the connection within seconds."""
        self.sock.settimeout(seconds)
        try:
            while True:
                self._more()
        except EOFError:
            return True
        except socket.timeout:
            return False
        except OSError:
            return True

    def close(self):
        self.sock.close()


def http_request(method, path, body=None, key=None, version="1.1", extra=b""):
    """The bytes of one request (Host given, a JSON body with its Content-Length)."""
    head = ("%s %s HTTP/%s\r\nHost: 127.0.0.1\r\n" % (method, path, version)).encode()
    if key:
        head += b"Authorization: Bearer " + key.encode() + b"\r\n"
    data = b""
    if body is not None:
        data = json.dumps(body).encode()
        head += (b"Content-Type: application/json\r\nContent-Length: " +
                 str(len(data)).encode() + b"\r\n")
    return head + extra + b"\r\n" + data


def sse_events(text):
    """The data payloads of a server-sent event stream."""
    ev = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    check(ev and ev[-1] == "[DONE]", "the stream does not end with [DONE]: %r" % text[-200:])
    return [json.loads(e) for e in ev[:-1]]


def metrics(url):
    code, text = curl(url + "/metrics")
    check(code == 200, "/metrics: %d" % code)
    out = {}
    for line in text.split("\n"):
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def generate(build, model, prompt, n, temp=0.0, seed=None, top_k=0, top_p=1.0, min_p=0.0,
             stops=(), extra=()):
    """What `spectree generate` prints for these parameters (the continuation); extra: more
    flags."""
    cmd = [os.path.join(build, "spectree"), "generate", "-m", model, "-p", prompt, "-n", str(n),
           "--temp", str(temp), "--top-k", str(top_k), "--top-p", str(top_p), "--min-p",
           str(min_p), "--seed", str(seed if seed is not None else 0)] + list(extra)
    for s in stops:
        cmd += ["--stop", s]
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    check(r.returncode == 0, "generate failed: " + r.stderr.decode())
    out = r.stdout.decode("utf-8")
    check(out.endswith("\n"), "generate output without its final newline")
    return out[:-1]


def run_tests(tests):
    """Runs (name, fn) pairs; prints each result; exits 1 on the first failure."""
    for name, fn in tests:
        t0 = time.time()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (a test's failure of any kind is reported)
            print("FAIL %s: %s: %s" % (name, type(e).__name__, e), flush=True)
            sys.exit(1)
        print("ok   %s (%.1f s)" % (name, time.time() - t0), flush=True)


def gguf_with_template(src, dst, template):
    """Copies GGUF file src to dst with tokenizer.chat_template set to template (a new key)."""
    import struct
    with open(src, "rb") as f:
        b = f.read()
    check(b[:4] == b"GGUF", src + ": not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", b, 4)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    pos = 24
    align = 32

    def skip_str(p):
        (n,) = struct.unpack_from("<Q", b, p)
        return p + 8 + n

    def skip_val(p, t):
        if t in sizes:
            return p + sizes[t]
        if t == 8:
            return skip_str(p)
        check(t == 9, "GGUF value type %d" % t)
        et, n = struct.unpack_from("<IQ", b, p)
        p += 12
        for _ in range(n):
            p = skip_val(p, et)
        return p

    for _ in range(n_kv):
        k0 = pos
        pos = skip_str(pos)
        key = b[k0 + 8:pos]
        (t,) = struct.unpack_from("<I", b, pos)
        if key == b"general.alignment":
            (align,) = struct.unpack_from("<I", b, pos + 4)
        check(key != b"tokenizer.chat_template", src + " has a chat template already")
        pos = skip_val(pos + 4, t)
    kv_end = pos
    for _ in range(n_tensors):
        pos = skip_str(pos)
        (nd,) = struct.unpack_from("<I", b, pos)
        pos += 4 + 8 * nd + 4 + 8
    info_end = pos
    data = (info_end + align - 1) // align * align
    key, val = b"tokenizer.chat_template", template.encode()
    new_kv = (struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) +
              struct.pack("<Q", len(val)) + val)
    head = (b[:4] + struct.pack("<IQQ", version, n_tensors, n_kv + 1) + b[24:kv_end] + new_kv +
            b[kv_end:info_end])
    head += b"\0" * ((-len(head)) % align)
    with open(dst, "wb") as f:
        f.write(head + b[data:])
