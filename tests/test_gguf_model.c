/*
 * test_gguf_model.c: models from memory and from spectree-mkmodel: a writer-made model with every
 * weight type loads and runs, and each bad hyperparameter key gets an error naming it; every
 * weight type of spectree-mkmodel loads and runs; --keep-layers keeps blocks bitwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "gguf_util.h"
#include "io/gguf_internal.h"
#include "io/gguf_write.h"
#include "kernels/kernels.h"
#include "spectree.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* A small model made with the writer                                                         */

static void test_load_memory(void **state) {
    (void)state;
    size_t size;
    char *bytes = tu_read_file(stories(), &size);
    st_model *mf, *mm;
    assert_int_equal(st_model_load(stories(), &mf), ST_OK);
    assert_int_equal(st_model_load_memory(bytes, size, "stories-mem", &mm), ST_OK);
    assert_memory_equal(st_model_get_hparams(mf), st_model_get_hparams(mm),
                        sizeof(st_model_hparams));
    float *a = eval_logits(mf), *b = eval_logits(mm);
    assert_memory_equal(a, b, 512 * sizeof(float));
    free(a);
    free(b);
    st_model_free(mm);
    st_model_free(mf);

    /* The writer-made model: every weight type, loads from memory and from a file alike. */
    st_gguf *vocab;
    assert_int_equal(st_gguf_open_memory(bytes, size, "vocab", &vocab), ST_OK);
    size_t n;
    void *img = build_small(vocab, -1, KEY_OK, &n);
    assert_int_equal(st_model_load_memory(img, n, "small", &mm), ST_OK);
    const st_model_hparams *hp = st_model_get_hparams(mm);
    assert_int_equal(hp->n_vocab, 512);
    assert_int_equal(hp->n_embd, SM_DIM);
    assert_int_equal(hp->n_layer, SM_LAYERS);
    assert_int_equal(hp->n_head_kv, SM_KV);
    assert_int_equal(hp->wtype, ST_DTYPE_F16);
    assert_int_equal(hp->tied_output, 0);
    char path[] = "/tmp/st_gguf_small_XXXXXX";
    int fd = mkstemp(path);
    assert_int_equal(write(fd, img, n), (ssize_t)n);
    close(fd);
    assert_int_equal(st_model_load(path, &mf), ST_OK);
    a = eval_logits(mf);
    b = eval_logits(mm);
    assert_memory_equal(a, b, 512 * sizeof(float));
    free(a);
    free(b);
    st_model_free(mf);
    st_model_free(mm);
    remove(path);
    free(img);

    /* Every required key missing or of a wrong type: a clear error naming file and key. */
    for (int k = 0; k < N_SMALL_HPARAMS; k++)
        for (int mode = KEY_MISSING; mode < KEY_N; mode++) {
            img = build_small(vocab, k, (key_mode)mode, &n);
            char name[64];
            snprintf(name, sizeof name, "small-key%d-mode%d", k, mode);
            st_status s = st_model_load_memory(img, n, name, &mm);
            int optional = strstr(small_hparams[k].key, "head_count_kv") ||
                           strstr(small_hparams[k].key, "dimension_count") ||
                           strstr(small_hparams[k].key, "freq_base");
            if (s == ST_OK) {
                /* Only a missing optional key may load. */
                if (!(mode == KEY_MISSING && optional))
                    fail_msg("%s (%s) loaded", name, small_hparams[k].key);
                st_model_free(mm);
            } else {
                assert_null(mm);
                assert_error_names(s, name);
                /* A missing optional key takes its default, which may not fit the tensors. */
                if (!(mode == KEY_MISSING && optional) &&
                    !strstr(st_last_error(), small_hparams[k].word))
                    fail_msg("%s: error '%s' does not name the key %s", name, st_last_error(),
                             small_hparams[k].key);
            }
            free(img);
        }
    st_gguf_free(vocab);
    free(bytes);
}

