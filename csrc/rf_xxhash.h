/* xxHash, header-only: every function inlined into the including module. */
#ifndef RF_XXHASH_H
#define RF_XXHASH_H
#define XXH_INLINE_ALL
#include "xxhash.h"
#endif
