/*
 * fuzz_serve_request.c: libFuzzer target for the request side of `spectree serve`
 * (tools/serve/api.c, tmpl.c). The input's first byte picks the endpoint (completions, chat or
 * SGLang's /generate); the rest is the HTTP body. A body that parses must be well-formed (valid
 * UTF-8 strings, ranges kept); a chat request is rendered with every template; the text then runs
 * through the stop-string matcher in pieces, and what it releases must be a prefix of the text.
 * Build: CC=clang cmake -S . -B build-fuzz -DST_FUZZ=ON && cmake --build build-fuzz -t
 * fuzz_serve_request
 */
#include "serve/api.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_stops(const srv_request *r, const char *text, size_t n) {
    srv_stopper s = {.stops = (const char *const *)r->stops, .n_stops = r->n_stops};
    char *out = malloc(n + 1);
    size_t n_out = 0;
    for (size_t i = 0; i <= n && out; i += 3) {
        const char *p;
        size_t len, take = n - i < 3 ? n - i : 3;
        if (srv_stop_add(&s, text + i, take, i + take >= n, &p, &len))
            break;
        if (n_out + len > n || memcmp(text + n_out, p, len) != 0)
            abort(); /* released text must be the text itself, in order */
        memcpy(out + n_out, p, len);
        n_out += len;
        if (s.stopped)
            break;
    }
    if (out && !s.stopped && n_out != n)
        abort(); /* without a stop everything comes out at the end */
    free(out);
    srv_stopper_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const int chat = data[0] & 1, sglang = (data[0] & 2) && !chat;
    srv_request r;
    char err[SRV_ERR_CAP], param[SRV_ERR_CAP];
    if ((sglang ? srv_generate_parse((const char *)data + 1, size - 1, &r, err, param)
                : srv_request_parse((const char *)data + 1, size - 1, chat, &r, err, param)) != 0) {
        if (!err[0])
            abort(); /* a refusal always says why */
        return 0;
    }
    if (r.sp.temp < 0 || r.sp.top_p <= 0 || r.sp.top_p > 1 || r.sp.min_p < 0 || r.sp.min_p > 1)
        abort();
    if (r.top_logprobs < 0 || r.top_logprobs > ST_MAX_TOP_LOGPROBS || r.sglang != sglang)
        abort();
    if (r.prompt) {
        if (srv_utf8_valid_prefix(r.prompt, r.prompt_len) != r.prompt_len)
            abort();
        check_stops(&r, r.prompt, r.prompt_len);
    }
    const srv_specials sp[2] = {{1, 2, -1, -1, -1, -1, -1}, {0, 1, 2, 3, 4, 5, 6}};
    for (int t = SRV_TMPL_LLAMA2; chat && t <= SRV_TMPL_MISTRAL; t++)
        for (int k = 0; k < 2; k++) {
            srv_rendered rd;
            err[0] = 0;
            if (srv_chat_render((srv_tmpl)t, r.msgs, r.n_msgs, &sp[k], &rd, err) == 0) {
                for (int i = 0; i < rd.n_segs; i++)
                    if (rd.segs[i].special < 0 && rd.segs[i].off + rd.segs[i].len > rd.n_text)
                        abort();
                check_stops(&r, rd.text ? rd.text : "", rd.n_text);
                srv_rendered_free(&rd);
            } else if (!err[0]) {
                abort();
            }
        }
    srv_request_free(&r);
    return 0;
}
