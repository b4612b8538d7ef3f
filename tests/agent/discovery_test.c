/* Discovery (operator-agent/discovery/discovery.h): node rank precedence and its errors,
 * resolv.conf search lists in several layouts, the master name for every scheme and a custom
 * template (with random values), placeholder and label errors, and agent_resolve against real
 * sockets on 127.0.0.1: a listener, a port that refuses until the deadline, and cancellation.
 * Real DNS (dnsmasq in a network namespace) is in dns_test.sh. No name here needs DNS: only
 * numeric addresses and "localhost" (from /etc/hosts). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "operator-agent/discovery/discovery.h"
#include "tests/testlib/check.h"
#include "tests/testlib/clock.h"
#include "tests/testlib/rng.h"
#include "tests/testlib/skip.h"

#define SA_NAMESPACE_FILE "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

/* A random DNS label of 1..max characters (a-z0-9, inner '-'). */
static void rand_label(char *out, size_t max) {
  size_t n = 1 + rnd_below(max);
  static const char alpha[] = "abcdefghijklmnopqrstuvwxyz0123456789-";
  for (size_t i = 0; i < n; i++) out[i] = alpha[rnd_below(i == 0 || i == n - 1 ? 36 : 37)];
  out[0] = (char)('a' + rnd_below(26)); /* names start with a letter (DNS-1035, as Jobs require) */
  out[n] = 0;
}

static const char *tmpdir(void) {
  const char *t = getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

static char g_rc[600]; /* path of the scratch resolv.conf */
static const char *resolv(const char *content) {
  FILE *f = fopen(g_rc, "w");
  CHECK(f != NULL);
  fputs(content, f);
  CHECK(fclose(f) == 0);
  return g_rc;
}

static void cfg_init(agent_cfg_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->node_rank = -1;
  cfg->scheme = AGENT_SCHEME_INDEXED_JOB;
}

/* ---- node rank ---- */

static void test_node_rank(void) {
  agent_cfg_t cfg;
  char err[512];
  cfg_init(&cfg);
  char *env_none[] = {NULL};
  char *env_jci[] = {"PATH=/bin", "JOB_COMPLETION_INDEX=3", NULL};

  /* The flag wins over everything. */
  cfg.node_rank = 5;
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_jci, "myjob-12", err, sizeof err), 5);
  cfg.node_rank = 0;
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_jci, "myjob-12", err, sizeof err), 0);
  cfg.node_rank = -1;
  /* Then JOB_COMPLETION_INDEX, over the hostname. */
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_jci, "myjob-12", err, sizeof err), 3);
  /* Then the hostname suffix (the short name, so an FQDN works too). */
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, "myjob-12", err, sizeof err), 12);
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, NULL, "my-job-0", err, sizeof err), 0);
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, "myjob-7.myjob.ns.svc.cluster.local", err,
                                        sizeof err),
               7);
  /* A bad JOB_COMPLETION_INDEX is an error that names it, not a fallthrough. */
  const char *bad_jci[] = {"x", "-1", "", "3a", " 3", "+3", "99999999999", "2147483648", "0x10"};
  for (size_t i = 0; i < sizeof bad_jci / sizeof bad_jci[0]; i++) {
    char var[64];
    snprintf(var, sizeof var, "JOB_COMPLETION_INDEX=%s", bad_jci[i]);
    char *env[] = {var, NULL};
    err[0] = 0;
    CHECK_EQ_INT(agent_discover_node_rank(&cfg, env, "myjob-12", err, sizeof err), -1);
    CHECK_HAS(err, "JOB_COMPLETION_INDEX");
    char quoted[64];
    snprintf(quoted, sizeof quoted, "'%s'", bad_jci[i]);
    CHECK_HAS(err, quoted);
    CHECK_HAS(err, "--node-rank");
  }
  /* Hostnames without a numeric suffix: the error names all three sources. */
  const char *bad_host[] = {"myjob-x", "worker", "myjob-", "myjob-1x", "-", "myjob-99999999999"};
  for (size_t i = 0; i < sizeof bad_host / sizeof bad_host[0]; i++) {
    CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, bad_host[i], err, sizeof err), -1);
    CHECK_HAS(err, bad_host[i]);
    CHECK_HAS(err, "--node-rank");
    CHECK_HAS(err, "JOB_COMPLETION_INDEX");
  }
  /* Kubeflow v1: master-0 is node 0, worker-i is node i+1; other schemes take the suffix. */
  cfg.scheme = AGENT_SCHEME_KUBEFLOW;
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, "train-master-0", err, sizeof err), 0);
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, "train-worker-0", err, sizeof err), 1);
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, "train-worker-6", err, sizeof err), 7);
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_jci, "train-worker-6", err, sizeof err), 3);
  cfg.scheme = AGENT_SCHEME_INDEXED_JOB;
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, "train-worker-6", err, sizeof err), 6);
  cfg.scheme = AGENT_SCHEME_JOBSET;
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, "js-node-0-4", err, sizeof err), 4);
  cfg.scheme = AGENT_SCHEME_INDEXED_JOB;

  /* Random ranks through each source. */
  for (int i = 0; i < 300; i++) {
    int r = (int)rnd_below(i < 100 ? 100 : 2000000000);
    char host[80], label[40], var[64];
    rand_label(label, 20);
    snprintf(host, sizeof host, "%s-%d", label, r);
    CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, host, err, sizeof err), r);
    snprintf(var, sizeof var, "JOB_COMPLETION_INDEX=%d", r);
    char *env[] = {"A=1", var, "B=2", NULL};
    CHECK_EQ_INT(agent_discover_node_rank(&cfg, env, "nohost", err, sizeof err), r);
  }
  /* NULL hostname = gethostname(). */
  char self[256] = "";
  CHECK(gethostname(self, sizeof self) == 0);
  int want = agent_discover_node_rank(&cfg, env_none, self, err, sizeof err);
  CHECK_EQ_INT(agent_discover_node_rank(&cfg, env_none, NULL, err, sizeof err), want);
}

