/*
 * cpu_mtp.c - the MTP block's forward pass on the CPU (docs/MODEL.md 9).
 *
 * A row is a token t at position p paired with the main model's final
 * residual H at position p - 1 (the last layer's HC state, n_hc streams,
 * from the ring its sequence keeps; for a draft after a draft, the MTP
 * sequence's own):
 *
 *   e   = RMSNorm_enorm(embed(t))            the main model's embedding
 *   S_h = e_proj e + h_proj RMSNorm_hnorm(H_h)   for each stream h
 *   S   = one full V4 block (mtp.0.*): a dense layer (ratio 0, its own raw
 *         window over the MTP sequence's own KV rows, RoPE base 10000),
 *         biased top-k routing (no hash table)
 *   logits = output head of S with the block's own HC head and norm and
 *         the main model's output matrix
 *
 * and the row's S is the hidden state the next draft pairs with its token.
 * This is the official MTPBlock's pairing (the state at position i with the
 * token at i + 1 predicts the token at i + 2), which is how the block is
 * trained.  The rows run through the same sublayer code as the main
 * model's layers, so the batched pass, the journal and the rewind are the
 * same.
 */
#include <string.h>

#include "format/quants.h"
#include "model/cpu/cpu.h"

/* The MTP block as the sublayer functions take it. */
static cpu_layer mtp_layer(const ds4_mtp_weights *m) {
    return (cpu_layer){&m->blk, 0, 0, 0, false, m->cfg.swiglu_clamp[0], false, false};
}

/* S for each row: e_proj(enorm(embed(t))) + h_proj(hnorm(H_h)) per stream. */
static void mtp_input(cpu_backend *b, const ds4_mtp_weights *m, const ds4_row *rows, uint32_t T) {
    const ds4_weights *w = b->base.w;
    const ds4_config *c = b->cfg;
    uint32_t D = c->n_embd, n = c->n_hc, hcD = n * D;
    for (uint32_t t = 0; t < T; t++) {
        ds4_dequantize_row(w->token_embd.type, ds4_wt_row(&w->token_embd, 0, rows[t].token), b->x + (size_t)t * D, D);
        cpu_rmsnorm(b->xn + (size_t)t * D, b->x + (size_t)t * D, cpu_vec(&m->enorm), D, c->rms_eps);
    }
    cpu_matmul(b, &m->e_proj, 0, 0, D, b->xn, D, T, b->y, D);
    /* the T * n_hc streams of H, each normalised on its own, then one product */
    for (uint32_t t = 0; t < T; t++) {
        const float *H = cpu_seq_hidden(cpu_seq_of(rows[t].hseq), rows[t].hpos);
        for (uint32_t h = 0; h < n; h++)
            cpu_rmsnorm(b->flat + ((size_t)t * n + h) * D, H + (size_t)h * D, cpu_vec(&m->hnorm), D, c->rms_eps);
    }
    cpu_matmul(b, &m->h_proj, 0, 0, D, b->flat, D, T * n, b->S, D);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < n; h++) {
            float *S = b->S + (size_t)t * hcD + (size_t)h * D;
            const float *ep = b->y + (size_t)t * D;
            for (uint32_t d = 0; d < D; d++) S[d] = ep[d] + S[d];
        }
}

int cpu_mtp_pass(cpu_backend *b, const ds4_row *rows, uint32_t T, float *const *logits, float *const *hidden) {
    const ds4_mtp_weights *m = b->base.opts.mtp;
    uint32_t tok[T];
    for (uint32_t t = 0; t < T; t++) tok[t] = rows[t].token;
    mtp_input(b, m, rows, T);
    cpu_layer L = mtp_layer(m);
    cpu_attention_layer(b, &L, T);
    cpu_ffn_layer(b, &L, tok, T);
    cpu_pass_end(b, T, tok, hidden);
    cpu_output_head(b, &m->hc_head_fn, &m->hc_head_scale, &m->hc_head_base, &m->norm, T, logits);
    return 0;
}
