/* Umbrella header: everything public in libtdist. */
#ifndef TDIST_TDIST_H
#define TDIST_TDIST_H
#include "tdist/version.h"
#include "tdist/status.h"
#include "tdist/store.h"
#include "tdist/pg.h"
#include "tdist/stats.h"
#endif