/* ---- resolv.conf ---- */

static void expect_rc(const char *content, int rc, const char *ns, const char *domain) {
  char gns[256] = "junk", gdom[256] = "junk";
  CHECK_EQ_INT(agent_resolv_conf_k8s(resolv(content), gns, sizeof gns, gdom, sizeof gdom), rc);
  if (strcmp(gns, ns) != 0 || strcmp(gdom, domain) != 0) {
    fprintf(stderr, "resolv.conf:\n%s\n-> ns '%s' domain '%s', want '%s' '%s'\n", content, gns,
            gdom, ns, domain);
    exit(1);
  }
}

static void test_resolv_conf(void) {
  /* What kubelet writes for a ClusterFirst pod. */
  expect_rc(
      "search ns1.svc.cluster.local svc.cluster.local cluster.local\n"
      "nameserver 10.96.0.10\noptions ndots:5\n",
      0, "ns1", "cluster.local");
  /* A custom cluster domain and host search domains appended by the node. */
  expect_rc(
      "nameserver 10.0.0.10\nsearch team-a.svc.corp.example svc.corp.example corp.example "
      "us-east-1.compute.internal\noptions ndots:5\n",
      0, "team-a", "corp.example");
  /* Not Kubernetes: neither is derivable. */
  expect_rc("search example.com lan\nnameserver 1.1.1.1\n", 0, "", "");
  expect_rc("nameserver 1.1.1.1\noptions edns0\n", 0, "", "");
  expect_rc("", 0, "", "");
  /* Several search lines: the last wins, like glibc; a "domain" line counts as one too. */
  expect_rc(
      "search old.svc.cluster.local svc.cluster.local cluster.local\nnameserver 1.1.1.1\n"
      "search new.svc.c2.local svc.c2.local c2.local\n",
      0, "new", "c2.local");
  expect_rc("search ns1.svc.cluster.local svc.cluster.local cluster.local\ndomain example.com\n", 0,
            "", "");
  expect_rc("domain svc.corp.example\n", 0, "", "corp.example");
  expect_rc("search ns1.svc.cluster.local svc.cluster.local\nsearch \n", 0, "", "");
  expect_rc("search ns1.svc.cluster.local svc.cluster.local\nsearch\n", 0, "ns1", "cluster.local");
  /* Comments, tabs, CRLF, trailing dots, upper case; "searchx" is no keyword (glibc). */
  expect_rc(
      "# search c.svc.cluster.local svc.cluster.local\n; search d.svc.x svc.x\n"
      "search\tNs2.svc.Cluster.Local.  svc.cluster.local.\r\nsearchx a.svc.b svc.b\n",
      0, "ns2", "cluster.local");
  /* Only "<ns>.svc.<domain>": both come from it. Only "svc.<domain>": just the domain. */
  expect_rc("search ns3.svc.k8s.test\n", 0, "ns3", "k8s.test");
  expect_rc("search svc.k8s.test k8s.test\n", 0, "", "k8s.test");
  /* The namespace entry must agree with the svc.<domain> entry; deeper prefixes are no namespace.
   */
  expect_rc("search other.svc.x.test svc.k8s.test a.b.svc.k8s.test ns4.svc.k8s.test\n", 0, "ns4",
            "k8s.test");
  expect_rc("search .svc.k8s.test svc. svc..x\n", 0, "", "");
  /* No file: -1, outputs "". */
  char gns[64] = "junk", gdom[64] = "junk", missing[700];
  snprintf(missing, sizeof missing, "%s/no-such-resolv.conf", tmpdir());
  CHECK_EQ_INT(agent_resolv_conf_k8s(missing, gns, sizeof gns, gdom, sizeof gdom), -1);
  CHECK_STR(gns, "");
  CHECK_STR(gdom, "");
  /* An output that does not fit is left "", never cut. */
  CHECK_EQ_INT(agent_resolv_conf_k8s(resolv("search abcd.svc.cluster.local svc.cluster.local\n"),
                                     gns, 4, gdom, 13),
               0);
  CHECK_STR(gns, "");
  CHECK_STR(gdom, "");
  CHECK_EQ_INT(agent_resolv_conf_k8s(g_rc, gns, 5, gdom, 14), 0);
  CHECK_STR(gns, "abcd");
  CHECK_STR(gdom, "cluster.local");
  /* Random namespaces and domains, with noise around them. */
  for (int i = 0; i < 200; i++) {
    char ns[64], d1[64], d2[64], dom[140], text[1024];
    rand_label(ns, 63);
    rand_label(d1, 20);
    rand_label(d2, 10);
    snprintf(dom, sizeof dom, "%s.%s", d1, d2);
    snprintf(text, sizeof text, "%snameserver 10.0.0.%d\nsearch %s.svc.%s%s svc.%s %s%s\n%s",
             rnd_below(2) ? "# generated\n" : "", (int)rnd_below(255), ns, dom,
             rnd_below(2) ? "." : "", dom, dom, rnd_below(2) ? " node.internal" : "",
             rnd_below(2) ? "options ndots:5\n" : "");
    expect_rc(text, 0, ns, dom);
  }
}

