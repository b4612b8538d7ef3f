/* tdist version numbers. tdist_version() returns TDIST_VERSION_STRING of the library actually
 * linked, so a program can compare it with the header it was compiled against. */
#ifndef TDIST_VERSION_H
#define TDIST_VERSION_H

#define TDIST_VERSION_MAJOR 0
#define TDIST_VERSION_MINOR 1
#define TDIST_VERSION_PATCH 0
#define TDIST_VERSION_STRING "0.1.0"
#define TDIST_VERSION_NUMBER \
  (TDIST_VERSION_MAJOR * 10000 + TDIST_VERSION_MINOR * 100 + TDIST_VERSION_PATCH)

#if defined(TDIST_BUILDING) && defined(__GNUC__)
#define TDIST_EXTERN __attribute__((visibility("default")))
#else
#define TDIST_EXTERN
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Returns the linked library's version, "MAJOR.MINOR.PATCH". Static storage; never NULL. */
TDIST_EXTERN const char *tdist_version(void);

#ifdef __cplusplus
}
#endif
#endif
