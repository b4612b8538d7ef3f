/* The fault seam itself (tests/testlib/fault.h): the n-th call of the armed class fails with the
 * errno a real failure sets, once or from then on; other classes, exempt threads, name filters
 * and call lists behave as documented; and unarmed, everything passes. If --wrap stopped reaching
 * our calls, every check here fails. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/testlib/check.h"
#include "tests/testlib/fault.h"

/* Keeps the compiler from eliding a malloc/free pair. */
static void *volatile g_sink;

static int try_malloc(void) {
  errno = 0;
  void *p = malloc(16);
  g_sink = p;
  if (!p) {
    CHECK_EQ_INT(errno, ENOMEM);
    return 0;
  }
  free(p);
  return 1;
}

static void *exempt_main(void *arg) {
  fault_exempt_thread(1);
  *(int *)arg = try_malloc();
  return NULL;
}

int main(void) {
  /* Once: only call 3 fails. */
  fault_arm(FAULT_ALLOC, 3, FAULT_ONCE);
  int got[5];
  for (int i = 0; i < 5; i++) got[i] = try_malloc();
  fault_disarm();
  CHECK(got[0] && got[1] && !got[2] && got[3] && got[4]);
  CHECK_EQ_INT(fault_calls(), 5);
  CHECK_EQ_INT(fault_failed(), 1);
  CHECK(strcmp(fault_last_failed_name(), "malloc") == 0);

  /* Sticky: calls 2.. fail, every allocation function. */
  fault_arm(FAULT_ALLOC, 2, FAULT_STICKY);
  g_sink = calloc(1, 8);
  void *first = (void *)g_sink;
  CHECK(first != NULL);
  CHECK(realloc(first, 64) == NULL && errno == ENOMEM); /* first stays valid */
  CHECK(strdup("x") == NULL && strndup("xy", 1) == NULL && !try_malloc());
  fault_disarm();
  free(first);
  CHECK_EQ_INT(fault_failed(), 4);
  CHECK(try_malloc()); /* disarmed: passes */

  /* Another class is not counted; an exempt thread is not counted. */
  fault_arm(FAULT_SOCK, 1, FAULT_STICKY);
  CHECK(try_malloc());
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd == -1 && errno == EMFILE);
  struct pollfd pf = {.fd = 0};
  CHECK(poll(&pf, 1, 0) == -1 && errno == ENOMEM);
  struct addrinfo *res = NULL;
  CHECK(getaddrinfo("127.0.0.1", "1", NULL, &res) == EAI_MEMORY);
  fault_disarm();
  CHECK_EQ_INT(fault_calls(), 3);
  fault_arm(FAULT_ALLOC, 1, FAULT_STICKY);
  int ok = 0;
  pthread_t th;
  CHECK(pthread_create(&th, NULL, exempt_main, &ok) == 0);
  CHECK(pthread_join(th, NULL) == 0);
  CHECK(ok);
  CHECK(!try_malloc());
  fault_disarm();

  /* A call list over named functions: calls 1 and 3 of {socket, poll} fail. */
  static const char *const names[] = {"socket", "poll", NULL};
  static const long fail[] = {1, 3, 0};
  fault_arm_list(FAULT_SOCK, names, fail);
  CHECK(socket(AF_INET, SOCK_STREAM, 0) == -1);
  CHECK(try_malloc() && getaddrinfo("127.0.0.1", "1", NULL, &res) == 0); /* not counted */
  freeaddrinfo(res);
  fd = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(fd >= 0);
  close(fd);
  CHECK(poll(&pf, 1, 0) == -1);
  CHECK(poll(&pf, 1, 0) >= 0);
  fault_disarm();
  CHECK_EQ_INT(fault_calls(), 4);
  CHECK_EQ_INT(fault_failed(), 2);
  TEST_LOG("fault seam: ok");
  return 0;
}