/* ---- master name ---- */

static int sa_file_exists(void) { return access(SA_NAMESPACE_FILE, R_OK) == 0; }

static void expect_name(const agent_cfg_t *cfg, char **envp, const char *host, const char *rc,
                        const char *want) {
  char out[300], err[512] = "";
  int r = agent_master_name(cfg, envp, host, rc, out, sizeof out, err, sizeof err);
  if (r != 0 || strcmp(out, want) != 0) {
    fprintf(stderr, "master name: got %d '%s' (%s), want '%s'\n", r, out, err, want);
    exit(1);
  }
}

static void expect_name_err(const agent_cfg_t *cfg, char **envp, const char *host, const char *rc,
                            const char *sub1, const char *sub2) {
  char out[300] = "junk", err[512] = "";
  int r = agent_master_name(cfg, envp, host, rc, out, sizeof out, err, sizeof err);
  if (r != -1 || out[0] != 0 || strstr(err, sub1) == NULL || (sub2 && strstr(err, sub2) == NULL)) {
    fprintf(stderr, "master name: got %d '%s' err '%s', want an error with '%s' and '%s'\n", r, out,
            err, sub1, sub2 ? sub2 : "");
    exit(1);
  }
}

static void test_master_name(void) {
  agent_cfg_t cfg;
  char *env_none[] = {NULL};
  char *env_ns[] = {"POD_NAMESPACE=envns", NULL};
  const char *k8s = resolv("search rcns.svc.k8s.test svc.k8s.test k8s.test\nnameserver 10.0.0.1\n");
  char k8s_rc[700], plain_rc[700];
  snprintf(k8s_rc, sizeof k8s_rc, "%s", k8s);
  snprintf(plain_rc, sizeof plain_rc, "%s/plain.resolv.conf", tmpdir());
  FILE *f = fopen(plain_rc, "w");
  CHECK(f != NULL);
  fputs("search example.com\nnameserver 1.1.1.1\n", f);
  CHECK(fclose(f) == 0);

  /* Every scheme with everything given. */
  cfg_init(&cfg);
  cfg.job_name = "train";
  cfg.namespace_ = "ns1";
  cfg.cluster_domain = "cluster.local";
  expect_name(&cfg, env_ns, "ignored-3", k8s_rc, "train-0.train.ns1.svc.cluster.local.");
  cfg.service = "svc";
  expect_name(&cfg, env_ns, "ignored-3", k8s_rc, "train-0.svc.ns1.svc.cluster.local.");
  cfg.scheme = AGENT_SCHEME_KUBEFLOW;
  expect_name(&cfg, env_ns, "ignored-3", k8s_rc, "train-master-0.ns1.svc.cluster.local.");
  cfg.scheme = AGENT_SCHEME_JOBSET;
  expect_name(&cfg, env_ns, "x-1", k8s_rc, "train-node-0-0.svc.ns1.svc.cluster.local.");
  cfg.replicated_job = "trainer-node";
  expect_name(&cfg, env_ns, "x-1", k8s_rc, "train-trainer-node-0-0.svc.ns1.svc.cluster.local.");
  cfg.scheme = AGENT_SCHEME_VOLCANO;
  expect_name(&cfg, env_ns, "x-1", k8s_rc, "train-worker-0.train.ns1.svc.cluster.local.");
  cfg.task = "master";
  expect_name(&cfg, env_ns, "x-1", k8s_rc, "train-master-0.train.ns1.svc.cluster.local.");
  /* A custom template, with and without the absolute dot; placeholders may repeat. */
  cfg.master_template = "{job}-leader.{namespace}.{domain}";
  expect_name(&cfg, env_ns, "x-1", k8s_rc, "train-leader.ns1.cluster.local");
  cfg.master_template = "{job}-{task}-{replicated_job}-0.{service}.{job}.";
  expect_name(&cfg, env_ns, "x-1", k8s_rc, "train-master-trainer-node-0.svc.train.");
  /* A template that needs no namespace or domain does not look for them. */
  cfg_init(&cfg);
  cfg.master_template = "{job}-0.{service}";
  expect_name(&cfg, env_none, "train-4", plain_rc, "train-0.train");
  cfg.master_template = "static-host.example.com";
  expect_name(&cfg, env_none, "nosuffix", "/nonexistent/resolv.conf", "static-host.example.com");

  /* The job name from the hostname, per scheme. */
  cfg_init(&cfg);
  cfg.namespace_ = "ns1";
  cfg.cluster_domain = "cluster.local";
  expect_name(&cfg, env_none, "train-3", k8s_rc, "train-0.train.ns1.svc.cluster.local.");
  expect_name(&cfg, env_none, "my-train-12.my-train.ns1.svc.cluster.local", k8s_rc,
              "my-train-0.my-train.ns1.svc.cluster.local.");
  expect_name_err(&cfg, env_none, "worker", k8s_rc,
                  "job name: hostname 'worker' has no -<index> suffix; pass --job-name", NULL);
  expect_name_err(&cfg, env_none, "train-x", k8s_rc, "'train-x'", "--job-name");
  cfg.scheme = AGENT_SCHEME_KUBEFLOW;
  expect_name(&cfg, env_none, "train-worker-2", k8s_rc, "train-master-0.ns1.svc.cluster.local.");
  expect_name(&cfg, env_none, "train-master-0", k8s_rc, "train-master-0.ns1.svc.cluster.local.");
  expect_name_err(&cfg, env_none, "train-3", k8s_rc, "'train-3' does not look like", "kubeflow");
  cfg.scheme = AGENT_SCHEME_JOBSET;
  expect_name(&cfg, env_none, "train-node-0-3", k8s_rc,
              "train-node-0-0.train.ns1.svc.cluster.local.");
  expect_name_err(&cfg, env_none, "train-workers-1-3", k8s_rc, "'node'", "--job-name");
  cfg.replicated_job = "workers";
  expect_name(&cfg, env_none, "train-workers-1-3", k8s_rc,
              "train-workers-0-0.train.ns1.svc.cluster.local.");
  cfg.scheme = AGENT_SCHEME_VOLCANO;
  expect_name(&cfg, env_none, "train-worker-4", k8s_rc,
              "train-worker-0.train.ns1.svc.cluster.local.");
  expect_name(&cfg, env_none, "train-master-0", k8s_rc,
              "train-worker-0.train.ns1.svc.cluster.local.");
  expect_name_err(&cfg, env_none, "train-ps-1", k8s_rc, "<job>-<task>-<index>", "'worker'");

  /* Namespace: flag > POD_NAMESPACE > service-account file > resolv.conf; domain: flag >
   * resolv.conf > cluster.local. */
  cfg_init(&cfg);
  cfg.job_name = "j";
  expect_name(&cfg, env_ns, "h-0", k8s_rc, "j-0.j.envns.svc.k8s.test.");
  cfg.namespace_ = "flagns";
  expect_name(&cfg, env_ns, "h-0", k8s_rc, "j-0.j.flagns.svc.k8s.test.");
  cfg.cluster_domain = "corp.example.";
  expect_name(&cfg, env_ns, "h-0", k8s_rc, "j-0.j.flagns.svc.corp.example.");
  cfg.namespace_ = NULL;
  cfg.cluster_domain = NULL;
  char *env_empty_ns[] = {"POD_NAMESPACE=", NULL};
  if (!sa_file_exists()) {
    expect_name(&cfg, env_none, "h-0", k8s_rc, "j-0.j.rcns.svc.k8s.test.");
    expect_name(&cfg, env_empty_ns, "h-0", k8s_rc, "j-0.j.rcns.svc.k8s.test.");
    /* No namespace anywhere: the error lists the sources and what to do. */
    expect_name_err(&cfg, env_none, "h-0", plain_rc, "namespace: --namespace not given",
                    "POD_NAMESPACE");
    expect_name_err(&cfg, env_none, "h-0", plain_rc, "no '<namespace>.svc.<domain>' search entry",
                    "pass --namespace");
    expect_name_err(&cfg, env_none, "h-0", "/nonexistent/resolv.conf", "could not be read",
                    "/nonexistent/resolv.conf");
  } else {
    TEST_LOG("%s exists: skipping the resolv.conf namespace cases", SA_NAMESPACE_FILE);
  }
  expect_name(&cfg, env_ns, "h-0", plain_rc, "j-0.j.envns.svc.cluster.local.");

  /* Unknown and unclosed placeholders. */
  cfg_init(&cfg);
  cfg.job_name = "j";
  cfg.master_template = "{job}-{foo}.x";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "unknown placeholder '{foo}'", "{replicated_job}");
  cfg.master_template = "{job}-{}.x";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "unknown placeholder '{}'", "--master-template");
  cfg.master_template = "{job";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "not closed", "'{job'");
  cfg.master_template = "{job{namespace}}";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "not closed", NULL);
  cfg.master_template = "{job}_0.x";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "'j_0.x'", "character");
  cfg.master_template = "{job}..x";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "empty label", NULL);

  /* Bad values are named with where they came from. */
  cfg_init(&cfg);
  cfg.job_name = "j";
  cfg.namespace_ = "My_NS";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "namespace 'My_NS' (from --namespace)", "DNS label");
  cfg.namespace_ = NULL;
  char *env_bad_ns[] = {"POD_NAMESPACE=bad.ns", NULL};
  expect_name_err(&cfg, env_bad_ns, "h-0", k8s_rc, "'bad.ns' (from env POD_NAMESPACE)", NULL);
  cfg.job_name = "-train";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "job name '-train' (from --job-name)",
                  "starts or ends with '-'");
  cfg.job_name = "j";
  cfg.service = "Svc";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "service 'Svc' (from --service)", NULL);
  cfg.service = NULL;
  cfg.cluster_domain = "cluster..local";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "cluster domain 'cluster..local'", "empty label");
  cfg.cluster_domain = NULL;
  cfg.scheme = AGENT_SCHEME_JOBSET;
  cfg.replicated_job = "Node";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "replicated job 'Node' (from --replicated-job)",
                  NULL);
  cfg.replicated_job = NULL;
  cfg.scheme = AGENT_SCHEME_VOLCANO;
  cfg.task = "a_b";
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "task 'a_b' (from --task)", NULL);
  cfg.task = NULL;
  char long_label[80];
  memset(long_label, 'a', 64);
  long_label[64] = 0;
  cfg.job_name = long_label;
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "longer than 63 characters", "--job-name");
  /* Values that are fine alone can still make a first label over 63 characters. */
  long_label[60] = 0;
  cfg.scheme = AGENT_SCHEME_KUBEFLOW;
  expect_name_err(&cfg, env_ns, "h-0", k8s_rc, "label longer than 63", NULL);
  /* The output buffer is checked. */
  cfg.job_name = "j";
  char small[8], err[256];
  CHECK_EQ_INT(agent_master_name(&cfg, env_ns, "h-0", k8s_rc, small, sizeof small, err, sizeof err),
               -1);
  CHECK_STR(small, "");

  /* Random values through every scheme, checked against names built here. */
  for (int i = 0; i < 400; i++) {
    char job[64], svc[64], ns[64], d1[32], d2[32], dom[80], rj[64], task[64], host[256];
    char want[512];
    rand_label(job, 20);
    rand_label(svc, 20);
    rand_label(ns, 30);
    rand_label(d1, 12);
    rand_label(d2, 8);
    rand_label(rj, 10);
    rand_label(task, 10);
    snprintf(dom, sizeof dom, "%s.%s", d1, d2);
    cfg_init(&cfg);
    cfg.scheme = (agent_scheme_t)rnd_below(4);
    int from_host = (int)rnd_below(2), from_env = (int)rnd_below(2), from_rc = (int)rnd_below(2);
    if (!from_host) cfg.job_name = job;
    if (rnd_below(2)) cfg.service = svc;
    if (rnd_below(2)) cfg.replicated_job = rj;
    if (rnd_below(2)) cfg.task = task;
    if (!from_rc) cfg.cluster_domain = dom;
    char envns[80];
    snprintf(envns, sizeof envns, "POD_NAMESPACE=%s", ns);
    char *envp[] = {"X=1", envns, NULL};
    if (!from_env)
      cfg.namespace_ = ns;
    else if (sa_file_exists())
      continue;
    char rcbuf[300];
    snprintf(rcbuf, sizeof rcbuf, "search zz.svc.%s svc.%s %s\n", dom, dom, dom);
    const char *rc = resolv(rcbuf);
    const char *rjv = cfg.replicated_job ? rj : "node", *taskv = cfg.task ? task : "worker";
    const char *svcv = cfg.service ? svc : job;
    switch (cfg.scheme) {
      case AGENT_SCHEME_INDEXED_JOB:
        snprintf(host, sizeof host, "%s-%d", job, (int)rnd_below(1000));
        snprintf(want, sizeof want, "%s-0.%s.%s.svc.%s.", job, svcv, ns, dom);
        break;
      case AGENT_SCHEME_KUBEFLOW:
        snprintf(host, sizeof host, "%s-%s-%d", job, rnd_below(2) ? "master" : "worker",
                 (int)rnd_below(1000));
        snprintf(want, sizeof want, "%s-master-0.%s.svc.%s.", job, ns, dom);
        break;
      case AGENT_SCHEME_JOBSET:
        snprintf(host, sizeof host, "%s-%s-%d-%d", job, rjv, (int)rnd_below(4),
                 (int)rnd_below(1000));
        snprintf(want, sizeof want, "%s-%s-0-0.%s.%s.svc.%s.", job, rjv, svcv, ns, dom);
        break;
      default:
        snprintf(host, sizeof host, "%s-%s-%d", job, taskv, (int)rnd_below(1000));
        snprintf(want, sizeof want, "%s-%s-0.%s.%s.svc.%s.", job, taskv, job, ns, dom);
        break;
    }
    if (strlen(want) - strlen(strchr(want, '.')) > 63) continue; /* first label too long */
    expect_name(&cfg, from_env ? envp : NULL, host, rc, want);
  }
}

