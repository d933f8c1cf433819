/*
 * stop.c: the stop strings of `spectree serve` (api.h): the valid UTF-8 prefix of generated
 * text, and the matcher that holds back text that could still become a stop string.
 */
#define _POSIX_C_SOURCE 200809L
#include "api.h"

#include <stdlib.h>
#include <string.h>

size_t srv_utf8_valid_prefix(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80)
            k = 1;
        else if (c >= 0xC2 && c <= 0xDF)
            k = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 3;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 4;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else
            return i;
        if (i + k > n)
            return i;
        for (size_t j = 1; j < k; j++) {
            unsigned b = s[i + j];
            if (b < (j == 1 ? lo : 0x80) || b > (j == 1 ? hi : 0xBF))
                return i;
        }
        i += k;
    }
    return n;
}

int srv_stop_add(srv_stopper *s, const char *txt, size_t n, int final, const char **out_ptr,
                 size_t *out_len) {
    *out_ptr = ""; /* never NULL, even before anything is held */
    *out_len = 0;
    if (s->stopped)
        return 0;
    if (s->n_drop) {
        memmove(s->hold, s->hold + s->n_drop, s->n_hold - s->n_drop);
        s->n_hold -= s->n_drop;
        s->n_drop = 0;
    }
    if (s->n_hold + n > s->cap) {
        size_t cap = (s->n_hold + n) * 2 + 64;
        char *h = realloc(s->hold, cap);
        if (!h)
            return -1;
        s->hold = h;
        s->cap = cap;
    }
    if (n)
        memcpy(s->hold + s->n_hold, txt, n);
    s->n_hold += n;
    s->n_in += n;
    const size_t at = s->n_in - s->n_hold; /* hold[0]'s place in the text */
    *out_ptr = s->hold ? s->hold : "";
    size_t cut = s->n_hold; /* bytes safe to release */
    size_t first = SIZE_MAX;
    for (int i = 0; i < s->n_stops; i++) {
        const char *st = s->stops[i];
        size_t ls = strlen(st);
        for (size_t j = 0; j + ls <= s->n_hold && j < first; j++)
            if (memcmp(s->hold + j, st, ls) == 0 && at + j + ls > s->min_end) {
                first = j;
                s->matched = i;
                break;
            }
    }
    if (first != SIZE_MAX) {
        s->stopped = 1;
        *out_len = first;
        s->n_drop = s->n_hold;
        return 0;
    }
    if (!final)
        for (int i = 0; i < s->n_stops; i++) {
            const char *st = s->stops[i];
            size_t ls = strlen(st);
            for (size_t k = ls - 1; k > 0; k--) /* longest suffix that starts the stop string */
                if (k <= s->n_hold && memcmp(s->hold + s->n_hold - k, st, k) == 0) {
                    if (s->n_hold - k < cut)
                        cut = s->n_hold - k;
                    break;
                }
        }
    *out_len = cut;
    s->n_drop = cut;
    return 0;
}

void srv_stopper_free(srv_stopper *s) {
    if (!s)
        return;
    free(s->hold);
    s->hold = NULL;
    s->n_hold = s->cap = s->n_drop = 0;
}
