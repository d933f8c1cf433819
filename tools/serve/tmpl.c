/*
 * tmpl.c: the chat templates of `spectree serve` and `spectree chat` (api.h): each family's
 * template recognized from the Jinja text by the markers only it writes, and rendered as its
 * Hugging Face template renders a list of messages with add_generation_prompt, written out by
 * hand (no Jinja engine): text pieces and special tokens as ids.
 */
#include "api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* Chat template names and detection                                                         */

static const struct {
    const char *name;
    srv_tmpl t;
} tmpl_names[] = {
    {"llama-2", SRV_TMPL_LLAMA2},  {"llama2", SRV_TMPL_LLAMA2}, {"llama-3", SRV_TMPL_LLAMA3},
    {"llama3", SRV_TMPL_LLAMA3},   {"chatml", SRV_TMPL_CHATML}, {"zephyr", SRV_TMPL_ZEPHYR},
    {"mistral", SRV_TMPL_MISTRAL},
};

int srv_tmpl_parse(const char *name, srv_tmpl *out) {
    for (size_t i = 0; i < sizeof tmpl_names / sizeof tmpl_names[0]; i++)
        if (!strcmp(name, tmpl_names[i].name)) {
            *out = tmpl_names[i].t;
            return 0;
        }
    return -1;
}

const char *srv_tmpl_name(srv_tmpl t) {
    switch (t) {
    case SRV_TMPL_LLAMA2:
        return "llama-2";
    case SRV_TMPL_LLAMA3:
        return "llama-3";
    case SRV_TMPL_CHATML:
        return "chatml";
    case SRV_TMPL_ZEPHYR:
        return "zephyr";
    case SRV_TMPL_MISTRAL:
        return "mistral";
    default:
        return "none";
    }
}

static int has(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, k) == 0)
            return 1;
    return 0;
}

/* Each family's template names its own markers: Llama 3 its header tokens, ChatML (Qwen, Yi,
 * OpenHermes) <|im_start|>, Zephyr its <|user|> turn marker, Llama 2 the [INST] turns with the
 * <<SYS>> block, Mistral [INST] turns without one. */
srv_tmpl srv_tmpl_detect(const char *s, size_t n) {
    if (!s)
        return SRV_TMPL_NONE;
    if (has(s, n, "<|start_header_id|>") && has(s, n, "<|eot_id|>"))
        return SRV_TMPL_LLAMA3;
    if (has(s, n, "<|im_start|>"))
        return SRV_TMPL_CHATML;
    if (has(s, n, "<|user|>") && has(s, n, "<|assistant|>"))
        return SRV_TMPL_ZEPHYR;
    if (has(s, n, "[INST]") && has(s, n, "<<SYS>>"))
        return SRV_TMPL_LLAMA2;
    if (has(s, n, "[INST]"))
        return SRV_TMPL_MISTRAL;
    return SRV_TMPL_NONE;
}

/* ---------------------------------------------------------------------------------------- */
/* Chat rendering                                                                            */

static int32_t find_piece(const st_tokenizer *tok, const char *piece) {
    int32_t n = st_tokenizer_n_vocab(tok);
    size_t k = strlen(piece);
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        const char *p = st_tokenizer_piece(tok, i, &len);
        if (p && len == k && !memcmp(p, piece, k))
            return i;
    }
    return -1;
}

void srv_specials_find(const st_tokenizer *tok, srv_specials *out) {
    out->bos = st_tokenizer_bos(tok);
    out->eos = st_tokenizer_eos(tok);
    out->im_start = find_piece(tok, "<|im_start|>");
    out->im_end = find_piece(tok, "<|im_end|>");
    out->start_header = find_piece(tok, "<|start_header_id|>");
    out->end_header = find_piece(tok, "<|end_header_id|>");
    out->eot = find_piece(tok, "<|eot_id|>");
}