/* ---- resolving ---- */

static int listen_any(int do_listen, int *port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  CHECK(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  if (do_listen) CHECK(listen(fd, 16) == 0);
  socklen_t len = sizeof a;
  CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  *port = ntohs(a.sin_port);
  return fd;
}

typedef struct {
  int64_t start, stop_after, last, max_gap;
  int calls;
} cancel_t;

static int cancel_cb(void *arg) {
  cancel_t *c = arg;
  int64_t t = now_ms();
  if (c->last && t - c->last > c->max_gap) c->max_gap = t - c->last;
  c->last = t;
  c->calls++;
  return c->stop_after >= 0 && t - c->start >= c->stop_after;
}

static void test_resolve(void) {
  char ip[64], err[512];
  agent_resolve_stats_t st;

  /* localhost, no connect: one attempt. */
  memset(&st, 0, sizeof st);
  CHECK_EQ_INT(agent_resolve("localhost", 80, 0, now_ms() + 5000, NULL, NULL, ip, sizeof ip, &st,
                             err, sizeof err),
               0);
  CHECK(!strcmp(ip, "127.0.0.1") || !strcmp(ip, "::1"));
  CHECK_EQ_INT(st.attempts, 1);
  CHECK_EQ_INT(st.failures, 0);

  /* A real listener: the connect is confirmed (the cancel callback is polled but says go on). */
  int port;
  int lfd = listen_any(1, &port);
  const char *names[] = {"localhost", "127.0.0.1"};
  for (int i = 0; i < 2; i++) {
    memset(&st, 0, sizeof st);
    cancel_t c = {.start = now_ms(), .stop_after = -1};
    CHECK_EQ_INT(agent_resolve(names[i], port, 1, now_ms() + 5000, cancel_cb, &c, ip, sizeof ip,
                               &st, err, sizeof err),
                 0);
    CHECK_STR(ip, "127.0.0.1");
    CHECK_EQ_INT(st.attempts, 1); /* connected at once: no retry, no sleep */
    CHECK(c.calls >= 1);
  }
  /* The connection really happened: it waits in the backlog. */
  int cfd = accept(lfd, NULL, NULL);
  CHECK(cfd >= 0);
  close(cfd);
  close(lfd);

  /* A bound port with no listener refuses: retried until the deadline, then a connect error. */
  int rfd = listen_any(0, &port);
  memset(&st, 0, sizeof st);
  int64_t t0 = now_ms();
  int r = agent_resolve("127.0.0.1", port, 1, t0 + 1500, NULL, NULL, ip, sizeof ip, &st, err,
                        sizeof err);
  int64_t took = now_ms() - t0;
  TEST_LOG("refused: %s (%" PRIu64 " attempts, %lld ms)", err, st.attempts, (long long)took);
  CHECK_EQ_INT(r, -1);
  CHECK_STR(ip, "");
  char want[128];
  snprintf(want, sizeof want, "resolved to 127.0.0.1 but connect to port %d failed: ", port);
  CHECK_HAS(err, want);
  CHECK_HAS(err, strerror(ECONNREFUSED));
  CHECK_HAS(err, "could not connect to '127.0.0.1' after ");
  CHECK(took >= 1500); /* it kept retrying until the deadline */
  /* 100 ms doubling with jitter in [d/2, d]: it retried, and at most 10 sleeps fit in 1.5 s (a
   * slow machine makes fewer attempts, never more; how long it took is not asserted). */
  CHECK(st.attempts >= 2 && st.attempts <= 12);
  CHECK_EQ_INT(st.failures, st.attempts);
  /* Stats accumulate across calls. */
  uint64_t before = st.attempts;
  CHECK_EQ_INT(agent_resolve("127.0.0.1", port, 1, now_ms(), NULL, NULL, ip, sizeof ip, &st, err,
                             sizeof err),
               -1);
  CHECK_EQ_INT(st.attempts, before + 1); /* a passed deadline still makes one attempt */

  /* Cancel stops it early with -2, polled at least every 100 ms while it sleeps. */
  memset(&st, 0, sizeof st);
  cancel_t c = {.start = now_ms(), .stop_after = 700};
  t0 = now_ms();
  r = agent_resolve("127.0.0.1", port, 1, t0 + 20000, cancel_cb, &c, ip, sizeof ip, &st, err,
                    sizeof err);
  took = now_ms() - t0;
  TEST_LOG("cancelled: %s (%d polls, max gap %lld ms, %lld ms)", err, c.calls, (long long)c.max_gap,
           (long long)took);
  CHECK_EQ_INT(r, -2);
  CHECK_HAS(err, "cancelled");
  CHECK(took >= 700); /* the callback said stop only after 700 ms */
  CHECK(st.attempts >= 2);
  /* Polled while it sleeps between attempts, not only once per attempt (the gap between polls,
   * 100 ms promised, is printed above and not asserted: tests assert no timings). */
  CHECK(c.calls > (int)st.attempts);
  /* Cancelled before the first attempt. */
  c = (cancel_t){.start = now_ms(), .stop_after = 0};
  memset(&st, 0, sizeof st);
  CHECK_EQ_INT(agent_resolve("127.0.0.1", port, 1, now_ms() + 5000, cancel_cb, &c, ip, sizeof ip,
                             &st, err, sizeof err),
               -2);
  CHECK_EQ_INT(st.attempts, 0);
  close(rfd);

  /* Argument errors and an address that does not fit. */
  CHECK_EQ_INT(
      agent_resolve("", 1, 0, now_ms() + 100, NULL, NULL, ip, sizeof ip, NULL, err, sizeof err),
      -1);
  CHECK_EQ_INT(agent_resolve("127.0.0.1", 70000, 0, now_ms() + 100, NULL, NULL, ip, sizeof ip, NULL,
                             err, sizeof err),
               -1);
  CHECK_HAS(err, "70000");
  CHECK_EQ_INT(agent_resolve("127.0.0.1", 0, 1, now_ms() + 100, NULL, NULL, ip, sizeof ip, NULL,
                             err, sizeof err),
               -1);
  CHECK_EQ_INT(
      agent_resolve("127.0.0.1", 1, 0, now_ms() + 100, NULL, NULL, ip, 5, NULL, err, sizeof err),
      -1);
  CHECK_HAS(err, "does not fit");
  /* IPv6 literal when the host has ::1 (no DNS involved). */
  if (agent_resolve("::1", 1, 0, now_ms() + 100, NULL, NULL, ip, sizeof ip, NULL, err,
                    sizeof err) == 0)
    CHECK_STR(ip, "::1");
}

static void test_local_ip(void) {
  char ip[64];
  unsigned char buf[16];
  agent_local_ip(NULL, ip, sizeof ip);
  TEST_LOG("local ip: %s", ip);
  CHECK(inet_pton(AF_INET, ip, buf) == 1 || inet_pton(AF_INET6, ip, buf) == 1);
  agent_local_ip("127.0.0.1", ip, sizeof ip);
  CHECK_STR(ip, "127.0.0.1");
  agent_local_ip("", ip, sizeof ip);
  CHECK(inet_pton(AF_INET, ip, buf) == 1 || inet_pton(AF_INET6, ip, buf) == 1);
  agent_local_ip("203.0.113.7", ip, sizeof ip); /* maybe no route (no network): still an address */
  CHECK(inet_pton(AF_INET, ip, buf) == 1 || inet_pton(AF_INET6, ip, buf) == 1);
}

/* Inside a Kubernetes pod the service account's namespace file exists and takes precedence over
 * resolv.conf, which would leave the resolv.conf namespace cases untested: hide it under a tmpfs
 * in a private mount namespace (needs root); if that is not possible, that part is a skip. */
static void hide_sa_file(void) {
  if (!sa_file_exists()) return;
  const char *dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
      mount("tmpfs", dir, "tmpfs", 0, NULL) == 0 && !sa_file_exists())
    return;
  test_skip(
      "discovery_test: the resolv.conf namespace cases: %s exists and cannot be hidden in "
      "a private mount namespace (%s)",
      SA_NAMESPACE_FILE, strerror(errno));
}