/* ------------------------------------------------------------------------------------------ */
/* spectree-mkmodel                                                                           */

static int run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int rc = pclose(f);
    return rc;
}

static void test_mkmodel(void **state) {
    (void)state;
    char tool[512];
    snprintf(tool, sizeof tool, "%s/spectree-mkmodel", ST_BUILD_DIR);
    if (access(tool, X_OK) != 0) {
        fprintf(stderr, "test_mkmodel: %s not built, skipped\n", tool);
        skip();
    }
    char dir[] = "/tmp/st_mkmodel_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cmd[2048], out[4096], path[600], path2[600];
    const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    const uint32_t ids[] = {ST_DTYPE_F32, ST_DTYPE_F16, ST_DTYPE_BF16, ST_DTYPE_Q8_0,
                            ST_DTYPE_Q4_0};
    for (int i = 0; i < 5; i++) {
        int ff = i < 3 ? 172 : 192;
        snprintf(path, sizeof path, "%s/m_%s.gguf", dir, types[i]);
        snprintf(cmd, sizeof cmd,
                 "%s %s --vocab %s --dim 64 --ff %d --layers 5 --heads 8 --kv-heads 4 --type %s "
                 "--seed 3 2>&1",
                 tool, path, stories(), ff, types[i]);
        if (run_cmd(cmd, out, sizeof out) != 0)
            fail_msg("%s: %s", cmd, out);
        st_model *m;
        if (st_model_load(path, &m) != ST_OK)
            fail_msg("%s: %s", path, st_last_error());
        const st_model_hparams *hp = st_model_get_hparams(m);
        assert_int_equal(hp->n_vocab, 512);
        assert_int_equal(hp->n_embd, 64);
        assert_int_equal(hp->n_ff, ff);
        assert_int_equal(hp->n_layer, 5);
        assert_int_equal(hp->n_head, 8);
        assert_int_equal(hp->n_head_kv, 4);
        assert_int_equal(hp->head_dim, 8);
        assert_int_equal(hp->n_rot, 8);
        assert_int_equal(hp->n_ctx_train, 2048);
        assert_int_equal(hp->wtype, ids[i]);
        assert_true(hp->rms_eps == 1e-5f);
        free(eval_logits(m));
        st_model_free(m);
    }
    /* Other vocabularies: the tokenizer is copied and sets n_vocab. */
    snprintf(path, sizeof path, "%s/gpt2.gguf", dir);
    snprintf(cmd, sizeof cmd,
             "%s %s --vocab %s --dim 32 --ff 64 --layers 1 --heads 4 --type q8_0 --ctx 128 2>&1",
             tool, path, gpt2());
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    st_model *m;
    assert_int_equal(st_model_load(path, &m), ST_OK);
    assert_int_equal(st_model_get_hparams(m)->n_vocab, 50257);
    assert_int_equal(st_model_get_hparams(m)->n_ctx_train, 128);
    st_model_free(m);
    remove(path);

    /* --keep-layers: the first blocks, embeddings and output are bitwise those of the full
     * model; the same seed gives the same file, another seed another one. */
    snprintf(path, sizeof path, "%s/full.gguf", dir);
    snprintf(path2, sizeof path2, "%s/draft.gguf", dir);
    const char *shape = "--dim 64 --ff 192 --layers 4 --heads 8 --kv-heads 2 --type q4_0";
    snprintf(cmd, sizeof cmd, "%s %s --vocab %s %s --seed 11 2>&1", tool, path, spm(), shape);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    snprintf(cmd, sizeof cmd, "%s %s --vocab %s %s --seed 11 --keep-layers 2 2>&1", tool, path2,
             spm(), shape);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    st_gguf *gf, *gd;
    assert_int_equal(st_gguf_open(path, &gf), ST_OK);
    assert_int_equal(st_gguf_open(path2, &gd), ST_OK);
    assert_int_equal(get_u32(gf, "llama.block_count"), 4);
    assert_int_equal(get_u32(gd, "llama.block_count"), 2);
    assert_int_equal(st_gguf_n_tensors(gf), 3 + 9 * 4);
    assert_int_equal(st_gguf_n_tensors(gd), 3 + 9 * 2);
    for (int64_t i = 0; i < st_gguf_n_tensors(gd); i++) {
        const st_gguf_tensor *td = st_gguf_tensor_at(gd, i);
        const st_gguf_tensor *tf = st_gguf_tensor_find(gf, td->name);
        assert_non_null(tf);
        assert_int_equal(td->size, tf->size);
        assert_memory_equal(td->data, tf->data, td->size);
    }
    assert_null(st_gguf_tensor_find(gd, "blk.2.attn_q.weight"));
    st_model *md;
    assert_int_equal(st_model_load(path2, &md), ST_OK);
    assert_int_equal(st_model_get_hparams(md)->n_vocab, 32000);
    st_model_free(md);
    st_gguf_free(gd);
    snprintf(cmd, sizeof cmd, "%s %s --vocab %s %s --seed 12 --keep-layers 2 2>&1", tool, path2,
             spm(), shape);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    assert_int_equal(st_gguf_open(path2, &gd), ST_OK);
    const st_gguf_tensor *a = st_gguf_tensor_find(gd, "blk.0.attn_q.weight");
    assert_memory_not_equal(a->data, st_gguf_tensor_find(gf, "blk.0.attn_q.weight")->data, a->size);
    st_gguf_free(gd);
    st_gguf_free(gf);
    remove(path);
    remove(path2);

    /* Bad flags and shapes: one line on stderr, non-zero exit, no file. */
    snprintf(path, sizeof path, "%s/bad.gguf", dir);
    const char *bad[] = {
        "--dim 64 --ff 172 --layers 2 --heads 8 --type q8_0",     /* ff not a multiple of 32 */
        "--dim 60 --ff 192 --layers 2 --heads 8",                 /* dim % heads */
        "--dim 64 --ff 192 --layers 2 --heads 8 --kv-heads 3",    /* heads % kv-heads */
        "--dim 64 --ff 192 --layers 2 --heads 8 --type q5_0",     /* unknown type */
        "--dim 64 --ff 192 --layers 2",                           /* no heads */
        "--dim 64 --ff 192 --layers 2 --heads 8 --keep-layers 3", /* keep > layers */
        "--dim 64 --ff 192 --layers 2 --heads 8 --bogus",         /* unknown flag */
        "--dim x --ff 192 --layers 2 --heads 8",                  /* not a number */
        "--dim 64 --ff 192 --layers 2 --heads 8 --scale -1",      /* bad scale */
        "--dim 64 --ff 192 --layers 0 --heads 8",                 /* zero layers */
        "--dim 64 --ff 192 --layers 2 --heads 64",                /* odd head size (1) */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --vocab %s %s 2>&1", tool, path, stories(), bad[i]);
        int rc = run_cmd(cmd, out, sizeof out);
        if (rc == 0 || !strstr(out, "spectree-mkmodel: ") ||
            strchr(out, '\n') != out + strlen(out) - 1)
            fail_msg("'%s' gave rc %d and '%s'", bad[i], rc, out);
        assert_int_equal(access(path, F_OK), -1);
    }
    snprintf(cmd, sizeof cmd,
             "%s %s --vocab %s/nope.gguf --dim 64 --ff 192 --layers 1 --heads 8 2>&1", tool, path,
             dir);
    assert_true(run_cmd(cmd, out, sizeof out) != 0);
    assert_non_null(strstr(out, "nope.gguf"));
    snprintf(cmd, sizeof cmd, "%s --help", tool);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "--keep-layers"));
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/m_%s.gguf", dir, types[i]);
        remove(path);
    }
    assert_int_equal(rmdir(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_memory),
        cmocka_unit_test(test_mkmodel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