/* Appends a segment; -1 if there is no memory for it. */
static int push_seg(srv_rendered *r, srv_seg g) {
    if (r->n_segs == r->cap_segs) {
        int cap = r->cap_segs ? r->cap_segs * 2 : 16;
        srv_seg *p = realloc(r->segs, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        r->segs = p;
        r->cap_segs = cap;
    }
    r->segs[r->n_segs++] = g;
    return 0;
}

static int put_text(srv_rendered *r, const char *s, size_t n) {
    if (n == 0)
        return 0;
    if (r->n_text + n + 1 > r->cap_text) {
        size_t cap = (r->n_text + n + 1) * 2;
        char *t = realloc(r->text, cap);
        if (!t)
            return -1;
        r->text = t;
        r->cap_text = cap;
    }
    if (r->n_segs > 0 && r->segs[r->n_segs - 1].special < 0 &&
        r->segs[r->n_segs - 1].off + r->segs[r->n_segs - 1].len == r->n_text) {
        r->segs[r->n_segs - 1].len += n;
    } else {
        if (push_seg(r, (srv_seg){-1, r->n_text, n}))
            return -1;
    }
    memcpy(r->text + r->n_text, s, n);
    r->n_text += n;
    r->text[r->n_text] = 0;
    return 0;
}

static int put(srv_rendered *r, const char *s) { return put_text(r, s, strlen(s)); }

/* A special token: its id, or its text when the vocabulary lacks it (BOS: nothing). */
static int put_special(srv_rendered *r, int32_t id, const char *text) {
    if (id < 0)
        return text ? put(r, text) : 0;
    if (push_seg(r, (srv_seg){id, r->n_text, 0}))
        return -1;
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Jinja's str.strip() / |trim: without leading and trailing whitespace. */
static int put_stripped(srv_rendered *r, const char *s, size_t n) {
    while (n && is_space(*s))
        s++, n--;
    while (n && is_space(s[n - 1]))
        n--;
    return put_text(r, s, n);
}

static const char *role_name(srv_role r) {
    return r == SRV_ROLE_SYSTEM ? "system"
           : r == SRV_ROLE_USER ? "user"
           : r == SRV_ROLE_TOOL ? "tool"
                                : "assistant";
}

/* A tool message, or an assistant message that calls tools. */
static int tool_turn(const srv_msg *m) { return m->role == SRV_ROLE_TOOL || m->n_calls > 0; }

/* Llama 2 and Mistral: user/assistant turns alternating from a user turn (their templates raise
 * an exception otherwise); an optional leading system message. Mistral's tool turns (calls and
 * results) stand outside the alternation, as its template counts them. */
static int check_alternating(const srv_msg *m, int n, int first, char *err) {
    if (first >= n) {
        snprintf(err, SRV_ERR_CAP, "the conversation needs a user message");
        return -1;
    }
    for (int i = first, k = 0; i < n; i++) {
        if (tool_turn(&m[i]))
            continue;
        srv_role want = k++ % 2 == 0 ? SRV_ROLE_USER : SRV_ROLE_ASSISTANT;
        if (m[i].role != want) {
            snprintf(err, SRV_ERR_CAP,
                     "this model's chat template needs user and assistant messages alternating "
                     "from a user message (one optional system message first): messages[%d] is "
                     "%s",
                     i, role_name(m[i].role));
            return -1;
        }
    }
    if (m[n - 1].role != SRV_ROLE_USER && m[n - 1].role != SRV_ROLE_TOOL) {
        snprintf(err, SRV_ERR_CAP, "the last message must be a user (or tool) message");
        return -1;
    }
    return 0;
}

static int render_llama2(const srv_msg *m, int n, const srv_specials *sp, srv_rendered *r,
                         char *err) {
    int first = n > 0 && m[0].role == SRV_ROLE_SYSTEM;
    if (check_alternating(m, n, first, err))
        return -1;
    int rc = 0;
    for (int i = first; i < n && !rc; i++) {
        if (m[i].role == SRV_ROLE_USER) {
            rc |= put_special(r, sp->bos, NULL);
            rc |= put(r, "[INST] ");
            /* content.strip() of "<<SYS>>\nS\n<</SYS>>\n\nU" strips only its outer ends:
             * the system text stays as it is, the user text loses trailing blanks */
            if (i == first && first) {
                rc |= put(r, "<<SYS>>\n");
                rc |= put_text(r, m[0].content, m[0].len);
                rc |= put(r, "\n<</SYS>>\n\n");
                size_t n1 = m[i].len;
                while (n1 && is_space(m[i].content[n1 - 1]))
                    n1--;
                rc |= put_text(r, m[i].content, n1);
            } else {
                rc |= put_stripped(r, m[i].content, m[i].len);
            }
            rc |= put(r, " [/INST]");
        } else {
            rc |= put(r, " ");
            rc |= put_stripped(r, m[i].content, m[i].len);
            rc |= put(r, " ");
            rc |= put_special(r, sp->eos, "</s>");
        }
    }
    r->has_bos = sp->bos >= 0;
    return rc;
}

/* Mistral-7B-Instruct's template; a system message (which v0.1's template refuses) is put
 * before the first user message's text, separated by a blank line, as v0.2+ templates do. */
static int render_mistral(const srv_msg *m, int n, const srv_tool *tools, int n_tools,
                          const srv_specials *sp, srv_rendered *r, char *err) {
    int first = n > 0 && m[0].role == SRV_ROLE_SYSTEM;
    if (check_alternating(m, n, first, err))
        return -1;
    int last_user = n - 1;
    while (last_user >= 0 && m[last_user].role != SRV_ROLE_USER)
        last_user--;
    int rc = put_special(r, sp->bos, NULL);
    for (int i = first; i < n && !rc; i++) {
        if (m[i].role == SRV_ROLE_TOOL) { /* v0.3's results, with the call's id */
            rc |= put(r, "[TOOL_RESULTS] {\"content\": ");
            rc |= put_text(r, m[i].content, m[i].len);
            rc |= put(r, ", \"call_id\": \"");
            rc |= put(r, m[i].call_id ? m[i].call_id : "");
            rc |= put(r, "\"}[/TOOL_RESULTS]");
        } else if (m[i].n_calls) {
            rc |= put(r, "[TOOL_CALLS] [");
            for (int c = 0; c < m[i].n_calls; c++) {
                rc |= put(r, c ? ", {\"name\": \"" : "{\"name\": \"");
                rc |= put(r, m[i].calls[c].name);
                rc |= put(r, "\", \"arguments\": ");
                rc |= put(r, m[i].calls[c].args);
                rc |= put(r, ", \"id\": \"");
                rc |= put(r, m[i].calls[c].id);
                rc |= put(r, "\"}");
            }
            rc |= put(r, "]");
            rc |= put_special(r, sp->eos, "</s>");
        } else if (m[i].role == SRV_ROLE_USER) {
            if (n_tools && i == last_user) { /* the tools, before the last user message */
                rc |= put(r, "[AVAILABLE_TOOLS] [");
                for (int t = 0; t < n_tools; t++) {
                    rc |= put(r, t ? ", " : "");
                    rc |= put(r, tools[t].mistral);
                }
                rc |= put(r, "][/AVAILABLE_TOOLS]");
            }
            rc |= put(r, "[INST] ");
            if (i == first && first) {
                rc |= put_text(r, m[0].content, m[0].len);
                rc |= put(r, "\n\n");
            }
            rc |= put_text(r, m[i].content, m[i].len);
            rc |= put(r, " [/INST]");
        } else {
            rc |= put_text(r, m[i].content, m[i].len);
            rc |= put_special(r, sp->eos, "</s>");
        }
    }
    r->has_bos = sp->bos >= 0;
    return rc;
}

static int header(srv_rendered *r, const srv_specials *sp, const char *role) {
    int rc = put_special(r, sp->start_header, "<|start_header_id|>");
    rc |= put(r, role);
    rc |= put_special(r, sp->end_header, "<|end_header_id|>");
    rc |= put(r, "\n\n");
    return rc;
}

/* Llama 3.1's tool calling (its template with tools_in_user_message, the default): a system
 * turn with "Environment: ipython" and its dates, the functions as JSON (indent 4) in the first
 * user message; a call as {"name": ..., "parameters": ...}, one per assistant message; results
 * in "ipython" turns. */
static int llama3_tools(const srv_msg *m, int n, const srv_tool *tools, int n_tools,
                        const srv_specials *sp, srv_rendered *r, int *next, char *err) {
    int i = n > 0 && m[0].role == SRV_ROLE_SYSTEM;
    if (i >= n || m[i].role != SRV_ROLE_USER) {
        snprintf(err, SRV_ERR_CAP,
                 "the llama-3 template puts the tools in the first user "
                 "message: messages[%d] must be a user message",
                 i);
        return -1;
    }
    int rc = header(r, sp, "system");
    rc |= put(r, "Environment: ipython\nCutting Knowledge Date: December 2023\n"
                 "Today Date: 26 Jul 2024\n\n");
    if (i)
        rc |= put_stripped(r, m[0].content, m[0].len);
    rc |= put_special(r, sp->eot, "<|eot_id|>");
    rc |= header(r, sp, "user");
    rc |= put(r, "Given the following functions, please respond with a JSON for a function call "
                 "with its proper arguments that best answers the given prompt.\n\n"
                 "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
                 "argument name and its value}.Do not use variables.\n\n");
    for (int t = 0; t < n_tools; t++) {
        rc |= put(r, tools[t].json4);
        rc |= put(r, "\n\n");
    }
    rc |= put_stripped(r, m[i].content, m[i].len);
    rc |= put_special(r, sp->eot, "<|eot_id|>");
    *next = i + 1;
    return rc;
}

static int render_llama3(const srv_msg *m, int n, const srv_tool *tools, int n_tools,
                         const srv_specials *sp, srv_rendered *r, char *err) {
    int rc = put_special(r, sp->bos, NULL), i = 0;
    if (n_tools && llama3_tools(m, n, tools, n_tools, sp, r, &i, err))
        return -1;
    for (; i < n && !rc; i++) {
        if (m[i].n_calls) {
            if (m[i].n_calls != 1) {
                snprintf(err, SRV_ERR_CAP,
                         "the llama-3 template takes one tool call per "
                         "assistant message: messages[%d] has %d",
                         i, m[i].n_calls);
                return -1;
            }
            rc |= header(r, sp, "assistant");
            rc |= put(r, "{\"name\": \"");
            rc |= put(r, m[i].calls[0].name);
            rc |= put(r, "\", \"parameters\": ");
            rc |= put(r, m[i].calls[0].args);
            rc |= put(r, "}");
        } else if (m[i].role == SRV_ROLE_TOOL) {
            rc |= header(r, sp, "ipython");
            rc |= put_text(r, m[i].content, m[i].len);
        } else {
            rc |= header(r, sp, role_name(m[i].role));
            rc |= put_stripped(r, m[i].content, m[i].len);
        }
        rc |= put_special(r, sp->eot, "<|eot_id|>");
    }
    rc |= put_special(r, sp->start_header, "<|start_header_id|>");
    rc |= put(r, "assistant");
    rc |= put_special(r, sp->end_header, "<|end_header_id|>");
    rc |= put(r, "\n\n");
    r->has_bos = sp->bos >= 0;
    return rc;
}

/* Qwen 2.5's tool calling: the functions (tojson, one a line) in <tools></tools> at the end of
 * the system turn; calls as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> lines in
 * the assistant turn; consecutive results as <tool_response> blocks in one user turn. */
static int chatml_tools(const srv_msg *m, int n, const srv_tool *tools, int n_tools,
                        const srv_specials *sp, srv_rendered *r) {
    int rc = put_special(r, sp->im_start, "<|im_start|>");
    rc |= put(r, "system\n");
    if (n > 0 && m[0].role == SRV_ROLE_SYSTEM) {
        rc |= put_text(r, m[0].content, m[0].len);
        rc |= put(r, "\n\n");
    }
    rc |= put(r, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n"
                 "<tools>");
    for (int t = 0; t < n_tools; t++) {
        rc |= put(r, "\n");
        rc |= put(r, tools[t].json);
    }
    rc |= put(r, "\n</tools>\n\nFor each function call, return a json object with function name "
                 "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                 "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>");
    rc |= put_special(r, sp->im_end, "<|im_end|>");
    rc |= put(r, "\n");
    return rc;
}

static int render_chatml(const srv_msg *m, int n, const srv_tool *tools, int n_tools,
                         const srv_specials *sp, srv_rendered *r) {
    int rc = n_tools ? chatml_tools(m, n, tools, n_tools, sp, r) : 0;
    for (int i = n_tools && n > 0 && m[0].role == SRV_ROLE_SYSTEM; i < n && !rc; i++) {
        if (m[i].role == SRV_ROLE_TOOL) {
            if (i == 0 || m[i - 1].role != SRV_ROLE_TOOL) {
                rc |= put_special(r, sp->im_start, "<|im_start|>");
                rc |= put(r, "user");
            }
            rc |= put(r, "\n<tool_response>\n");
            rc |= put_text(r, m[i].content, m[i].len);
            rc |= put(r, "\n</tool_response>");
            if (i == n - 1 || m[i + 1].role != SRV_ROLE_TOOL) {
                rc |= put_special(r, sp->im_end, "<|im_end|>");
                rc |= put(r, "\n");
            }
            continue;
        }
        if (m[i].n_calls) {
            rc |= put_special(r, sp->im_start, "<|im_start|>");
            rc |= put(r, "assistant");
            if (m[i].len) {
                rc |= put(r, "\n");
                rc |= put_text(r, m[i].content, m[i].len);
            }
            for (int c = 0; c < m[i].n_calls; c++) {
                rc |= put(r, "\n<tool_call>\n{\"name\": \"");
                rc |= put(r, m[i].calls[c].name);
                rc |= put(r, "\", \"arguments\": ");
                rc |= put(r, m[i].calls[c].args);
                rc |= put(r, "}\n</tool_call>");
            }
            rc |= put_special(r, sp->im_end, "<|im_end|>");
            rc |= put(r, "\n");
            continue;
        }
        rc |= put_special(r, sp->im_start, "<|im_start|>");
        rc |= put(r, role_name(m[i].role));
        rc |= put(r, "\n");
        rc |= put_text(r, m[i].content, m[i].len);
        rc |= put_special(r, sp->im_end, "<|im_end|>");
        rc |= put(r, "\n");
    }
    rc |= put_special(r, sp->im_start, "<|im_start|>");
    rc |= put(r, "assistant\n");
    return rc;
}

static int render_zephyr(const srv_msg *m, int n, const srv_specials *sp, srv_rendered *r) {
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        rc |= put(r, m[i].role == SRV_ROLE_SYSTEM ? "<|system|>\n"
                     : m[i].role == SRV_ROLE_USER ? "<|user|>\n"
                                                  : "<|assistant|>\n");
        rc |= put_text(r, m[i].content, m[i].len);
        rc |= put_special(r, sp->eos, "</s>");
        rc |= put(r, "\n");
    }
    rc |= put(r, "<|assistant|>\n");
    return rc;
}

int srv_chat_render(srv_tmpl t, const srv_msg *msgs, int n, const srv_specials *sp,
                    srv_rendered *out, char *err) {
    return srv_chat_render_tools(t, msgs, n, NULL, 0, sp, out, err);
}

int srv_chat_render_tools(srv_tmpl t, const srv_msg *msgs, int n, const srv_tool *tools,
                          int n_tools, const srv_specials *sp, srv_rendered *out, char *err) {
    memset(out, 0, sizeof *out);
    int rc, tool_msgs = 0;
    for (int i = 0; i < n; i++)
        tool_msgs |= tool_turn(&msgs[i]);
    if ((t == SRV_TMPL_LLAMA2 || t == SRV_TMPL_ZEPHYR) && (n_tools || tool_msgs)) {
        snprintf(err, SRV_ERR_CAP,
                 "the chat template %s has no tool calling (llama-3, chatml "
                 "and mistral have; choose one with --chat-template)",
                 srv_tmpl_name(t));
        return -1;
    }
    switch (t) {
    case SRV_TMPL_LLAMA2:
        rc = render_llama2(msgs, n, sp, out, err);
        break;
    case SRV_TMPL_MISTRAL:
        rc = render_mistral(msgs, n, tools, n_tools, sp, out, err);
        break;
    case SRV_TMPL_LLAMA3:
        rc = render_llama3(msgs, n, tools, n_tools, sp, out, err);
        break;
    case SRV_TMPL_CHATML:
        rc = render_chatml(msgs, n, tools, n_tools, sp, out);
        break;
    case SRV_TMPL_ZEPHYR:
        rc = render_zephyr(msgs, n, sp, out);
        break;
    default:
        snprintf(err, SRV_ERR_CAP, "no chat template");
        rc = -1;
    }
    if (rc && !err[0])
        snprintf(err, SRV_ERR_CAP, "out of memory");
    if (rc)
        srv_rendered_free(out);
    return rc;
}

void srv_rendered_free(srv_rendered *r) {
    if (!r)
        return;
    free(r->text);
    free(r->segs);
    memset(r, 0, sizeof *r);
}
