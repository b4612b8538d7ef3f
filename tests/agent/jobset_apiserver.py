"""A stand-in Kubernetes API server for JobSet's in-place restart protocol, over real HTTPS.

It serves one JobSet (GET, and WATCH as the API server streams it: one JSON event a line) and the
PATCHes of its pods' annotations, checks the bearer token, and after each PATCH runs JobSet's
controller rule over the pods' annotations, in our words (sigs.k8s.io/jobset
pkg/controllers/in_place_restart.go, reconcileInPlaceRestart, lines 38-99 at main 08dfbdf):
  - the attempts of the pods not Failed that carry the annotation, each a non-negative integer
    (getPodInPlaceRestartAttempts, :133-159);
  - every pod of the JobSet has one and all are equal: status.currentInPlaceRestartAttempt = it
    (:79-85, updateCurrentInPlaceRestartAttempt :201-214), which lifts the agents' barriers;
  - else none, or the highest is 0: nothing (:87-91);
  - else status.previousInPlaceRestartAttempt = highest - 1, never lowered (:93-96,
    updatePreviousInPlaceRestartAttempt :216-237), which makes the agents below restart in place.
The pod count is the sum over replicatedJobs of replicas * parallelism, which must equal
completions (getTotalNumberOfPods, :173-185). The max-restarts checks (:49-70) fail the JobSet:
here they set status "failed" for the test to read.

Faults for the tests: mode "deny" (403 to every request), "badjson" (a JobSet GET answers text
that is not JSON), "hang" (requests are read and never answered until the server stops); a wrong
token gets 401. hold = True keeps the barrier up (current is not set) until released.
watch_faults: a list the next watches take one each from: "gone" (an ERROR event, Status code
410: the resourceVersion is too old), "badevent" (a line that is not JSON).

The CA and the server's certificate (SAN IP 127.0.0.1) are made with openssl at start.
Used by jobset_inplace_test.py. Python 3 standard library only (and openssl on PATH).
"""
import json
import os
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

ATTEMPT_KEY = "jobset.sigs.k8s.io/in-place-restart-attempt"


_CERTS = {}


def make_certs(d):
    """A CA and a server certificate for 127.0.0.1 under d: (ca.crt, server.crt, server.key).
    Made once per process (RSA key generation is the slow part) and reused by later servers."""
    if "certs" in _CERTS:
        return _CERTS["certs"]
    ca_key, ca_crt = os.path.join(d, "ca.key"), os.path.join(d, "ca.crt")
    key, csr, crt = (os.path.join(d, n) for n in ("server.key", "server.csr", "server.crt"))
    ext = os.path.join(d, "san.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out",
        ca_crt, "-days", "2", "-subj", "/CN=tdist-test-ca")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj",
        "/CN=127.0.0.1")
    run("openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key,
        "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", ext)
    _CERTS["certs"] = (ca_crt, crt, key)
    return ca_crt, crt, key


