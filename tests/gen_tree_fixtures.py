"""gen_tree_fixtures.py: random draft trees run through the pure-Python oracle
docs/tree_ref.py (organize, build_tree, full_mask_flat, verify_greedy, tree_sample), written
as a text fixture that tests/test_tree_verify.c compares the C implementation against.

usage: gen_tree_fixtures.py DOCS_DIR OUT_FILE [SEED] [N_CASES]

Every number is exact in float32 (scores, probabilities and coins are dyadic with small
denominators), so the oracle's double arithmetic and the C code agree bit for bit. tree_sample
lives inside tree_ref.py's __main__ block; it is lifted out with ast so the oracle stays the single
source of truth. File format: "fixtures <n>", then per case "case <id> <valid|malformed> <bs>
<topk> <depth> <n> <vocab>" followed by lines "<name> <count> <values...>" in a fixed order.
"""
import ast
import itertools
import os
import random
import struct
import sys


def load_oracle(docs):
    path = os.path.join(docs, "tree_ref.py")
    sys.path.insert(0, os.path.dirname(path))
    import tree_ref  # noqa: E402

    with open(path) as f:
        src = f.read()
    fn = next(node for node in ast.walk(ast.parse(src))
              if isinstance(node, ast.FunctionDef) and node.name == "tree_sample")
    ns = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), ns)
    return tree_ref, ns["tree_sample"]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


# Child probabilities of the simulated drafter: dyadic so that products stay exact in float32.
PROBS = [1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]


def simulate_draft(rng, bs, k, s, vocab):
    """SGLang's select_top_k_tokens (TREE_SPEC 1.2) over random child probabilities: returns
    score_list, token_list, parents_list in tree_ref's nested-list layout."""
    score_list, token_list, parents_list = [], [], []
    scores_prev = []
    for b in range(bs):
        top = sorted((rng.choice(PROBS) for _ in range(k)), reverse=True)
        scores_prev.append(top)
    score_list.append([[list(scores_prev[b])] for b in range(bs)])
    token_list.append([[rng.randrange(vocab) for _ in range(k)] for b in range(bs)])
    parents_list.append([[-1] + list(range(k)) for _ in range(bs)])
    for i in range(1, s):
        lvl_scores, lvl_tokens, lvl_parents = [], [], []
        for b in range(bs):
            expand = []
            for p in range(k):
                child = sorted((rng.choice(PROBS) for _ in range(k)), reverse=True)
                expand.append([f32(scores_prev[b][p] * c) for c in child])
            flat = [x for row in expand for x in row]
            order = sorted(range(k * k), key=lambda g: (-flat[g], g))[:k]
            scores_prev[b] = [flat[g] for g in order]
            lvl_scores.append(expand)
            lvl_tokens.append([rng.randrange(vocab) for _ in range(k * k)])
            lvl_parents.append([g + k * k * (i - 1) + k for g in order])
        score_list.append(lvl_scores)
        token_list.append(lvl_tokens)
        parents_list.append(lvl_parents)
    return score_list, token_list, parents_list


def malformed_tree(rng, bs, k, s, n, vocab):
    """Arbitrary top_scores_index (unsorted, duplicates) and parent_list values: valid candidate
    indices, indices of selected nodes (cycles), and garbage that matches nothing."""
    m = k + (s - 1) * k * k
    pw = k * (s - 1) + 1 if s > 1 else 0
    sel, drafts, plist = [], [], []
    for b in range(bs):
        style = rng.random()
        if style < 0.4:
            row = sorted(rng.sample(range(m), n - 1))
        else:
            row = [rng.randrange(m) for _ in range(n - 1)]
        sel.append(row)
        drafts.append([rng.randrange(vocab) for _ in range(n - 1)])
        pl = []
        for _ in range(pw):
            r = rng.random()
            if r < 0.45 and row:
                pl.append(rng.choice(row))
            elif r < 0.8:
                pl.append(rng.randrange(m))
            else:
                pl.append(rng.choice([-1, 99, m, 10**6, -7]))
        plist.append(pl)
    return plist, sel, drafts


def seq_len(rng):
    r = rng.random()
    if r < 0.15:
        return 0
    if r < 0.85:
        return rng.randrange(1, 40)
    if r < 0.97:
        return rng.randrange(40, 400)
    return rng.randrange(400, 3000)


def rle(values):
    out = []
    for v, grp in itertools.groupby(values):
        out += [1 if v else 0, sum(1 for _ in grp)]
    return out


