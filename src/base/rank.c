/*
 * rank.c - argmax and top-k in one order (see rank.h).
 */
#include "base/rank.h"

#include <math.h>

/* a ranks before b: the larger value, the lower index on ties (callers
 * never pass NaN). */
static bool before(float va, int32_t ia, float vb, int32_t ib) { return va > vb || (va == vb && ia < ib); }

int32_t ds4_argmax(const float *x, int n) {
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || before(x[i], i, x[best], best))) best = i;
    return best < 0 ? 0 : best;
}

/* A bounded insertion: k is small next to n (alternatives of a report,
 * the sampler's top-k), so most values fail the first comparison. */
int ds4_top_k(const float *x, int n, int k, int32_t *ids) {
    if (k > n) k = n;
    int kept = 0;
    for (int i = 0; k > 0 && i < n; i++) {
        float v = x[i];
        if (isnan(v)) continue;
        if (kept == k && !before(v, i, x[ids[k - 1]], ids[k - 1])) continue;
        int j = kept < k ? kept++ : k - 1;
        while (j > 0 && before(v, i, x[ids[j - 1]], ids[j - 1])) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    return kept;
}

bool ds4_any_nan(const float *x, int n) {
    for (int i = 0; i < n; i++)
        if (isnan(x[i])) return true;
    return false;
}
