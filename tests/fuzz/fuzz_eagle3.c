/*
 * fuzz_eagle3.c: libFuzzer target for the EAGLE-3 head loader (src/draft/eagle3_load.c) over
 * stories260K. Each input is a model.safetensors written into a scratch directory beside each of
 * four config.json files in turn (draft vocabularies 160, 200 and 512, default and explicit
 * layers, a tied head); st_eagle_head_load must load it or refuse it with a
 * negative status and a one-line error naming the directory. A loaded head's d2t must land in
 * the target's vocabulary without repeats, and it must run one forward pass.
 * Build: CC=clang cmake -S . -B build-fuzz -DST_FUZZ=ON -DST_SANITIZE=ON &&
 *        cmake --build build-fuzz -t fuzz_eagle3
 */
#include "model/model.h"
#include "spectree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static st_model *target;
static char dir[128];

static const char *const configs[4] = {
    "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 8, "
    "\"num_key_value_heads\": 4, \"num_hidden_layers\": 1, \"vocab_size\": 512, "
    "\"draft_vocab_size\": 160, \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [0, 2, "
    "4]}}",
    "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 8, "
    "\"num_key_value_heads\": 4, \"num_hidden_layers\": 1, \"vocab_size\": 512}",
    "{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_attention_heads\": 8, "
    "\"num_key_value_heads\": 4, \"num_hidden_layers\": 1, \"vocab_size\": 512, "
    "\"draft_vocab_size\": 200, \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [0, 2, "
    "4]}}",
    "{\"hidden_size\": 64, \"intermediate_size\": 128, \"num_attention_heads\": 8, "
    "\"num_key_value_heads\": 4, \"num_hidden_layers\": 1, \"vocab_size\": 512, "
    "\"tie_word_embeddings\": true}",
};

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static void try_config(const char *cfg, const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[256];
    if (!target) {
        const char *src = getenv("ST_SOURCE_DIR");
        snprintf(path, sizeof path, "%s/models/stories260K.gguf", src ? src : ST_SOURCE_DIR);
        if (st_model_load(path, &target) != ST_OK)
            abort();
        snprintf(dir, sizeof dir, "/tmp/fuzz_eagle3_%d", (int)getpid());
        mkdir(dir, 0755);
    }
    for (int c = 0; c < 4; c++)
        try_config(configs[c], data, size);
    return 0;
}

static void try_config(const char *cfg, const uint8_t *data, size_t size) {
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (write_file(path, cfg, strlen(cfg)))
        abort();
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (write_file(path, data, size))
        abort();
    st_model *head = NULL;
    st_status s = st_eagle_head_load(dir, target, &head);
    if (s != ST_OK) {
        const char *e = st_last_error();
        if (s >= 0 || head || !strstr(e, dir) || strchr(e, '\n')) {
            fprintf(stderr, "rejection without a clear error: status %d, '%s'\n", (int)s, e);
            abort();
        }
        return;
    }
    if (head->eagle3) {
        uint8_t seen[512] = {0};
        for (int64_t i = 0; i < head->output.n_out; i++) {
            const int32_t t = head->d2t[i];
            if (t < 0 || t >= 512 || seen[t]++)
                abort();
        }
        st_session_params sp = st_session_default_params();
        sp.n_ctx = 8;
        st_session *hs = NULL;
        if (st_session_create(head, &sp, &hs) != ST_OK)
            abort();
        static float feat[3 * 64], logits[512];
        const int32_t tok = 7, pos = 0, seq = 0, npre = 1;
        st_fwd f = {.n = 1,
                    .tokens = &tok,
                    .pos = &pos,
                    .seq = &seq,
                    .kv_row = &pos,
                    .n_prefix = &npre,
                    .features = feat,
                    .logits = logits};
        if (st_forward(hs, &f) != ST_OK)
            abort();
        st_session_free(hs);
    }
    st_model_free(head);
}
