/* Shared by the agent configuration tests (config_flags_test.c, config_yaml_test.c,
 * config_random_test.c): a scratch directory for config files, loading argv/env, dumps and the
 * dump round trip. A failure prints what differs and exits 1 (tests/testlib/check.h). */
#ifndef TDIST_TESTS_AGENT_CONFIG_TESTLIB_H
#define TDIST_TESTS_AGENT_CONFIG_TESTLIB_H

#include <stddef.h>

#include "operator-agent/config/config.h"
#include "tests/testlib/check.h"

#define ARGS(...) ((const char *[]){"tdist-agent", __VA_ARGS__, NULL})
#define ENVS(...) ((const char *[]){__VA_ARGS__, NULL})
#define NOENV ((const char *[]){NULL})

/* Makes the scratch directory (under TEST_TMPDIR), named after the test. */
void cfg_test_init(const char *test);
const char *cfg_test_dir(void);

/* Writes data to NAME in the scratch directory; the path stays valid for the next 3 calls. */
const char *write_file(const char *name, const void *data, size_t len);
const char *yaml_file(const char *text);

agent_cfg_result_t load(agent_cfg_t *c, char *err, const char **argv, const char **envp);
char *dump(const agent_cfg_t *c);
/* A dump without its comment lines (a YAML-loaded one names the file). */
const char *body(const char *d);
/* The dump of a successful load, or exits with the message. */
char *dump_of(const char **argv, const char **envp);
void same_dump(const char *want, const char **argv, const char **envp);

#define EXPECT_ERR(argv, envp, msg)                               \
  do {                                                            \
    agent_cfg_t c_;                                               \
    char e_[512];                                                 \
    CHECK_EQ_INT(load(&c_, e_, (argv), (envp)), AGENT_CFG_ERROR); \
    CHECK_STR(e_, (msg));                                         \
    agent_cfg_free(&c_);                                          \
  } while (0)

/* agent_cfg_load_yaml of `text` on defaults must fail with "<path><suffix>". */
void yaml_err_at(const char *file, int line, const char *text, size_t len, const char *suffix);
#define YAML_ERR(text, suffix) yaml_err_at(__FILE__, __LINE__, (text), strlen(text), (suffix))

/* c's worker command is want (a NULL-terminated list). */
void check_cmd(const agent_cfg_t *c, const char **want);

/* Writes the dump of c to a file, loads it on fresh defaults and checks both are equal, and that
 * the second dump is the same text. */
void round_trip(const agent_cfg_t *c, const char *what);

#endif
