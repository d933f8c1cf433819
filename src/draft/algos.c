/*
 * algos.c: the table of drafting algorithms (SGLang's --speculative-algorithm names). A row says
 * what an algorithm needs and makes one slot's drafter; the engine knows drafters only through
 * it, so a new drafter is its own file, one row here and one value of st_spec_algo.
 */
#include "draft/drafter.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static st_status make_ngram(const st_spec_params *sp, const st_model *target, int32_t n_ctx,
                            st_session *with, bool populate, int64_t K, int64_t S,
                            st_drafter **out) {
    (void)target, (void)with;
    return st_drafter_ngram_create(sp->ngram_min_match, sp->ngram_max_match, sp->ngram_breadth, K,
                                   S, (int64_t)n_ctx + 1, populate, out);
}

static st_status make_standalone(const st_spec_params *sp, const st_model *target, int32_t n_ctx,
                                 st_session *with, bool populate, int64_t K, int64_t S,
                                 st_drafter **out) {
    return st_drafter_model_create(sp->draft_model, target, n_ctx, with, populate, K, S, out);
}

static st_status make_eagle(const st_spec_params *sp, const st_model *target, int32_t n_ctx,
                            st_session *with, bool populate, int64_t K, int64_t S,
                            st_drafter **out) {
    return st_drafter_eagle_create(sp->draft_model, target, n_ctx, with, populate, K, S, out);
}

static st_status make_eagle3(const st_spec_params *sp, const st_model *target, int32_t n_ctx,
                             st_session *with, bool populate, int64_t K, int64_t S,
                             st_drafter **out) {
    return st_drafter_eagle3_create(sp->draft_model, target, n_ctx, with, populate, K, S, out);
}

/* The n-gram index of a history of n_ctx + 1 tokens (ngram.c). */
static size_t bytes_ngram(const st_spec_params *sp, int32_t n_ctx, const st_session *with) {
    (void)sp, (void)with;
    return ((size_t)n_ctx + 1) * sizeof(int32_t);
}

static size_t bytes_model(const st_spec_params *sp, int32_t n_ctx, const st_session *with) {
    return st_drafter_model_context_bytes(sp->draft_model, n_ctx, with);
}

/* EAGLE-3 reads three of the target's layers: the session captures them for observe. */
static st_status attach_eagle3(const st_spec_params *sp, st_session *target) {
    return st_session_set_capture(target, sp->draft_model->n_cap, sp->draft_model->cap_layer);
}

static const st_draft_algo algos[] = {
    {ST_SPEC_NONE, "NONE", 0, NULL, NULL, NULL},
    {ST_SPEC_STANDALONE, "STANDALONE", 1, make_standalone, bytes_model, NULL},
    {ST_SPEC_NGRAM, "NGRAM", 0, make_ngram, bytes_ngram, NULL},
    {ST_SPEC_EAGLE, "EAGLE", 1, make_eagle, bytes_model, NULL},
    {ST_SPEC_EAGLE3, "EAGLE3", 1, make_eagle3, bytes_model, attach_eagle3},
};
enum { N_ALGOS = sizeof algos / sizeof algos[0] };

const st_draft_algo *st_draft_algo_of(st_spec_algo a) {
    for (int i = 0; i < N_ALGOS; i++)
        if (algos[i].algo == a)
            return &algos[i];
    return &algos[0];
}

st_status st_spec_algo_parse(const char *name, st_spec_algo *out) {
    for (int i = 0; name && i < N_ALGOS; i++)
        if (!strcasecmp(name, algos[i].name)) {
            *out = algos[i].algo;
            return ST_OK;
        }
    char names[128] = "";
    for (int i = 0; i < N_ALGOS; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 algos[i].name);
    return st_fail(ST_ERR_INVALID, "unknown speculative algorithm '%s' (%s)",
                   name ? name : "(null)", names);
}

const char *st_spec_algo_name(st_spec_algo a) { return st_draft_algo_of(a)->name; }
