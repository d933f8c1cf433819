// openai_client.mjs: drives `spectree serve` with the official openai npm package (as a user's
// program would): models.list, completions and chat (plain and streamed, with usage), the
// neutral fields (accepted, the same answer) and the values refused naming their field,
// logprobs, and the errors the client turns into its exception classes. Run by test_serve.py
// with SPECTREE_URL (".../v1"), SPECTREE_KEY, SPECTREE_MODEL and SPECTREE_WANT (generate's
// greedy 32 tokens of "Once upon a time"). Exits non-zero with a message on the first failed check.
import OpenAI from "openai";

const url = process.env.SPECTREE_URL;
const key = process.env.SPECTREE_KEY;
const model = process.env.SPECTREE_MODEL;
const want = process.env.SPECTREE_WANT;
const client = new OpenAI({ baseURL: url, apiKey: key, maxRetries: 0, timeout: 120000 });

function check(cond, what) {
  if (!cond) {
    console.error("openai client check failed: " + what);
    process.exit(1);
  }
}

async function expectError(fn, cls, status, what) {
  try {
    await fn();
  } catch (e) {
    check(e instanceof cls, `${what}: ${e.constructor.name} is not ${cls.name}`);
    check(e.status === status, `${what}: status ${e.status}, want ${status}`);
    check(typeof e.message === "string" && e.message.length > 0, `${what}: no message`);
    return e;
  }
  check(false, `${what}: no error`);
}

const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === model, "models.list");

const c = await client.completions.create({
  model, prompt: "Once upon a time", max_tokens: 32, temperature: 0,
});
check(c.choices[0].text === want, `completion ${JSON.stringify(c.choices[0].text)} != generate`);
check(c.usage.completion_tokens === 32 && c.usage.prompt_tokens === 5, "completion usage");
check(c.choices[0].finish_reason === "length", "completion finish_reason");

let streamed = "";
let usage = null;
const cs = await client.completions.create({
  model, prompt: "Once upon a time", max_tokens: 32, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
for await (const chunk of cs) {
  if (chunk.choices.length) streamed += chunk.choices[0].text;
  if (chunk.usage) usage = chunk.usage;
}
check(streamed === want, "streamed completion != generate");
check(usage && usage.total_tokens === 37, "streamed completion usage");

const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 24,
  temperature: 0.9, seed: 3,
});
const text = chat.choices[0].message.content;
check(chat.choices[0].message.role === "assistant" && text.length > 0, "chat message");
check(chat.usage.completion_tokens <= 24, "chat usage");

let chatStreamed = "";
let finish = null;
const st = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 24,
  temperature: 0.9, seed: 3, stream: true,
});
for await (const chunk of st) {
  const ch = chunk.choices[0];
  if (ch.delta.content) chatStreamed += ch.delta.content;
  if (ch.finish_reason) finish = ch.finish_reason;
}
check(chatStreamed === text, "streamed chat != chat");
check(finish === chat.choices[0].finish_reason, "streamed chat finish_reason");

// the stream helper of the client library
const runner = client.chat.completions.stream({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 24,
  temperature: 0.9, seed: 3,
});
const final = await runner.finalChatCompletion();
check(final.choices[0].message.content === text, "chat.completions.stream final text");

// fields that leave the answer as it is, as the client sends them: the same text
const neutralChat = {
  user: "u-1", metadata: { team: "a" }, store: false, service_tier: "auto",
  parallel_tool_calls: true, response_format: { type: "text" }, tools: [], tool_choice: "none",
  logit_bias: {}, logprobs: false, n: 1, presence_penalty: 0, frequency_penalty: 0,
  modalities: ["text"],
};
const plainChat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 16,
  temperature: 0,
});
const neutral = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 16,
  temperature: 0, ...neutralChat,
});
check(neutral.choices[0].message.content === plainChat.choices[0].message.content,
  "chat with the neutral fields differs");
let neutralStreamed = "";
let neutralUsage = null;
for await (const chunk of await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 16,
  temperature: 0, stream: true, stream_options: { include_usage: true }, ...neutralChat,
})) {
  if (chunk.choices.length && chunk.choices[0].delta.content)
    neutralStreamed += chunk.choices[0].delta.content;
  if (chunk.usage) neutralUsage = chunk.usage;
}
check(neutralStreamed === plainChat.choices[0].message.content, "streamed neutral chat differs");
check(neutralUsage && neutralUsage.completion_tokens === plainChat.usage.completion_tokens,
  "streamed neutral chat usage");
const neutralCompl = await client.completions.create({
  model, prompt: "Once upon a time", max_tokens: 32, temperature: 0, user: "u", echo: false,
  n: 1, best_of: 1, suffix: null, logit_bias: {}, presence_penalty: 0, frequency_penalty: 0,
});
check(neutralCompl.choices[0].text === want, "completion with the neutral fields differs");
// values that would change the answer and are not implemented, or out of range: 400 naming
// the field
for (const [field, value] of [["n", 17], ["presence_penalty", 2.5], ["logit_bias", { 42: 500 }],
  ["response_format", { type: "xml" }],
  ["tools", [{ type: "function", function: { name: "f", parameters: {} } }]]]) {
  const e = await expectError(() => client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: 4, [field]: value,
  }), OpenAI.BadRequestError, 400, `chat ${field}`);
  check(e.param === field, `chat ${field}: the error names ${e.param}`);
}
for (const [field, value] of [["suffix", "The end."], ["best_of", 17]]) {
  const e = await expectError(() => client.completions.create({
    model, prompt: "x", max_tokens: 4, [field]: value,
  }), OpenAI.BadRequestError, 400, `completion ${field}`);
  check(e.param === field, `completion ${field}: the error names ${e.param}`);
}

// logprobs as the client types them
const lpChat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "Tell me a story" }], max_tokens: 12,
  temperature: 0, logprobs: true, top_logprobs: 3,
});
const lpc = lpChat.choices[0].logprobs.content;
check(lpc.length === lpChat.usage.completion_tokens, "chat logprobs: one per token");
check(lpc.map((e) => e.token).join("") === lpChat.choices[0].message.content,
  "chat logprobs: the tokens make the text");
check(lpc.every((e) => e.logprob <= 0 && e.top_logprobs.length === 3 &&
  e.top_logprobs[0].logprob === e.logprob), "chat logprobs: greedy tokens are the most likely");
const lpCompl = await client.completions.create({
  model, prompt: "Once upon a time", max_tokens: 32, temperature: 0, logprobs: 2,
});
const lpk = lpCompl.choices[0].logprobs;
check(lpCompl.choices[0].text === want && lpk.tokens.join("") === want &&
  lpk.token_logprobs.length === 32 && Object.keys(lpk.top_logprobs[0]).length === 2,
  "completion logprobs");

await expectError(() => client.completions.create({ model, prompt: "x", max_tokens: -1 }),
  OpenAI.BadRequestError, 400, "negative max_tokens");
await expectError(() => client.completions.create({ model, prompt: "x", temperature: "hot" }),
  OpenAI.BadRequestError, 400, "string temperature");
await expectError(() => client.chat.completions.create({ model, messages: [] }),
  OpenAI.BadRequestError, 400, "empty messages");
const bad = new OpenAI({ baseURL: url, apiKey: "wrong", maxRetries: 0 });
await expectError(() => bad.models.list(), OpenAI.AuthenticationError, 401, "wrong key");
console.log("openai client: all checks passed");
