/*
 * meminfo.c - the host's available memory (see meminfo.h).
 */
#include "base/meminfo.h"

#include <stdio.h>

uint64_t ds4_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}