def distribution(rng, vocab, favoured):
    """Target probabilities as counts out of 1024 (exact), mass leaning to `favoured` tokens."""
    r = rng.random()
    if r < 0.03:
        return [0] * vocab  # no positive mass at all: exercises the V-1 fallback
    w = [rng.choice([0, 0, 1, 2, 3]) for _ in range(vocab)]
    for t in favoured:
        w[t] += rng.choice([0, 4, 8, 16])
    if sum(w) == 0:
        w[rng.randrange(vocab)] = 1
    total = 1024 if r > 0.1 else rng.randrange(1, 1024)  # sometimes not normalised
    counts = [total * x // sum(w) for x in w]
    counts[max(range(vocab), key=lambda v: w[v])] += total - sum(counts)
    return counts


def children(rnt, rns, x):
    out, c = [], rnt[x]
    while c != -1:
        out.append(c)
        c = rns[c]
    return out


def gen_case(rng, ref, tree_sample, cid, out):
    malformed = rng.random() < 0.3
    bs = rng.randint(1, 8)
    k = rng.randint(1, 8)
    s = rng.randint(1, 8)
    m = k + (s - 1) * k * k
    n = rng.randint(1, min(64, m + 1))
    if rng.random() < 0.5:
        n = rng.randint(1, min(16, m + 1))  # keep the average case small and fast
    vocab = rng.randint(2, 12)
    L = [seq_len(rng) for _ in range(bs)]
    if bs * n * sum(L) > 300000:  # bound the oracle's full mask size
        L = [min(x, 40) for x in L]
    roots = [rng.randrange(vocab) for _ in range(bs)]
    lines = ["case %d %s %d %d %d %d %d" % (cid, "malformed" if malformed else "valid", bs, k, s,
                                            n, vocab)]

    def emit(name, values):
        lines.append("%s %d %s" % (name, len(values), " ".join(str(v) for v in values)))

    emit("L", L)
    emit("root", roots)
    if malformed:
        parents, sel, drafts = malformed_tree(rng, bs, k, s, n, vocab)
        emit("sel", [g for row in sel for g in row])
        emit("drafts", [t for row in drafts for t in row])
        emit("plist", [p for row in parents for p in row])
    else:
        score_list, token_list, parents_list = simulate_draft(rng, bs, k, s, vocab)
        parents, sel, drafts = ref.organize(score_list, token_list, parents_list, n)
        emit("scores", [repr(x) for b in range(bs) for lvl in score_list for x in ref.flatten(lvl[b])])
        emit("tokens", [t for b in range(bs) for lvl in token_list for t in lvl[b]])
        emit("lparents", [p for b in range(bs) for lvl in parents_list for p in lvl[b]])
        emit("sel", [g for row in sel for g in row])
        emit("drafts", [t for row in drafts for t in row])
        emit("plist", [p for row in parents for p in row])

    pos, ri, rnt, rns, mask = ref.build_tree(parents, sel, L, k, s, n)
    emit("pos", pos)
    emit("ri", [x for row in ri for x in row])
    emit("rnt", [x for row in rnt for x in row])
    emit("rns", [x for row in rns for x in row])
    emit("bits", [sum(1 << j for j in range(n) if mask[b][t][j]) for b in range(bs)
                  for t in range(n)])
    emit("fullon", rle(ref.full_mask_flat(mask, L, n, True)))
    emit("fulloff", rle(ref.full_mask_flat(mask, L, n, False)))

    cand = [[roots[b]] + drafts[b] for b in range(bs)]
    # Greedy: the target mostly agrees with one of the children, so paths get accepted.
    tp = []
    for b in range(bs):
        for x in range(n):
            ch = children(rnt[b], rns[b], x)
            if ch and rng.random() < 0.75:
                tp.append(cand[b][rng.choice(ch)])
            else:
                tp.append(rng.randrange(vocab))
    emit("tp", tp)
    p, a, num = ref.verify_greedy(cand, ri, rnt, rns, tp, s + 1, n)
    emit("gpred", p)
    emit("gacc", [x for row in a for x in row])
    emit("gnum", num)

    counts = [[distribution(rng, vocab, [cand[b][c] for c in children(rnt[b], rns[b], x)])
               for x in range(n)] for b in range(bs)]
    q = [[[c / 1024 for c in row] for row in counts[b]] for b in range(bs)]
    coins = [[(rng.randrange(1024) * 4 if rng.random() < 0.5 else rng.randrange(4096)) / 4096
              for _ in range(n)] for _ in range(bs)]
    cfinal = [rng.randrange(4096) / 4096 for _ in range(bs)]
    th_single, th_acc = rng.choice([(1.0, 1.0), (1.0, 1.0), (0.0, 0.0), (0.5, 0.5), (0.25, 1.0),
                                    (1.0, 0.5), (0.75, 0.25), (1.0, 0.75)])
    p0 = [[[0.0] * vocab for _ in range(n)] for _ in range(bs)]
    sp, sa, sn = tree_sample(cand, ri, rnt, rns, coins, cfinal, q, p0, s + 1, n, th_single,
                             th_acc)
    emit("probs", [c for b in range(bs) for row in counts[b] for c in row])
    emit("coins", [int(c * 4096) for row in coins for c in row])
    emit("cfinal", [int(c * 4096) for c in cfinal])
    emit("th", [repr(th_single), repr(th_acc)])
    emit("spred", sp)
    emit("sacc", [x for row in sa for x in row])
    emit("snum", sn)
    out.write("\n".join(lines) + "\n")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    docs, path = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    n_cases = int(sys.argv[4]) if len(sys.argv) > 4 else 3000
    ref, tree_sample = load_oracle(docs)
    rng = random.Random(seed)
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        out.write("fixtures %d\n" % n_cases)
        for cid in range(n_cases):
            gen_case(rng, ref, tree_sample, cid, out)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