class ApiServer:
    """One JobSet `name` of `pods` pods in `namespace`. Attributes the tests read or set:
    patches (list of (pod, content_type, body dict)), requests (list of (method, path)), mode,
    hold, token, jobset (the object)."""

    def __init__(self, d, namespace, name, pods, strategy="InPlaceRestart", max_restarts=5,
                 annotations=None):
        os.makedirs(d, exist_ok=True)
        self.ca, crt, key = make_certs(d)
        self.token = "t0ken-" + os.urandom(8).hex()
        self.namespace, self.name = namespace, name
        self.cv = threading.Condition()
        self.rv = 1
        self.mode = ""
        self.hold = False
        self.stopping = False
        self.patches, self.requests = [], []
        self.watch_faults = []
        self.pods = {p: {"annotations": {}, "phase": "Running"} for p in pods}
        self.failed = None
        fp = {"maxRestarts": max_restarts}
        if strategy:
            fp["restartStrategy"] = strategy
        n = len(pods)
        self.jobset = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1",
                         "annotations": dict(annotations or {})},
            "spec": {"failurePolicy": fp, "replicatedJobs": [
                {"name": "workers", "replicas": 1,
                 "template": {"spec": {"parallelism": n, "completions": n}}}]},
            "status": {"restarts": 0, "restartsCountTowardsMax": 0}}
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # a watch's body ends when the connection closes

            def log_message(self, *a):
                pass

            def do_GET(self):
                srv._serve(self, "GET")

            def do_PATCH(self):
                srv._serve(self, "PATCH")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(crt, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.url = "https://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        with self.cv:
            self.stopping = True
            self.cv.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def sa_dir(self, d, token=None):
        """A service account directory for an agent (token, ca.crt, namespace) under d."""
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "token"), "w") as f:
            f.write((token or self.token) + "\n")
        with open(os.path.join(d, "namespace"), "w") as f:
            f.write(self.namespace)
        with open(self.ca) as s, open(os.path.join(d, "ca.crt"), "w") as f:
            f.write(s.read())
        return d

    # --- the JobSet controller's side -------------------------------------------------------

    def status(self):
        with self.cv:
            return dict(self.jobset["status"])

    def _bump(self):
        self.rv += 1
        self.jobset["metadata"]["resourceVersion"] = str(self.rv)
        self.cv.notify_all()

    def replace_pod(self, pod):
        """The pod is deleted and created again (podReplacementPolicy Failed): no annotation."""
        with self.cv:
            self.pods[pod] = {"annotations": {}, "phase": "Running"}
            self._reconcile()

    def release(self):
        with self.cv:
            self.hold = False
            self._reconcile()

    def _total_pods(self):
        total = 0
        for rj in self.jobset["spec"]["replicatedJobs"]:
            s = rj["template"]["spec"]
            assert s["parallelism"] == s["completions"], "in_place_restart.go:178"
            total += rj["replicas"] * s["parallelism"]
        return total

    def _reconcile(self):
        """reconcileInPlaceRestart over the pods' annotations (under cv)."""
        st = self.jobset["status"]
        fp = self.jobset["spec"]["failurePolicy"]
        if fp.get("restartStrategy") != "InPlaceRestart":
            return  # isInPlaceRestartStrategy (:33-35)
        attempts = []
        for p in self.pods.values():  # getPodInPlaceRestartAttempts (:133-159)
            if p["phase"] == "Failed" or ATTEMPT_KEY not in p["annotations"]:
                continue
            v = p["annotations"][ATTEMPT_KEY]
            if not v.isdigit():
                self.failed = "invalid value for annotation %s: %r" % (ATTEMPT_KEY, v)
                return
            attempts.append(int(v))
        uncounted = st["restarts"] - st["restartsCountTowardsMax"]  # exceededMaxRestarts (:162-171)
        if attempts and max(attempts) - uncounted > fp["maxRestarts"]:
            self.failed = "ReachedMaxRestarts"
            return
        if len(attempts) == self._total_pods() and len(set(attempts)) == 1:  # :82-85
            if not self.hold and st.get("currentInPlaceRestartAttempt") != attempts[0]:
                st["currentInPlaceRestartAttempt"] = attempts[0]
                self._bump()
            return
        if not attempts or max(attempts) == 0:  # :89-91
            return
        prev = max(attempts) - 1  # updatePreviousInPlaceRestartAttempt (:216-237)
        old = st.get("previousInPlaceRestartAttempt")
        if old is None or prev > old:
            st["previousInPlaceRestartAttempt"] = prev
            self._bump()

    # --- HTTP ----------------------------------------------------------------------------------

    def _reply(self, h, code, obj, raw=None):
        body = raw if raw is not None else json.dumps(obj, separators=(",", ":")).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _status(self, h, code, reason, msg):
        self._reply(h, code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "message": msg, "reason": reason, "code": code})

    def _serve(self, h, method):
        u = urlparse(h.path)
        with self.cv:
            self.requests.append((method, u.path))
            mode = self.mode
        if mode == "hang":
            with self.cv:
                while not self.stopping:
                    self.cv.wait(1)
            return
        if h.headers.get("Authorization") != "Bearer " + self.token:
            return self._status(h, 401, "Unauthorized", "Unauthorized")
        if mode == "deny":
            return self._status(h, 403, "Forbidden",
                                'jobsets.jobset.x-k8s.io "%s" is forbidden: User '
                                '"system:serviceaccount:%s:default" cannot get resource "jobsets"'
                                % (self.name, self.namespace))
        js_base = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/%s/jobsets" % self.namespace
        pod_base = "/api/v1/namespaces/%s/pods/" % self.namespace
        if method == "GET" and u.path == js_base + "/" + self.name:
            if mode == "badjson":
                return self._reply(h, 200, None, raw=b'{"metadata": {"name": [1, 2,')
            with self.cv:
                return self._reply(h, 200, self.jobset)
        if method == "GET" and u.path == js_base and parse_qs(u.query).get("watch") == ["1"]:
            return self._watch(h, parse_qs(u.query))
        if method == "PATCH" and u.path.startswith(pod_base):
            return self._patch(h, u.path[len(pod_base):])
        return self._status(h, 404, "NotFound", "the server could not find %s" % u.path)

    def _patch(self, h, pod):
        body = h.rfile.read(int(h.headers.get("Content-Length", "0")))
        ctype = h.headers.get("Content-Type", "")
        try:
            patch = json.loads(body)
        except ValueError:
            return self._status(h, 400, "BadRequest", "the patch is not JSON")
        with self.cv:
            self.patches.append((pod, ctype, patch))
            if pod not in self.pods:
                return self._status(h, 404, "NotFound", 'pods "%s" not found' % pod)
            if ctype != "application/merge-patch+json":
                return self._status(h, 415, "UnsupportedMediaType", ctype)
            ann = (patch.get("metadata") or {}).get("annotations") or {}
            self.pods[pod]["annotations"].update(ann)
            self._reconcile()
            obj = {"metadata": {"name": pod, "annotations": self.pods[pod]["annotations"]}}
        return self._reply(h, 200, obj)

    def _watch(self, h, q):
        want = "metadata.name=%s" % self.name
        if q.get("fieldSelector") != [want]:
            return self._status(h, 400, "BadRequest", "fieldSelector must be " + want)
        try:
            since = int(q.get("resourceVersion", ["0"])[0] or 0)
            timeout = min(int(q.get("timeoutSeconds", ["60"])[0]), 600)
        except ValueError:
            return self._status(h, 400, "BadRequest", "bad resourceVersion or timeoutSeconds")
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Connection", "close")
        h.end_headers()
        with self.cv:
            fault = self.watch_faults.pop(0) if self.watch_faults else None
        if fault == "gone":
            h.wfile.write(json.dumps({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                "message": "too old resource version", "code": 410}}).encode() + b"\n")
            return
        if fault == "badevent":
            h.wfile.write(b'{"type": "MODIFIED", "object": {"metadata": \n')
            return
        h.wfile.flush()
        import time
        end = time.monotonic() + timeout
        try:
            while True:
                with self.cv:
                    while self.rv <= since and not self.stopping and time.monotonic() < end:
                        self.cv.wait(0.5)
                    if self.stopping or self.rv <= since:
                        return
                    since = self.rv
                    line = json.dumps({"type": "MODIFIED", "object": self.jobset},
                                      separators=(",", ":")) + "\n"
                h.wfile.write(line.encode())
                h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            return
