/* A small Kubernetes API client for tdist-agent (JobSet's in-place restart protocol: jip.h):
 * the in-cluster configuration, GET and WATCH of one JobSet, a merge-PATCH of one annotation of
 * the agent's own pod. HTTPS on libcurl with the service account's CA and bearer token; JSON read
 * with libyaml (JSON is YAML's flow style), bounded before it is parsed.
 *
 * In-cluster configuration (what client-go's rest.InClusterConfig reads):
 *   API URL    https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, or TDIST_KUBE_API_URL
 *   directory  /var/run/secrets/kubernetes.io/serviceaccount, or TDIST_KUBE_SA_DIR:
 *              token, ca.crt, namespace (the pod's and its JobSet's)
 * The token is read again before each request (the kubelet rotates projected tokens).
 *
 * Every call blocks for at most its timeout; none is thread-safe on one agent_kube_t except
 * where said (the watcher thread owns its own handle). Every error names the URL or field, the
 * value, and what to do (401/403: the RBAC the pod's service account needs). */
#ifndef TDIST_AGENT_KUBE_H
#define TDIST_AGENT_KUBE_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

/* JobSet's names (sigs.k8s.io/jobset api/jobset/v1alpha2/jobset_types.go). */
#define AGENT_KUBE_ATTEMPT_KEY "jobset.sigs.k8s.io/in-place-restart-attempt"
#define AGENT_KUBE_DISABLE_KEY "jobset.sigs.k8s.io/disable-in-place-restart"
#define AGENT_KUBE_IN_PLACE "InPlaceRestart"
#define AGENT_KUBE_JOBSET_API "/apis/jobset.x-k8s.io/v1alpha2"

/* Largest JSON document (an object, a watch event) read from the server. A JobSet object is a
 * few KiB to a few hundred; more is refused, not parsed. */
#define AGENT_KUBE_MAX_JSON (4u << 20)

/* Where the configuration comes from; all copied. */
typedef struct {
  char api_url[512]; /* no trailing slash */
  char sa_dir[512];  /* token, ca.crt, namespace */
  char namespace_[254];
  char jobset[254]; /* JOBSET_NAME */
  char pod[254];    /* POD_NAME */
} agent_kube_cfg_t;

/* What the protocol reads of a JobSet. */
typedef struct {
  int disabled;              /* the annotation jobset.sigs.k8s.io/disable-in-place-restart is set */
  char restart_strategy[32]; /* spec.failurePolicy.restartStrategy; "" when unset */
  int has_current, has_previous; /* status.{current,previous}InPlaceRestartAttempt present */
  int64_t current, previous;
  char resource_version[64]; /* metadata.resourceVersion */
} agent_kube_jobset_t;

/* 1 when the protocol does not apply: disabled, or restartStrategy != InPlaceRestart. */
int agent_kube_jobset_bypass(const agent_kube_jobset_t *js);

/* Reads the environment (KUBERNETES_SERVICE_HOST/PORT or TDIST_KUBE_API_URL; TDIST_KUBE_SA_DIR;
 * JOBSET_NAME; POD_NAME) and the namespace file. 0, or -1 with err naming what is missing and
 * what to set. */
int agent_kube_cfg_load(agent_kube_cfg_t *cfg, char *err, size_t cap);

/* Parses a JobSet object (JSON). 0, or -1 with err naming the field and value (bad JSON, not an
 * object, a status attempt that is not a non-negative integer). Pure; bounded by len. */
int agent_kube_parse_jobset(const char *json, size_t len, agent_kube_jobset_t *out, char *err,
                            size_t cap);

/* A watch event line: {"type": T, "object": {...}}. *type is one of ADDED MODIFIED DELETED
 * BOOKMARK ERROR (copied); for ERROR, *code is the Status's code (410: the resourceVersion is
 * too old, list again); else *js is the object. 0, or -1 with err. Pure. */
int agent_kube_parse_event(const char *json, size_t len, char *type, size_t type_cap,
                           agent_kube_jobset_t *js, int *code, char *err, size_t cap);

/* The message of a Kubernetes Status answer ({"kind":"Status","message":...}) into out (cap
 * bytes). 0, or -1 (not a Status with a message that fits: out ""). Pure. */
int agent_kube_parse_status_message(const char *json, size_t len, char *out, size_t cap);

/* Results of the calls below: 0 = OK, else one of these (err says more). */
enum {
  AGENT_KUBE_ERR = -1,      /* transport, TLS, bad answer */
  AGENT_KUBE_DENIED = -2,   /* 401 or 403: RBAC or token */
  AGENT_KUBE_NOTFOUND = -3, /* 404 */
  AGENT_KUBE_GONE = -4,     /* the watch's resourceVersion expired (410): GET again */
  AGENT_KUBE_STOPPED = -5   /* *stop became nonzero */
};

/* GET the JobSet cfg->jobset. Up to timeout_s. */
int agent_kube_get_jobset(const agent_kube_cfg_t *cfg, double timeout_s, agent_kube_jobset_t *out,
                          char *err, size_t cap);

/* Sets the annotation jobset.sigs.k8s.io/in-place-restart-attempt of pod cfg->pod to attempt, by
 * a JSON merge patch (RFC 7386: only that key changes; JobSet's reference agent uses server-side
 * apply, which needs a field owner and gains nothing for one key we alone write). */
int agent_kube_patch_attempt(const agent_kube_cfg_t *cfg, int64_t attempt, double timeout_s,
                             char *err, size_t cap);

/* WATCHes the JobSet from resource_version (updated to the last one seen; fieldSelector
 * metadata.name, timeoutSeconds watch_s: the server ends the watch then and the caller reconnects),
 * calling on_object for each ADDED/MODIFIED object, under an overall deadline of watch_s + 30 s.
 * Returns when the server ends the stream (0), on an error, GONE, or STOPPED (polled at least once
 * a second). The callback runs on the calling thread. */
int agent_kube_watch_jobset(const agent_kube_cfg_t *cfg, char resource_version[64], int watch_s,
                            void (*on_object)(void *ctx, const agent_kube_jobset_t *js), void *ctx,
                            atomic_int *stop, char *err, size_t cap);

#endif
