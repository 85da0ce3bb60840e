/*
 * ds4-score-compare - compare two ds4-score result files
 * (docs/TOOLCHAIN.md; as ds4's compare_scores.py).
 *
 *   ds4-score-compare OLD.tsv NEW.tsv
 *
 * Cases are matched by id (cases present in only one file are counted and
 * left out).  Prints the mean avg_nll of both runs and the delta (negative:
 * NEW is better), per-case wins / ties / losses on avg_nll, first-token
 * matches and the mean greedy LCP of both.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/opts.h"

typedef struct row {
    char id[256];
    double avg_nll;
    int first_match;
    unsigned lcp;
} row;

typedef struct table {
    row *r;
    size_t n;
} table;

static int load(const char *path, table *t) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "ds4-score-compare: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int lineno = 0;
    size_t cap = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        if (lineno == 1 && strncmp(line, "id\t", 3) == 0) continue;
        if (line[0] == '\n' || line[0] == '\0') continue;
        row r;
        unsigned pt, tt;
        double nll;
        if (sscanf(line, "%255[^\t]\t%u\t%u\t%lf\t%lf\t%d\t%u", r.id, &pt, &tt, &nll, &r.avg_nll, &r.first_match,
                   &r.lcp) != 7 ||
            !isfinite(r.avg_nll)) {
            fprintf(stderr, "ds4-score-compare: %s:%d: not a ds4-score row\n", path, lineno);
            fclose(f);
            return -1;
        }
        if (t->n == cap) {
            cap = cap ? cap * 2 : 64;
            row *g = realloc(t->r, cap * sizeof(*g));
            if (!g) {
                fclose(f);
                return -1;
            }
            t->r = g;
        }
        t->r[t->n++] = r;
    }
    fclose(f);
    return 0;
}

static const row *find(const table *t, const char *id) {
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->r[i].id, id) == 0) return &t->r[i];
    return NULL;
}

int main(int argc, char **argv) {
    const char *old_path, *new_path;
    ds4_opt opts[] = {
        {DS4_OPT_SECTION("arguments:")},
        {DS4_OPT_STR("OLD.tsv", NULL, &old_path, NULL, "a ds4-score result file"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {DS4_OPT_STR("NEW.tsv", NULL, &new_path, NULL, "another, of the same cases"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-score-compare",
                   .usage = "OLD.tsv NEW.tsv",
                   .about = "Compare two ds4-score result files, case by case (matched by id): mean avg_nll of "
                            "both and the\ndelta (negative: NEW is better), wins, ties and losses, first-token "
                            "matches and greedy LCP.",
                   .opts = opts};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    table a = {0}, b = {0};
    if (load(old_path, &a) != 0 || load(new_path, &b) != 0) return 1;
    size_t n = 0, wins = 0, ties = 0, losses = 0, fa = 0, fb = 0, only = 0;
    double sa = 0, sb = 0, la = 0, lb = 0;
    for (size_t i = 0; i < a.n; i++) {
        const row *x = &a.r[i], *y = find(&b, x->id);
        if (!y) {
            only++;
            continue;
        }
        n++;
        sa += x->avg_nll, sb += y->avg_nll;
        la += x->lcp, lb += y->lcp;
        fa += x->first_match != 0, fb += y->first_match != 0;
        double d = y->avg_nll - x->avg_nll;
        if (fabs(d) <= 1e-9) ties++;
        else if (d < 0) wins++;
        else losses++;
    }
    only += b.n - (n <= b.n ? n : b.n);
    if (n == 0) {
        fprintf(stderr, "ds4-score-compare: no case ids in common\n");
        return 1;
    }
    printf("cases: %zu (%zu only in one file)\n", n, only);
    printf("avg_nll: old %.6f new %.6f delta %+.6f (%+.2f%%; negative = new better)\n", sa / n, sb / n, (sb - sa) / n,
           sa != 0 ? 100.0 * (sb - sa) / sa : 0.0);
    printf("cases: new better %zu, tied %zu, old better %zu\n", wins, ties, losses);
    printf("first-token matches: old %zu new %zu\n", fa, fb);
    printf("avg greedy LCP: old %.3f new %.3f\n", la / n, lb / n);
    free(a.r);
    free(b.r);
    return 0;
}
