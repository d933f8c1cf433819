// openai_nbest.mjs: n, best_of and echo through the official openai npm package: seeded n=3
// completions and n=2 chat give the same choices from a plain server (SPECTREE_PLAIN_URL) and a
// speculating one (SPECTREE_SPEC_URL); streamed choices arrive by index; best_of=3, n=1 is the
// choice of n=3 with the highest cumulative log-probability; echo with logprobs returns the
// prompt's tokens, the first with a null logprob; the limits are a BadRequestError (400) naming
// the field. Run by test_serve_nbest.py; exits non-zero on the first failed check.
import OpenAI from "openai";

const model = process.env.SPECTREE_MODEL;
const plain = new OpenAI({ baseURL: process.env.SPECTREE_PLAIN_URL, apiKey: "x", maxRetries: 0 });
const spec = new OpenAI({ baseURL: process.env.SPECTREE_SPEC_URL, apiKey: "x", maxRetries: 0 });

function check(cond, what) {
  if (!cond) {
    console.error("openai client check failed: " + what);
    process.exit(1);
  }
}

const prompt = "Once upon a time";
const body = { model, prompt, max_tokens: 24, temperature: 1, seed: 9, n: 3 };
const a = await plain.completions.create(body);
const b = await spec.completions.create(body);
const texts = (r) => r.choices.map((c) => c.text);
check(a.choices.length === 3, `n=3 gave ${a.choices.length} choices`);
check(JSON.stringify(texts(a)) === JSON.stringify(texts(b)), "n=3: spec differs");
check(new Set(texts(a)).size === 3, `n=3 choices not all different: ${texts(a)}`);
check(a.usage.prompt_tokens === 5 && a.usage.completion_tokens === 72, "n=3 usage");

const streamed = ["", "", ""];
for await (const chunk of await spec.completions.create({ ...body, stream: true }))
  for (const c of chunk.choices) streamed[c.index] += c.text;
check(JSON.stringify(streamed) === JSON.stringify(texts(a)), "streamed n=3 differs");

const chat = { model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 20,
  temperature: 0.9, seed: 2, n: 2 };
const c = await plain.chat.completions.create(chat);
const d = await spec.chat.completions.create(chat);
const contents = (r) => r.choices.map((x) => x.message.content);
check(JSON.stringify(contents(c)) === JSON.stringify(contents(d)), "chat n=2: spec differs");
const deltas = ["", ""];
for await (const chunk of await spec.chat.completions.create({ ...chat, stream: true }))
  for (const x of chunk.choices) deltas[x.index] += x.delta.content || "";
check(JSON.stringify(deltas) === JSON.stringify(contents(c)), "streamed chat n=2 differs");

const three = await plain.completions.create({ ...body, logprobs: 0 });
const score = (x) => x.logprobs.token_logprobs.reduce((s, v) => s + v, 0);
const best = three.choices.reduce((p, x) => (score(x) > score(p) ? x : p));
const bo = await spec.completions.create({ ...body, n: 1, best_of: 3 });
check(bo.choices.length === 1 && bo.choices[0].text === best.text, "best_of=3 is not the best");

const echo = await spec.completions.create({ model, prompt, max_tokens: 0, echo: true,
  logprobs: 1 });
const lp = echo.choices[0].logprobs;
check(echo.choices[0].text === prompt, `echo text ${echo.choices[0].text}`);
check(lp.token_logprobs[0] === null && lp.token_logprobs.slice(1).every((v) => v <= 0),
  "echo logprobs");
check(lp.tokens.join("") === prompt, "echo tokens");

for (const [field, value] of [["n", 17], ["best_of", 1]]) {
  try {
    await spec.completions.create({ model, prompt, max_tokens: 4, n: 2, [field]: value });
    check(false, `${field}: no error`);
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, `${field}: ${e}`);
    check(e.param === field, `${field}: the error names ${e.param}`);
  }
}
console.log("openai npm client: n, best_of and echo equal with and without speculation");
