/*
 * inspect.c - `ds4 --inspect`: what a model file is, after the loader has
 * validated it: the configuration, the tensors grouped by class (the
 * classes of model/layout.h, which are also the quantization policy's)
 * with their counts, bytes and storage types, the tokenizer, and the memory
 * a session of --ctx tokens needs.  No backend is started.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/startup.h"
#include "format/quants.h"
#include "model/layout.h"
#include "modes.h"
#include "runtime.h"

typedef struct class_sum {
    uint32_t count;
    uint64_t bytes;
    uint64_t types; /* bit t: ggml type t present */
} class_sum;

static void print_config(const ds4_config *c) {
    const char *name = ds4_config_name(c);
    printf("config (%s):\n", name ? name : "not a published model's shapes");
    printf("  layers %u, embedding %u, vocabulary %u\n", c->n_layer, c->n_embd, c->n_vocab);
    printf("  attention: %u heads x %u (rope %u), kv heads %u, q_lora_rank %u, output %u groups x rank %u\n", c->n_head,
           c->head_dim, c->rope_dim, c->n_head_kv, c->q_lora_rank, c->o_groups, c->o_lora_rank);
    printf("  sliding window %u; indexer %u heads x %u, top-k %u\n", c->sliding_window, c->idx_n_head, c->idx_head_dim,
           c->idx_top_k);
    printf("  compress ratios:");
    for (uint32_t i = 0; i < c->n_layer; i++) printf(" %u", c->compress_ratio[i]);
    printf("\n  experts: %u routed (%u used) + %u shared, ffn %u; hash-routed layers %u; weights scale %g%s\n",
           c->n_expert, c->n_expert_used, c->n_expert_shared, c->n_ff_exp, c->n_hash_layer,
           (double)c->expert_weights_scale, c->expert_weights_norm ? ", normalized" : "");
    printf("  hyper-connections %u (sinkhorn %u iterations, eps %g); rms eps %g\n", c->n_hc, c->hc_sinkhorn_iters,
           (double)c->hc_eps, (double)c->rms_eps);
    printf("  rope base %g, compressed rope base %g, yarn factor %g over %llu tokens (beta %g/%g)\n",
           (double)c->rope_base, (double)c->compress_rope_base, (double)c->yarn_factor,
           (unsigned long long)c->yarn_orig_ctx, (double)c->yarn_beta_fast, (double)c->yarn_beta_slow);
    if (c->context_length) printf("  context length %llu\n", (unsigned long long)c->context_length);
}

/* Per-class sums over the inventory's tensors present in the file. */
static int sum_classes(const ds4_engine *e, class_sum *sums, uint32_t *unmatched) {
    const ds4_config *c = &e->w->cfg;
    ds4_tensor_spec *specs = calloc(ds4_layout_count(c), sizeof(*specs));
    if (!specs) return -1;
    size_t n = ds4_layout_build(c, specs);
    uint64_t matched = 0;
    for (size_t k = 0; k < n; k++) {
        const ds4_gguf_tensor *t = ds4_gguf_find_tensor(e->w->gguf, specs[k].name);
        if (!t) continue; /* an absent optional tensor */
        class_sum *s = &sums[specs[k].cls];
        s->count++;
        s->bytes += t->nbytes;
        if (t->type < 64) s->types |= 1ull << t->type;
        matched++;
    }
    *unmatched = (uint32_t)(e->w->gguf->n_tensors - matched); /* mtp.* tensors the loader ignores */
    free(specs);
    return 0;
}

static void print_tensors(const ds4_engine *e) {
    class_sum sums[DS4_TC_COUNT];
    memset(sums, 0, sizeof(sums));
    uint32_t unmatched;
    if (sum_classes(e, sums, &unmatched) != 0) return;
    char b[32];
    uint64_t total = 0;
    uint32_t count = 0;
    printf("tensors by class:\n  %-16s %6s %12s  %s\n", "class", "count", "bytes", "types");
    for (int k = 0; k < DS4_TC_COUNT; k++) {
        if (!sums[k].count) continue;
        printf("  %-16s %6u %12s  ", ds4_tclass_name((ds4_tclass)k), sums[k].count, ds4_fmt_bytes(sums[k].bytes, b));
        const char *sep = "";
        for (uint32_t t = 0; t < 64; t++) {
            if (!(sums[k].types >> t & 1)) continue;
            const ds4_type_info *ti = ds4_type_get(t);
            printf("%s%s", sep, ti && ti->name ? ti->name : "?");
            sep = ",";
        }
        putchar('\n');
        total += sums[k].bytes;
        count += sums[k].count;
    }
    printf("  %-16s %6u %12s\n", "total", count, ds4_fmt_bytes(total, b));
    if (unmatched) printf("  (%u other tensors, not used: MTP)\n", unmatched);
}

/* The routed experts' type and the quant bits KV cache files record for
 * it: ds4's format knows 2 and 4 (its q2 and q4 files), so a model whose
 * experts are neither says which number stands for it. */
static void print_quant_bits(const ds4_engine *e) {
    uint32_t type = e->w->layers[0].gate_exps.type;
    const char *name = ds4_type_get(type) ? ds4_type_get(type)->name : "?";
    int bits = ds4_engine_quant_bits(e);
    bool native = type == DS4_TYPE_Q4_K || type == DS4_TYPE_Q2_K || type == DS4_TYPE_IQ2_XXS;
    if (native) printf("routed experts: %s (quant bits %d in KV cache files)\n", name, bits);
    else
        printf("routed experts: %s (KV cache files record quant bits %d: ds4's format knows only 2 and 4)\n", name,
               bits);
}

int run_inspect(ds4_engine *e, const cli_opts *o) {
    const ds4_gguf *g = e->w->gguf;
    char a[32], b[32], c[32];
    printf("model: %s (GGUF v%u, %s, %llu tensors, %llu metadata keys)\n", o->model, g->version,
           ds4_fmt_bytes(g->size, a), (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv);
    ds4_str name;
    if (ds4_gguf_get_str(g, "general.name", &name, NULL) == 0) printf("name: %.*s\n", (int)name.len, name.ptr);
    print_config(&e->w->cfg);
    print_tensors(e);
    print_quant_bits(e);
    if (e->vocab)
        printf("tokenizer: %u tokens, %u merges, bos %d, eos %d\n", ds4_vocab_size(e->vocab),
               ds4_vocab_n_merges(e->vocab), e->bos, e->eos);
    else printf("tokenizer: none (the file runs token ids only)\n");
    if (g->header_only) printf("data: none (a header-only file: shapes and memory only)\n");
    uint64_t w = ds4_weights_bytes(e->w), kv = ds4_engine_kv_bytes(e, o->ctx);
    printf("memory: weights %s + KV state for %u tokens %s = %s\n", ds4_fmt_bytes(w, a), o->ctx, ds4_fmt_bytes(kv, b),
           ds4_fmt_bytes(w + kv, c));
    printf("weights_bytes: %llu\n", (unsigned long long)w);
    printf("kv_bytes: %llu\n", (unsigned long long)kv);
    return 0;
}