/* agent_pod_name: pod 0's first label "...-0" becomes "...-<index>"; anything else is refused. */
static void test_pod_name(void) {
  char out[256], err[256];
  static const struct {
    const char *pod0;
    int index;
    const char *want; /* NULL: refused */
  } cases[] = {
      {"job-0.svc.ns.svc.cluster.local.", 3, "job-3.svc.ns.svc.cluster.local."},
      {"tdist-train-0.tdist-train.default.svc.cluster.local.", 2,
       "tdist-train-2.tdist-train.default.svc.cluster.local."},
      {"js-workers-0-0.js.ns.svc.cluster.local.", 12, "js-workers-0-12.js.ns.svc.cluster.local."},
      {"job-0", 7, "job-7"},
      {"job-10.svc.ns", 1, NULL},     /* index 10, not 0 */
      {"job-master.svc.ns", 1, NULL}, /* no index */
      {"0.svc", 1, NULL},             /* no "-0" */
      {"-0.svc", 1, NULL},            /* a label may not start with '-' */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    err[0] = 0;
    int r = agent_pod_name(cases[i].pod0, cases[i].index, out, sizeof out, err, sizeof err);
    if (cases[i].want) {
      CHECK_EQ_INT(r, 0);
      CHECK_STR(out, cases[i].want);
    } else {
      CHECK_EQ_INT(r, -1);
      CHECK(out[0] == 0 && err[0] != 0);
    }
  }
  /* Too long for the buffer: refused, nothing written. */
  char small[8];
  CHECK_EQ_INT(agent_pod_name("job-0.svc", 5, small, sizeof small, err, sizeof err), -1);
  CHECK_HAS(err, "too long");
}

int main(void) {
  test_rng_init("discovery_test", 0xd15c0e77ULL);
  hide_sa_file();
  snprintf(g_rc, sizeof g_rc, "%s/discovery_test.resolv.conf.%d", tmpdir(), (int)getpid());
  test_node_rank();
  test_resolv_conf();
  test_master_name();
  test_pod_name();
  test_resolve();
  test_local_ip();
  unlink(g_rc);
  TEST_LOG("discovery_test: all passed");
  return 0;
}
