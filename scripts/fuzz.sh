#!/usr/bin/env bash
# Runs the libFuzzer targets (tests/fuzz/fuzz_*.c) for a bounded time each, built with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer in build-fuzz/. Each starts from its corpus in
# build-fuzz/corpus/<target> (kept between runs, so coverage accumulates) plus seeds made here:
# the bundled GGUF files, small models written by spectree-mkmodel, the tokenizer test inputs,
# the TinyStories-656K safetensors checkpoint and tokenizer.json (and synthetic byte-level ones),
# the EAGLE-3 heads the tests wrote and the committed one.
# A crash, leak, sanitizer report or an input slower than 30 s fails the run; the input is kept
# in build-fuzz/crashes/. The targets run side by side.
# Usage: scripts/fuzz.sh [SECONDS]   (default 60, or $ST_FUZZ_SECONDS)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${ST_FUZZ_SECONDS:-60}}
jobs=$(nproc)
out=build-fuzz

CC=clang cmake -S . -B $out -DCMAKE_BUILD_TYPE=RelWithDebInfo -DST_FUZZ=ON -DST_SANITIZE=ON \
    -DST_WERROR=ON >/dev/null
cmake --build $out -j"$jobs" --target fuzz_gguf fuzz_tokenize fuzz_safetensors \
    fuzz_serve_request fuzz_hf_tokenizer fuzz_eagle3 fuzz_grammar >/dev/null

rm -rf $out/seeds
mkdir -p $out/seeds/gguf $out/seeds/tokenize $out/seeds/safetensors $out/corpus/gguf \
    $out/corpus/tokenize $out/corpus/safetensors $out/crashes $out/seeds/serve_request \
    $out/corpus/serve_request $out/seeds/hf_tokenizer $out/corpus/hf_tokenizer $out/seeds/eagle3 \
    $out/corpus/eagle3 $out/seeds/grammar $out/corpus/grammar
cp models/stories260K.gguf tests/data/tokenizer/*.gguf $out/seeds/gguf/
head -c 4096 models/stories260K.gguf >$out/seeds/gguf/stories260K-head.gguf
if [ -x build/spectree-mkmodel ]; then # small whole models, one per weight type
    for t in f32 f16 bf16 q8_0 q4_0; do
        build/spectree-mkmodel $out/seeds/gguf/tiny-$t.gguf --vocab models/stories260K.gguf \
            --dim 32 --ff 64 --layers 1 --heads 4 --kv-heads 2 --type $t --ctx 64 >/dev/null 2>&1
    done
fi
cp tests/data/tokenizer/*.inp $out/seeds/tokenize/
st=$(ls models/TinyStories-656K/*.safetensors | head -1)
cp "$st" $out/seeds/safetensors/model.safetensors
head -c 16384 "$st" >$out/seeds/safetensors/model-head.safetensors
for d in build/test_e2e_eagle3_f32 build/test_e2e_eagle3_f16 models/eagle3-stories260K; do
    [ ! -f $d/model.safetensors ] || cp $d/model.safetensors $out/seeds/eagle3/$(basename $d).safetensors
done
cp $out/seeds/safetensors/model-head.safetensors $out/seeds/eagle3/
cp README.md $out/seeds/tokenize/
cp models/TinyStories-656K/tokenizer.json $out/seeds/hf_tokenizer/tinystories.json
for pre in llama3 qwen2; do # small byte-level tokenizer.json files (tests/oracle/hf_bpe.py)
    /usr/bin/python3 tests/oracle/hf_bpe.py mkbytelevel $out/seeds/hf_tokenizer/$pre $pre
    mv $out/seeds/hf_tokenizer/$pre/tokenizer.json $out/seeds/hf_tokenizer/$pre.json
    rm -rf $out/seeds/hf_tokenizer/$pre
done

# Grammars (first byte 0: GBNF, a NUL, a subject) and JSON schemas (first byte 1).
printf '0root ::= "a" [0-9]+ ("x" | "yz")? # c\n\0a12yz' >$out/seeds/grammar/g1
printf '0root ::= list\nlist ::= "(" list ")" list | ""\n\0(()())' >$out/seeds/grammar/g2
printf '0root ::= [^"\\\\]{2,4} . [a-z]*\n\0ab\xce\xb1' >$out/seeds/grammar/g3
printf '1{"type":"object","properties":{"a":{"type":"array","items":{"enum":[1,"x"]},"maxItems":3},"b":{"type":"string","pattern":"^[a-z]{1,4}(x|y)?$"}},"required":["a"]}' >$out/seeds/grammar/s1
printf '1{"$defs":{"n":{"anyOf":[{"type":"integer"},{"type":"array","items":{"$ref":"#/$defs/n"}}]}},"$ref":"#/$defs/n"}' >$out/seeds/grammar/s2

# Texts past 4 KiB add little to the tokenizers' coverage and slow each run down.
# HTTP bodies: the first byte picks the endpoint (even: completions, odd: chat).
for f in tests/serve/bodies/*.json; do
    printf '0' | cat - "$f" >$out/seeds/serve_request/c-$(basename "$f")
    printf '1' | cat - "$f" >$out/seeds/serve_request/h-$(basename "$f")
done

declare -A max_len=([gguf]=0 [tokenize]=4096 [safetensors]=65536 [serve_request]=8192
    [hf_tokenizer]=131072 [eagle3]=0 [grammar]=4096)
pids=()
for t in gguf tokenize safetensors serve_request hf_tokenizer eagle3 grammar; do
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        $out/fuzz_$t -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 -print_final_stats=1 \
        -max_len=${max_len[$t]} -artifact_prefix=$out/crashes/$t- $out/corpus/$t $out/seeds/$t \
        >$out/fuzz_$t.log 2>&1 &
    pids+=($!)
done
rc=0
i=0
for t in gguf tokenize safetensors serve_request hf_tokenizer eagle3 grammar; do
    if wait "${pids[$i]}"; then
        echo "fuzz_$t: $(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' $out/fuzz_$t.log |
            grep -o '[0-9]*$') runs in ${secs}s, corpus $(ls $out/corpus/$t | wc -l) inputs"
    else
        echo "fuzz_$t FAILED (input kept in $out/crashes/); the end of its log:" >&2
        tail -n 40 $out/fuzz_$t.log >&2
        rc=1
    fi
    i=$((i + 1))
done
exit $rc
