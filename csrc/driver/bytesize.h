/* SPDX-License-Identifier: MIT */
/*
 * driver/bytesize.h: how a variable spells a byte count (digits, then an
 * optional K, M or G, powers of 1024, followed by an optional B or iB,
 * any case, blanks around: 512M, 1GiB, 1048576).  Plain C, header only,
 * so that the simulator (CUDAMEM_SIM_MEMORY) and the memory limit
 * (CUDAMEM_DEVICE_MEMORY_LIMIT) read the same spelling from one place.
 * No state, no locks.
 */
#ifndef CM_BYTESIZE_H
#define CM_BYTESIZE_H

#include <ctype.h>
#include <limits.h>

/* Parse s as a byte count of at most max: 0 with *out, or -1 (not such
 * a spelling, or past max). */
static inline int
cm_parse_bytes(const char *s, unsigned long long max, unsigned long long *out)
{
    const char *p = s;
    unsigned long long v = 0;
    int shift = 0;

    while (isspace((unsigned char)*p)) {
        p++;
    }
    if (!isdigit((unsigned char)*p)) {
        return -1;
    }
    for (; isdigit((unsigned char)*p); p++) {
        if (v > (ULLONG_MAX - 9) / 10) {
            return -1;
        }
        v = v * 10 + (unsigned long long)(*p - '0');
    }
    while (isspace((unsigned char)*p)) {
        p++;
    }
    switch (toupper((unsigned char)*p)) {
    case 'K': shift = 10; p++; break;
    case 'M': shift = 20; p++; break;
    case 'G': shift = 30; p++; break;
    default: break;
    }
    if (toupper((unsigned char)*p) == 'I'
        && toupper((unsigned char)p[1]) == 'B') {
        p += 2;
    }
    else if (toupper((unsigned char)*p) == 'B') {
        p++;
    }
    while (isspace((unsigned char)*p)) {
        p++;
    }
    if (*p != '\0' || v > (max >> shift)) {
        return -1;
    }
    *out = v << shift;
    return 0;
}

#endif /* CM_BYTESIZE_H */
