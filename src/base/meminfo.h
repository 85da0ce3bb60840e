/*
 * meminfo.h - how much host memory the system can still give: the
 * kernel's MemAvailable (free pages plus the page cache and slabs it can
 * reclaim), which is what sizing decisions (sessions of ds4-server, the
 * layers of a pipeline rank) are made against.
 */
#ifndef DS4_BASE_MEMINFO_H
#define DS4_BASE_MEMINFO_H

#include <stdint.h>

/* MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read. */
uint64_t ds4_mem_available(void);

#endif
